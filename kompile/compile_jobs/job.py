"""`kompile-job`: the entry point of a compile Job's pod. Runs the pipeline for its one target,
publishes the Triton layout and result.json to the artifact store, and writes a compact result to
the termination message.

Exit codes drive the Job's podFailurePolicy (the one retry policy, see operator/jobs.py):
0 the pipeline reached a verdict (validated or not: retrying cannot change it),
2 the input is wrong (manifest, source, export): retrying cannot help, the Job fails at once,
anything else is a crash (store unreachable, out of memory) that a retry may fix.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kompile.api.resource import CompiledModel
from kompile.api.result import compact_result
from kompile.api.spec import Target
from kompile.api.status import TargetStatus
from kompile.artifact_store import StoreError, join, put_tree, write_bytes
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import InputMismatch
from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline
from kompile.compile_jobs.sources import SourceError
from kompile.compile_jobs.trt.cache import StoreSync, sync_for_this_machine

EXIT_VERDICT = 0
EXIT_BAD_INPUT = 2
EXIT_STORE = 3


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"kompile-job: environment variable {name} is required (the operator sets it)")
    return value


def _terminate(text: str) -> None:
    path = Path(os.environ.get("KOMPILE_TERMINATION_LOG", "/dev/termination-log"))
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


def main() -> None:
    doc = json.loads(_env("KOMPILE_COMPILED_MODEL"))
    target = Target.model_validate_json(_env("KOMPILE_TARGET"))
    hw_class = _env("KOMPILE_HARDWARE_CLASS")
    prefix = _env("KOMPILE_ARTIFACT_PREFIX")
    endpoint = os.environ.get("KOMPILE_S3_ENDPOINT")
    work = Path(os.environ.get("KOMPILE_WORK_DIR", "/scratch"))
    # The Job compiles exactly its target: fleet targets are resolved by the operator beforehand.
    doc["spec"]["targets"] = [target.to_wire()]
    doc["spec"].pop("fleet", None)
    cm = CompiledModel.model_validate(doc)
    opts = PipelineOptions(
        base_dir=Path(os.environ.get("KOMPILE_SOURCE_DIR", ".")).resolve(),
        work_dir=work,
        artifact_root=work / "out",
        only_targets=[target.name],
        hardware_class=hw_class,
        device=os.environ.get("KOMPILE_DEVICE") or None,
    )
    reporter = LogReporter(lambda m: print(m, flush=True))
    timing = _pull_timing_cache(endpoint)
    try:
        result = run_pipeline(cm, opts, reporter)
    except (SourceError, ExportError, InputMismatch) as err:
        ts = _failed(target, type(err).__name__.replace("Error", "") + "Error", str(err), hw_class)
        _terminate(compact_result(ts, None, None))
        print(f"kompile-job: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    _push_timing_cache(timing)
    status = result.status.targets[0]
    version = result.built[0].params.get("backend_version") if result.built else None
    if result.built:
        built = result.built[0]
        # The store holds the Triton repository root at the content address the operator expects.
        status.artifact = status.artifact.model_copy(update={"uri": prefix}) if status.artifact else None
        (built.repo_dir / "result.json").write_text(
            json.dumps(
                {**json.loads((built.repo_dir / "result.json").read_text()), "target": status.to_wire()},
                indent=2,
            )
        )
        try:
            put_tree(built.repo_dir, prefix, endpoint)
        except StoreError as err:
            print(f"kompile-job: {err}", file=sys.stderr)
            raise SystemExit(EXIT_STORE) from None
    else:
        try:
            write_bytes(
                join(prefix, "result.json"), json.dumps({"target": status.to_wire()}).encode(), endpoint
            )
        except StoreError as err:
            print(f"kompile-job: {err}", file=sys.stderr)
    _terminate(compact_result(status, result.status.source_digest, version))
    raise SystemExit(EXIT_VERDICT)


if __name__ == "__main__":
    main()
