"""Real S3 and MLflow servers on loopback for the tests: no mocks, nothing reachable from outside.

``S3Server`` runs versitygw (the Versity S3 Gateway, built from the Go module proxy by
``scripts/build-s3-server.sh``) with its ``posix`` backend: each bucket is a directory under a
temporary folder, each object a file. ``MlflowServer`` runs ``python -m mlflow server`` from the
current interpreter's environment with a SQLite backend store and its artifacts proxied into a bucket
of an ``S3Server``. Both are context managers, and keep their log files after ``stop()``.

The processes are ``devtools.processes.ManagedProcess``, the same as the dev cluster's.

``python -m tests.support.servers`` starts both, prints their settings and waits for Ctrl-C (handy
for looking at the MLflow UI by hand).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from devtools.processes import ManagedProcess, ProcessError, start_on_free_port

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
S3_BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-s3-server.sh"
S3_BIN_ENV = "KOMPILE_S3_BIN"  # a directory holding a versitygw binary; skips the build script
MLFLOW_PYTHON_ENV = "KOMPILE_MLFLOW_PYTHON"  # an interpreter with mlflow, when this one has none
REGION = "us-east-1"
STOP_GRACE = 15.0  # seconds between SIGTERM and SIGKILL


class ServerError(ProcessError):
    """A server binary is missing, failed to start, or did not answer in time."""


def find_s3_bin_dir() -> Path:
    """Where versitygw is: $KOMPILE_S3_BIN, else the build script's output (a no-op once built)."""
    override = os.environ.get(S3_BIN_ENV)
    if override:
        bin_dir = Path(override).expanduser()
        if not (bin_dir / "versitygw").is_file():
            raise ServerError(f"{S3_BIN_ENV}={override} holds no versitygw binary")
        return bin_dir
    if not S3_BUILD_SCRIPT.is_file():
        raise ServerError(f"{S3_BUILD_SCRIPT} not found: set {S3_BIN_ENV} to a directory holding versitygw")
    # stderr passes through so a cold build (several minutes) shows its progress lines.
    result = subprocess.run(["bash", str(S3_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ServerError(f"{S3_BUILD_SCRIPT} failed with exit status {result.returncode}")
    return Path(lines[-1])


def find_mlflow_python() -> str:
    """An interpreter that can run `-m mlflow`: $KOMPILE_MLFLOW_PYTHON, else this one."""
    override = os.environ.get(MLFLOW_PYTHON_ENV)
    if override:
        return override
    if importlib.util.find_spec("mlflow") is None:
        raise ServerError(f"mlflow is not installed for {sys.executable}: set {MLFLOW_PYTHON_ENV}")
    return sys.executable


class S3Server:
    """versitygw serving buckets from a folder, on a free loopback port, with a random key pair."""

    def __init__(self, work_dir: Path | None = None, *, bin_dir: Path | None = None, timeout: float = 30.0):
        self._own_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="kompile-s3-")) if work_dir is None else work_dir
        self.data_dir = self.work_dir / "root"
        self.log_path = self.work_dir / "versitygw.log"
        self.bin_dir = bin_dir
        self.timeout = timeout
        # Fresh per server: a test can look for the secret in error messages and be sure a hit is a leak.
        self.access_key = f"kompile{secrets.token_hex(6)}"
        self.secret_key = secrets.token_urlsafe(30)
        self.region = REGION
        self.port = 0
        self.startup_seconds = 0.0
        self._proc: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        began = time.monotonic()
        versitygw = (self.bin_dir or find_s3_bin_dir()) / "versitygw"
        if not versitygw.is_file():
            raise ServerError(f"{versitygw} does not exist: run {S3_BUILD_SCRIPT}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A minimal environment: stray VGW_* or ROOT_* variables of the caller must not reconfigure it.
        # The keys go in the environment, not argv, so they do not show in process listings.
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(self.work_dir)),
            "ROOT_ACCESS_KEY_ID": self.access_key,
            "ROOT_SECRET_ACCESS_KEY": self.secret_key,
        }

        def argv(port: int) -> list[str]:
            return [
                str(versitygw),
                "--port",
                f"127.0.0.1:{port}",
                "--region",
                self.region,
                "--health",
                "/health",
                "posix",
                str(self.data_dir),
            ]

        self._proc, self.port = start_on_free_port(
            "versitygw",
            argv,
            self.log_path,
            "/health",
            self.timeout,
            env=env,
            cwd=self.work_dir,
            grace=STOP_GRACE,
            error=ServerError,
        )
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._own_dir:  # keep the log, drop the objects
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """What an S3 client needs to reach this server: boto3, kompile.artifact_store and MLflow."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "KOMPILE_S3_ENDPOINT": self.endpoint,
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
        }

    def client(self) -> Any:
        """A boto3 S3 client with this server's endpoint and keys given explicitly (not read from env)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self, name: str) -> str:
        """Create the bucket unless this server already has it; returns its s3:// URI."""
        from botocore.exceptions import ClientError

        try:
            self.client().create_bucket(Bucket=name)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        return f"s3://{name}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class MlflowServer:
    """`mlflow server` with a SQLite store; artifacts proxied into s3://<bucket>/mlflow of an S3Server.

    Without an S3Server the artifacts go to a folder beside the database.
    """

    def __init__(
        self,
        s3: S3Server | None = None,
        work_dir: Path | None = None,
        *,
        bucket: str = "mlflow",
        python: str | None = None,
        timeout: float = 240.0,
    ) -> None:
        self.s3 = s3
        self.work_dir = Path(tempfile.mkdtemp(prefix="kompile-mlflow-")) if work_dir is None else work_dir
        self.db_path = self.work_dir / "mlflow.db"
        self.log_path = self.work_dir / "mlflow-server.log"
        self.bucket = bucket
        self.artifacts_destination = (
            f"s3://{bucket}/mlflow" if s3 is not None else (self.work_dir / "artifacts").as_uri()
        )
        self.python = python
        self.timeout = timeout
        self.port = 0
        self.startup_seconds = 0.0
        self._proc: ManagedProcess | None = None

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        began = time.monotonic()
        python = self.python or find_mlflow_python()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop("MLFLOW_TRACKING_URI", None)  # the server is the tracking store, not a client of one
        if self.s3 is not None:
            self.s3.create_bucket(self.bucket)
            env.update(self.s3.env())  # the server itself reads and writes the proxied artifacts
        env.update(
            # The job runner (GenAI evaluation jobs) is a third Python process that slows startup,
            # leaves huey stores in /dev/shm and kept the server from exiting on SIGTERM.
            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
            MLFLOW_DISABLE_TELEMETRY="true",  # nothing outside this machine is reachable anyway
        )

        def argv(port: int) -> list[str]:
            return [
                python,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.db_path}",
                "--artifacts-destination",
                self.artifacts_destination,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ]

        # cwd: anything the server writes relative to it lands in the work dir, not the repository.
        self._proc, self.port = start_on_free_port(
            "mlflow server",
            argv,
            self.log_path,
            "/health",
            self.timeout,
            env=env,
            cwd=self.work_dir,
            grace=STOP_GRACE,
            error=ServerError,
        )
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def env(self) -> dict[str, str]:
        """What an MLflow client needs: the tracking URI and, for s3:// sources, the S3 settings."""
        return {**(self.s3.env() if self.s3 is not None else {}), "MLFLOW_TRACKING_URI": self.tracking_uri}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main() -> None:
    with S3Server() as s3:
        print(f"S3 (versitygw) up in {s3.startup_seconds:.2f}s, data in {s3.data_dir}", flush=True)
        with MlflowServer(s3) as mlflow_server:
            print(f"MLflow up in {mlflow_server.startup_seconds:.1f}s, log {mlflow_server.log_path}")
            for key, value in mlflow_server.env().items():
                print(f"export {key}={value}")
            print("Ctrl-C stops both.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()


if __name__ == "__main__":
    main()
