"""`kompile-job`: the entry point of a compile Job's pod. Runs the pipeline for its one target,
publishes the Triton layout, the saved run results and result.json to the artifact store, and
writes a compact result to the termination message.

What the operator sets, the exit codes and result.json are typed in kompile.api.job_contract.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from kompile.api.cache import progress_uri
from kompile.api.job_contract import (
    RESULT_FILE,
    ExitCode,
    JobContractError,
    JobEnv,
    JobProgress,
    JobResult,
    JobSpec,
    compact_result,
)
from kompile.api.resource import CompiledModel
from kompile.api.spec import Target
from kompile.api.status import TargetStatus, now_rfc3339
from kompile.artifact_store import StoreDenied, StoreError, join, own_keys_hint, put_tree, write_bytes
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import InputMismatch
from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline
from kompile.compile_jobs.progress import StoreProgress
from kompile.compile_jobs.residency import MemoryLimitError
from kompile.compile_jobs.sources import SourceError
from kompile.compile_jobs.trt.cache import StoreSync, sync_for_this_machine


class Stopped(BaseException):
    """SIGTERM reached the Job's process: its deadline passed, or its pod is being deleted or evicted.
    kompile-job is PID 1 in its container, which ignores SIGTERM unless it handles it, so the kubelet's
    SIGKILL used to end it after the grace period with nothing kept. A BaseException, so that no
    handler of compile errors takes it: the `finally` blocks run (the tvm backend merges and pushes
    what its tuning measured) and the process exits within the grace period."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def _terminate(text: str) -> None:
    path = Path(os.environ.get(JobEnv.TERMINATION_LOG, "/dev/termination-log"))
    try:
        path.write_text(text)
    except OSError as err:  # outside a pod there may be no termination log: say so, do not fail
        print(f"kompile-job: cannot write termination message to {path}: {err}", file=sys.stderr)


def _failed(target: Target, reason: str, message: str, hw_class: str) -> TargetStatus:
    return TargetStatus(
        name=target.name,
        backend=target.backend,
        precision=target.precision,
        phase="Failed",
        reason=reason,
        message=message[-2000:],
        hardware_class=hw_class,
    )


def _store_writable(uri: str, endpoint: str | None, target: Target, hw_class: str) -> None:
    """The progress note written once before anything else: keys the store refuses (the operator
    checked they read; they may not write) would otherwise fail the upload after the whole compile.
    Refused: Failed, StoreRefused, exit 2 (not retried). An outage: the upload retries at the end."""
    now = now_rfc3339()
    try:
        write_bytes(
            uri, JobProgress(line="[pipeline] starting", at=now, started=now).dumps().encode(), endpoint
        )
    except StoreDenied as err:
        _refused(err, target, hw_class)
    except StoreError:
        pass


# A token that expired during the compile: a new pod reads the Secret again and may hold a fresh one.
RENEWABLE_CODES = frozenset({"ExpiredToken", "TokenRefreshRequired"})


def _refused(err: StoreDenied, target: Target, hw_class: str) -> NoReturn:
    """The store said no to this Job's keys: a retried pod would get the same no (after compiling
    again), so the target fails at once, StoreRefused, saying what to check; unless the token expired."""
    message = f"{err}: {own_keys_hint(err.code)}"
    print(f"kompile-job: {message}", file=sys.stderr)
    if err.code in RENEWABLE_CODES:
        raise SystemExit(ExitCode.STORE)
    _terminate(compact_result(_failed(target, "StoreRefused", message, hw_class), None, None))
    raise SystemExit(ExitCode.BAD_INPUT)


def _pull_timing_cache(endpoint: str | None) -> StoreSync | None:
    """The class's TensorRT timing cache from the store (GPU Jobs only); a cache is only a speed-up,
    so a store error is reported and the build goes on without it."""
    try:
        sync = sync_for_this_machine(endpoint)
        if sync is not None:
            found = sync.pull()
            print(f"kompile-job: timing cache {sync.remote}: {'pulled' if found else 'none yet'}", flush=True)
        return sync
    except StoreError as err:
        print(f"kompile-job: timing cache not pulled: {err}", file=sys.stderr)
        return None


def _push_timing_cache(sync: StoreSync | None) -> None:
    if sync is None:
        return
    try:
        if sync.push():
            print(f"kompile-job: timing cache {sync.remote}: pushed", flush=True)
    except (StoreError, OSError) as err:
        print(f"kompile-job: timing cache not pushed: {err}", file=sys.stderr)


