"""`kompile run`: the pipeline on this machine, with a live display, MLflow and a summary table."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.status import Status
from rich.table import Table

from kompile.api.resource import CompiledModel
from kompile.api.status import CandidateStatus, CompiledModelStatus, LatencyStats, TargetStatus
from kompile.artifact_store import (
    StoreDenied,
    StoreError,
    is_s3,
    join,
    local_path,
    own_keys_hint,
    probe_bucket,
    put_tree,
)
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.hardware import cpu_description
from kompile.compile_jobs.inputs import InputMismatch
from kompile.compile_jobs.pipeline import (
    BuiltTarget,
    LogReporter,
    PipelineOptions,
    PipelineResult,
    Reporter,
    plan_targets,
    run_pipeline,
)
from kompile.compile_jobs.residency import MemoryLimitError
from kompile.compile_jobs.sources import SourceError
from kompile.operator import latest


@dataclass
class LocalRunSettings:
    manifest: Path
    work_dir: Path
    artifacts: Path | None
    tracking_uri: str | None
    register: bool
    targets: list[str] | None
    json_out: bool
    store_flag: str = "spec.registry.artifactStore"
    """What named the artifact store, for messages: the field, or --artifacts over it."""


def with_artifact_store(cm: CompiledModel, store: str) -> CompiledModel:
    """The model with spec.registry.artifactStore set to `store` (an s3:// root given on the
    command line): published, probed and pointed at as one the manifest names."""
    from kompile.api.spec_rollout import Registry

    registry = (cm.spec.registry or Registry()).model_copy(update={"artifact_store": store})
    return cm.model_copy(update={"spec": cm.spec.model_copy(update={"registry": registry})})


class RichReporter:
    """A spinner with the current stage, and one line per finished target."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status = console.status("starting")
        self.status.start()

    def stage(self, target: str | None, message: str) -> None:
        self.status.update(f"[bold]{target or 'pipeline'}[/]: {message}")
        self.console.log(f"[dim]{target or 'pipeline'}[/] {message}", highlight=False)

    def finished(self, target: TargetStatus) -> None:
        color = {"Succeeded": "green", "Failed": "red"}.get(target.phase, "yellow")
        extra = f" ({target.reason}: {target.message})" if target.message else ""
        self.console.log(f"[{color}]{target.phase}[/] {target.name}{extra}", highlight=False)

    def stop(self) -> None:
        self.status.stop()


def _unknown_targets(cm: CompiledModel, wanted: list[str] | None) -> str | None:
    """--target names the manifest does not have, said before any work (fleet names included)."""
    names = [t.name for t in plan_targets(cm)]
    unknown = [w for w in wanted or [] if w not in names]
    if not unknown:
        return None
    return (
        f"--target {', '.join(unknown)}: {cm.metadata.name} has no such target; its targets: "
        f"{', '.join(names)}"
    )


def _unwritable(folder: Path, flag: str, source: str | None = None) -> str | None:
    """A folder the run cannot create or write into, named before any work (not after a compile).
    `source` says where the folder came from when not from `flag` itself (a manifest field, a
    default). What is made to find out is removed again: a run refused later leaves nothing behind."""
    where = source or flag
    target = folder.absolute()
    made = None if target.exists() else target
    while made is not None and not made.parent.exists():
        made = made.parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create {folder} ({where}): {err.strerror}; give {flag} a folder you can write"
    writable = os.access(target, os.W_OK | os.X_OK)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    if not writable:
        return f"cannot write into {folder} ({where}): permission denied; give {flag} a folder you can write"
    return None


def _artifact_root(cm: CompiledModel, s: LocalRunSettings) -> Path:
    if s.artifacts is not None:
        return s.artifacts.resolve()
    store = cm.spec.registry.artifact_store if cm.spec.registry else None
    if store and not store.startswith("s3://"):
        path = local_path(store)
        return path if path.is_absolute() else (s.manifest.parent / path).resolve()
    return (s.work_dir / "artifacts").resolve()


def _artifact_root_source(cm: CompiledModel, s: LocalRunSettings) -> str | None:
    """Where the artifact folder was named, for an error about it: the flag, the manifest, or the
    default under the work dir (moved by either flag)."""
    if s.artifacts is not None:
        return None
    store = cm.spec.registry.artifact_store if cm.spec.registry else None
    if store and not store.startswith("s3://"):
        return "spec.registry.artifactStore"
    return "the default under --work-dir"


def _tracking_uri(cm: CompiledModel, s: LocalRunSettings) -> str:
    if s.tracking_uri:
        return s.tracking_uri
    if cm.spec.registry and cm.spec.registry.tracking_uri:
        return cm.spec.registry.tracking_uri
    return f"sqlite:///{(s.work_dir / 'mlflow.db').resolve()}"


