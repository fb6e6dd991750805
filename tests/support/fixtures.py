"""pytest fixtures for the real servers of tests/support/servers.py.

Registered for the whole suite by one line in the root tests/conftest.py:

    pytest_plugins = ["tests.support.fixtures"]

(or ``-p tests.support.fixtures`` on the pytest command line). Each server starts on first use and
once per session; a session that uses neither starts neither.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.support.servers import MlflowServer, S3Server


def report_line(config: pytest.Config, line: str) -> None:
    """A line on the terminal even under output capture (a session fixture has no test to show it).

    A pytest-xdist worker's terminal reporter writes to no terminal (its stdout is the channel to
    the controller); its stderr is the terminal's, so the line goes there, named for the worker."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if capture is None:
        return
    with capture.global_and_fixture_disabled():
        if worker:
            sys.stderr.write(f"\n[{worker}] {line.lstrip()}\n")
            sys.stderr.flush()
        elif reporter is not None:
            reporter.write_line(line)


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A started versitygw with a fresh key pair; `.create_bucket(name)`, `.env()`, `.client()`."""
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()  # on failure it raises with the log's tail
    took = f"{server.startup_seconds:.2f}s"
    report_line(request.config, f"\nS3 server (versitygw) at {server.endpoint} up in {took}")
    try:
        yield server
    finally:
        server.stop()
        if request.session.testsfailed:
            report_line(request.config, f"\nS3 server log kept in {server.log_path}")


@pytest.fixture(scope="session")
def mlflow_server(
    request: pytest.FixtureRequest, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    """A started `mlflow server` (SQLite store) whose artifacts land in s3://mlflow/mlflow of s3_server."""
    server = MlflowServer(s3_server, tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    report_line(
        request.config, f"\nMLflow server at {server.tracking_uri} up in {server.startup_seconds:.1f}s"
    )
    try:
        yield server
    finally:
        server.stop()
        if request.session.testsfailed:
            report_line(request.config, f"\nMLflow server log kept in {server.log_path}")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """s3_server's settings in os.environ for this test, where kompile.artifact_store reads them.

    boto3's default session caches the credentials it first resolves from the environment, so it is
    dropped here (and restored afterwards): the store's clients must see this test's variables.
    """
    import boto3

    env = s3_server.env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    return env