@contextmanager
def _scratch_cleared(work: Path) -> Iterator[None]:
    """Remove what the Job wrote under its scratch folder when it exits. The folder is the pod's
    emptyDir and its HOME and TMPDIR (exports, builds, compiler caches: hundreds of MB), and a
    finished pod keeps it on the node's disk until the Job's TTL deletes the pod; everything worth
    keeping is in the artifact store by then. What was there before is not the Job's and stays, as
    does the termination message (in the scratch folder outside a pod)."""
    before = {p.name for p in work.iterdir()} if work.is_dir() else set()
    try:
        yield
    finally:
        keep = Path(os.environ.get(JobEnv.TERMINATION_LOG, "/dev/termination-log")).resolve()
        for path in work.iterdir() if work.is_dir() else ():
            if path.name in before or path.resolve() == keep:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    work = Path(os.environ.get(JobEnv.WORK_DIR, "/scratch"))
    try:
        with _scratch_cleared(work):
            _main()
    except Stopped as stop:
        print(
            f"kompile-job: stopped by {stop} (the Job's deadline passed, or its pod is being deleted): "
            "what a build had measured (a tvm tuning) was shared; nothing is published (result.json "
            "goes last, so a stopped upload is never read as a result)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(ExitCode.STOPPED) from None


def _main() -> None:
    try:
        job = JobSpec.from_env(os.environ)
    except JobContractError as err:
        raise SystemExit(f"kompile-job: {err}") from None
    target, hw_class, prefix, endpoint = job.target, job.hardware_class, job.artifact_prefix, job.s3_endpoint
    work = Path(job.work_dir)
    doc = dict(job.compiled_model)
    # The Job compiles exactly its target: fleet targets are resolved by the operator beforehand.
    doc["spec"] = {**doc["spec"], "targets": [target.to_wire()]}
    doc["spec"].pop("fleet", None)
    cm = CompiledModel.model_validate(doc)
    opts = PipelineOptions(
        base_dir=Path(os.environ.get(JobEnv.SOURCE_DIR, ".")).resolve(),
        work_dir=work,
        artifact_root=work / "out",
        only_targets=[target.name],
        hardware_class=hw_class,
        device=job.device,
        arch=job.arch,
        deadline=job.deadline,
    )
    _store_writable(progress_uri(prefix), endpoint, target, hw_class)
    # Each line to the pod's log; the latest also to the store, for the target's status.
    progress = StoreProgress(LogReporter(lambda m: print(m, flush=True)), progress_uri(prefix), endpoint)
    try:
        _run(cm, opts, progress, target, hw_class, prefix, endpoint)
    finally:
        progress.close()


def _run(
    cm: CompiledModel,
    opts: PipelineOptions,
    reporter: StoreProgress,
    target: Target,
    hw_class: str,
    prefix: str,
    endpoint: str | None,
) -> None:
    """Run the pipeline and publish what it built; exits with the code the podFailurePolicy reads."""
    timing = _pull_timing_cache(endpoint)
    try:
        result = run_pipeline(cm, opts, reporter)
    except (SourceError, ExportError, InputMismatch, MemoryLimitError) as err:
        ts = _failed(target, type(err).__name__.replace("Error", "") + "Error", str(err), hw_class)
        _terminate(compact_result(ts, None, None))
        print(f"kompile-job: {err}", file=sys.stderr)
        raise SystemExit(ExitCode.BAD_INPUT) from None
    _push_timing_cache(timing)
    status = result.status.targets[0]
    version = result.built[0].params.get("backend_version") if result.built else None
    if result.built:
        reporter.stage(None, f"publishing to {prefix}")
        try:
            _publish(result.built[0].repo_dir, status, prefix, endpoint)
        except StoreDenied as err:
            _refused(err, target, hw_class)
        except StoreError as err:
            print(f"kompile-job: {err}", file=sys.stderr)
            raise SystemExit(ExitCode.STORE) from None
    else:
        try:  # the verdict also travels in the termination message: a store error is reported only
            write_bytes(join(prefix, RESULT_FILE), JobResult(target=status).dumps().encode(), endpoint)
        except StoreError as err:
            print(f"kompile-job: {err}", file=sys.stderr)
    _terminate(compact_result(status, result.status.source_digest, version))
    raise SystemExit(ExitCode.VERDICT)


def _publish(repo_dir: Path, status: TargetStatus, prefix: str, endpoint: str | None) -> None:
    """The Triton repository root at the content address the operator expects, its artifact URI
    pointing there."""
    status.artifact = status.artifact.model_copy(update={"uri": prefix}) if status.artifact else None
    path = repo_dir / RESULT_FILE
    result = JobResult.loads(path.read_text())
    path.write_text(result.model_copy(update={"target": status}).dumps())
    put_tree(repo_dir, prefix, endpoint)


if __name__ == "__main__":
    main()