def _publish_to_s3(cm: CompiledModel, built: list[BuiltTarget], reporter: Reporter) -> None:
    """With an s3:// artifact store, upload each artifact's Triton layout to a path named by its
    digest (so a different artifact never overwrites it) and point its status there."""
    store = cm.spec.registry.artifact_store if cm.spec.registry else None
    if not store or not is_s3(store):
        return
    endpoint = cm.spec.registry.s3_endpoint if cm.spec.registry else None
    for b in built:
        if b.status.artifact is None:
            continue
        uri = join(store, cm.metadata.name, b.repo_dir.name)
        reporter.stage(b.target.name, f"uploading to {uri}")
        put_tree(b.repo_dir, uri, endpoint)
        b.status.artifact = b.status.artifact.model_copy(update={"uri": uri})


def _point_latest(
    cm: CompiledModel, status: CompiledModelStatus, artifact_root: Path, reporter: Reporter
) -> None:
    """The same `latest` pointer per class as the operator writes, in this run's store (the s3://
    store, else the local artifact folder), so devices fetch from either the same way."""
    registry = cm.spec.registry
    store = registry.artifact_store if registry else None
    root = store if store and is_s3(store) else artifact_root.as_uri()
    endpoint = registry.s3_endpoint if registry else None
    if latest.due(status.targets, status.latest):
        reporter.stage(None, f"pointing {join(root, 'latest')} at each class's winner")
    latest.write_due(
        status,
        root,
        namespace=cm.metadata.namespace or "default",
        compiled_model=cm.metadata.name,
        model_name=(registry.model_name if registry else None) or cm.metadata.name,
        generation=cm.metadata.generation,
        put=lambda uri, doc: latest.write_pointer(uri, doc, endpoint),
    )


def execute(cm: CompiledModel, s: LocalRunSettings, console: Console) -> tuple[int, str | None]:
    """Run and report. Returns (exit code, error message for bad input or None)."""
    problem = _unknown_targets(cm, s.targets) or _unwritable(s.work_dir, "--work-dir")
    artifact_root = _artifact_root(cm, s)
    problem = (
        problem
        or _unwritable(artifact_root, "--artifacts", _artifact_root_source(cm, s))
        or _unusable_store(cm, s.store_flag)
    )
    if problem:
        return 2, problem
    s.work_dir.mkdir(parents=True, exist_ok=True)
    problem = _unusable_registry(cm, s)  # once the work dir, the default database's folder, is there
    if problem:
        return 2, problem
    lock = _hold(s.work_dir)
    if isinstance(lock, str):
        return 2, lock
    with lock:
        return _run(cm, s, console, artifact_root)


def _unusable_store(cm: CompiledModel, flag: str) -> str | None:
    """An s3:// artifact store whose bucket is not there or that refuses this shell's keys, found
    before the compile (its upload comes after it). An outage is left to the upload's retries."""
    registry = cm.spec.registry
    store = registry.artifact_store if registry else None
    if not registry or not store or not is_s3(store):
        return None
    try:
        probe_bucket(store, registry.s3_endpoint)
    except StoreDenied as err:
        return f"{flag}: {err}: {own_keys_hint(err.code)}"
    except StoreError:
        pass
    return None


def _unusable_registry(cm: CompiledModel, s: LocalRunSettings) -> str | None:
    """A tracking URI MLflow cannot record to, said before the compile rather than after it."""
    if not s.register:
        return None
    from kompile.registry import unusable_tracking

    uri = _tracking_uri(cm, s)
    why = unusable_tracking(uri)
    if why is None:
        return None
    return (
        f"{why}: point --tracking-uri (MLFLOW_TRACKING_URI, spec.registry.trackingUri) at one that "
        "works (a server: start it), or pass --no-register to compile without recording in MLflow"
    )


def _hold(work_dir: Path) -> IO[str] | str:
    """The work dir's lock, held for the run; a message when another run holds it. Two runs in one
    work dir share its build folders, export and reference file (fleet target names repeat across
    models), and would build into, and remove, each other's files."""
    handle = (work_dir / ".lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return (
            f"another kompile run ({holder}) is using {work_dir}: wait for it to finish, or give this "
            "run its own --work-dir"
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


@contextlib.contextmanager
def _inductor_cache_in(folder: Path) -> Iterator[None]:
    """Inductor's cache (kernels and .so files of every graph it compiled, hundreds of MB) under
    the run's work dir, beside its other caches: its default, /tmp/torchinductor_<user>, grows
    where nothing removes it and no one looks. A TORCHINDUCTOR_CACHE_DIR the user set is kept."""
    key = "TORCHINDUCTOR_CACHE_DIR"
    if os.environ.get(key):
        yield
        return
    os.environ[key] = str(folder)
    try:
        yield
    finally:
        os.environ.pop(key, None)


def _run(
    cm: CompiledModel, s: LocalRunSettings, console: Console, artifact_root: Path
) -> tuple[int, str | None]:
    opts = PipelineOptions(
        base_dir=s.manifest.parent.resolve(),
        work_dir=s.work_dir.resolve(),
        artifact_root=artifact_root,
        only_targets=s.targets,
    )
    live = console.is_terminal and not s.json_out
    reporter: Reporter = (
        RichReporter(console)
        if live
        else LogReporter(lambda m: console.print(m, markup=False, highlight=False))
    )
    try:
        with _inductor_cache_in(opts.work_dir / "cache" / "inductor"):
            result = run_pipeline(cm, opts, reporter)
        _publish_to_s3(cm, result.built, reporter)
        _point_latest(cm, result.status, opts.artifact_root, reporter)
        unregistered = _register(cm, s, result, reporter) if s.register else None
    except (SourceError, ExportError, InputMismatch, MemoryLimitError) as err:
        return 2, str(err)
    except StoreError as err:
        return 1, str(err)
    finally:
        if isinstance(reporter, RichReporter):
            reporter.stop()
    status = result.status
    if s.json_out:
        sys.stdout.write(json.dumps(status.to_wire(), indent=2) + "\n")
    else:
        console.print(summary_table(cm, status))
        if status.registry:
            console.print(
                f"MLflow: model [bold]{status.registry.model_name}[/], run {status.registry.run_id} "
                f"({status.registry.tracking_uri}); open it with `make mlflow-ui`",
                highlight=False,
            )
    if unregistered:
        return 1, unregistered
    servable = [t for t in status.targets if t.phase not in ("Skipped", "Exported")]
    if not servable and any(t.phase == "Exported" for t in status.targets):
        return 0, None
    if not servable:
        return 1, "no target can run on this machine: " + "; ".join(
            f"{t.name}: {t.message}" for t in status.targets
        )
    ok = all(t.phase == "Succeeded" for t in servable)
    return (0 if ok else 1), None


def _register(
    cm: CompiledModel, s: LocalRunSettings, result: PipelineResult, reporter: Reporter
) -> str | None:
    """Record the run in MLflow; what went wrong (the run and its artifacts stand) or None."""
    if not any(t.artifact for t in result.status.targets):
        return None
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    from kompile.registry import TargetRecord, hide_userinfo, record, without_userinfo

    reporter.stage(None, "registering in MLflow")
    records = [TargetRecord(b.status, b.repo_dir / cm.metadata.name, b.params) for b in result.built]
    uri = _tracking_uri(cm, s)
    artifacts = (s.work_dir / "mlartifacts").resolve().as_uri() if uri.startswith("sqlite:") else None
    try:
        result.status.registry = record(cm, result.status, records, uri, result.lineage, artifacts)
    except (MlflowException, SQLAlchemyError, OSError) as err:
        # The compile's work is not lost with it: the status is shown and the artifacts stay.
        kept = ", ".join(str(b.repo_dir) for b in result.built)
        first = hide_userinfo((str(err).strip().splitlines() or [""])[0])[:300]
        return (
            f"registering in MLflow at {without_userinfo(uri)} failed ({type(err).__name__}: {first}); "
            f"the validated artifacts are kept in {kept}: run again once MLflow records, or with "
            "--no-register"
        )
    return None


def summary_table(cm: CompiledModel, status: CompiledModelStatus) -> Table:
    eager = status.baselines[0].latency if status.baselines else []
    title = f"{cm.metadata.name}: {status.targets_ready} targets validated"
    if eager:
        title += f" (eager p50 {_p50(eager)} ms)"
    table = Table(title=title)
    notes = [f"CPU: {cpu_description()}, {cm.spec.benchmark.threads or available_cores()} threads"]
    for col in (
        "target",
        "backend",
        "precision",
        "p50 ms",
        "speedup",
        "max abs err",
        "cosine",
        "verdict",
        "MLflow",
    ):
        table.add_column(
            col, justify="right" if col in ("p50 ms", "speedup", "max abs err", "cosine") else "left"
        )
    for t in status.targets:
        v = t.validation
        err, cos = v.worst_float_figures() if v else (None, None)
        verdict = {
            "Succeeded": "[green]validated[/]",
            "Skipped": "[yellow]skipped[/]",
            "Exported": "[cyan]exported, not validated[/]",
        }.get(t.phase, f"[red]{t.reason or 'failed'}[/]")
        table.add_row(
            t.name,
            t.backend,
            t.precision,
            _p50(t.latency),
            _speedup(t.speedup, t.speedup_stable),
            f"{err:.2e}" if err is not None else "-",
            f"{cos:.5f}" if cos is not None else "-",
            verdict,
            t.registered_version or "-",
        )
        for c in t.candidates:
            table.add_row(*_candidate_row(c))
    notes += [
        f"{t.name}: {t.selection.message}" for t in status.targets if t.selection and t.selection.message
    ]
    notes += _accuracy_notes(status)
    notes += _detection_notes(status)
    notes += [f"{t.name} did not try {n}" for t in status.targets for n in t.not_offered]
    if unsettled := _unsettled(status):
        notes.append("~ never settled (read those figures and speedups as unreliable):")
        notes += [f"  {name}: {why}" for name, why in unsettled]
    table.caption = "\n".join(notes)
    table.caption_justify = "left"  # notes are sentences, some wrapped: read from the left edge
    return table


def _detection_notes(status: CompiledModelStatus) -> list[str]:
    """spec.validation.task detection, per target: each candidate's detection agreement."""
    notes = []
    for t in status.targets:
        rows = [(c.name, c.detection_agreement) for c in t.candidates if c.detection_agreement is not None]
        if not rows and t.validation and (agreement := t.validation.detection_agreement()) is not None:
            rows = [(t.backend, agreement)]
        if rows:
            notes.append(f"{t.name} detection agreement: " + ", ".join(f"{n} {a:.3f}" for n, a in rows))
        found = [o.detections for o in (t.validation.outputs if t.validation else []) if o.detections]
        if found and not any(d.required for d in found):
            # Generated inputs (noise) show a detector nothing: an agreement of 1.0 there judged nothing.
            notes.append(
                f"{t.name}: the source found no confident detection on the reference inputs, so the "
                "detection check judged none; give real images as spec.validation.dataset"
            )
    return notes


def _accuracy_notes(status: CompiledModelStatus) -> list[str]:
    """Task accuracy on labelled data, per target: the source's, then each candidate's drop."""
    notes = []
    for t in status.targets:
        acc = t.validation.task_accuracy if t.validation else None
        rows = [(c.name, c.accuracy, c.accuracy_drop) for c in t.candidates if c.accuracy is not None]
        if acc is None and not rows:
            continue
        if acc is not None and not rows:
            rows = [(t.backend, acc.accuracy, acc.drop)]
        source = (
            f" (source {acc.reference:.2f}% on {acc.labelled} labels, read from output {acc.output!r})"
            if acc
            else ""
        )
        parts = ", ".join(
            f"{n} {a:.2f}% (drop {d:.2f})" for n, a, d in rows if a is not None and d is not None
        )
        notes.append(f"{t.name} accuracy{source}: {parts}")
    return notes


def _p50(latency: list[LatencyStats]) -> str:
    if not latency:
        return "-"
    first = latency[0]
    return f"{'~' if first.stable is False else ''}{first.p50_ms:.2f}"


def _speedup(speedup: float | None, stable: bool | None) -> str:
    if not speedup:
        return "-"
    return f"~{speedup:.2f}x" if stable is False else f"{speedup:.2f}x"


def _unsettled(status: CompiledModelStatus) -> list[tuple[str, str]]:
    """Each first-batch figure that never settled, by runtime name, with why (the table's `~`)."""
    figures = [(b.name, lat) for b in status.baselines for lat in b.latency[:1]]
    figures += [(t.name, lat) for t in status.targets for lat in t.latency[:1]]
    figures += [(c.name, lat) for t in status.targets for c in t.candidates for lat in c.latency[:1]]
    return [(name, f.unsettled or "no reason recorded") for name, f in figures if f.stable is False]


def _candidate_row(c: CandidateStatus) -> list[str]:
    """A candidate under its target: indented, and marked when it won."""
    if c.selected:
        verdict = "[bold green]selected[/]"
    elif c.phase == "Succeeded":
        verdict = "validated"
    else:
        verdict = f"[dim]{c.reason or c.phase}[/]"
    return [
        f"  └ {c.name}",
        c.backend,
        c.precision,
        _p50(c.latency),
        _speedup(c.speedup, c.speedup_stable),
        f"{c.max_abs_error:.2e}" if c.max_abs_error is not None else "-",
        f"{c.min_cosine:.5f}" if c.min_cosine is not None else "-",
        verdict,
        "",
    ]
