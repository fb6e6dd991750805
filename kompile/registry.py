"""MLflow lineage: a parent run per pipeline execution, a child run per target, a registered model
with a version per target, and an alias per target that only a validated version ever gets.

Aliases, not stages: stages are deprecated in MLflow. Shared by `kompile run` and the operator, so
it depends on the API types only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kompile.api.resource import CompiledModel
from kompile.api.status import (
    CandidateStatus,
    CompiledModelStatus,
    LatencyStats,
    RegistryStatus,
    TargetStatus,
)

DEFAULT_TRACKING_URI = "sqlite:///.kompile/mlflow.db"
# The namespace whose CompiledModel created a registered model: MLflow names are global, so this
# tag is what keeps another namespace from adding versions or moving aliases on it.
OWNER_TAG = "kompile.namespace"


@dataclass(frozen=True)
class TargetRecord:
    """What the registry needs of one target beyond its status."""

    status: TargetStatus
    model_dir: Path | None
    """Local folder of the artifact's Triton layout, logged to the child run."""
    params: Mapping[str, str]


def alias_for(target: str) -> str:
    # MLflow reserves aliases of the form v<digits> (they name versions).
    return f"target-{target}" if re.fullmatch(r"v\d+", target) else target


def _metrics(t: TargetStatus) -> dict[str, float]:
    out: dict[str, float] = {}
    if t.latency:
        first = t.latency[0]
        out |= {
            "p50_ms": first.p50_ms,
            "p90_ms": first.p90_ms,
            "p99_ms": first.p99_ms,
            "throughput": first.throughput,
        }
        out |= _figures(t.latency)
    if t.speedup is not None:
        out["speedup"] = t.speedup
    if t.validation and t.validation.outputs:
        out["max_abs_error"] = max(o.max_abs_error for o in t.validation.outputs)
        out["min_cosine"] = min(o.cosine for o in t.validation.outputs)
    if t.validation and (agreement := t.validation.detection_agreement()) is not None:
        out["detection_agreement"] = agreement
    if t.validation and t.validation.task_accuracy:
        acc = t.validation.task_accuracy
        out |= {"accuracy": acc.accuracy, "accuracy_drop": acc.drop, "source_accuracy": acc.reference}
    return out


def _figures(latency: list[LatencyStats]) -> dict[str, float]:
    """Per batch size: p50, throughput, spread and whether the figure settled (1) or not (0)."""
    out: dict[str, float] = {}
    for lat in latency:
        b = lat.batch_size
        out |= {f"p50_ms_b{b}": lat.p50_ms, f"throughput_b{b}": lat.throughput}
        if lat.spread is not None:
            out[f"spread_b{b}"] = lat.spread
        if lat.stable is not None:
            out[f"stable_b{b}"] = float(lat.stable)
    return out


def _version_tags(cm: CompiledModel, t: TargetStatus, digest: str | None) -> dict[str, str]:
    verdict = "passed" if t.validation and t.validation.passed else "failed"
    if t.phase == "Exported":
        verdict = "not-validated"  # an export-only artifact: Core ML on a class without its runtime
    tags = {
        "kompile.target": t.name,
        "kompile.backend": t.backend,
        "kompile.precision": t.precision,
        "kompile.hardware_class": t.hardware_class or "",
        "kompile.verdict": verdict,
        "kompile.speedup": f"{t.speedup:.3f}" if t.speedup is not None else "",
        # An unsettled figure makes the speedup unreliable: say so where the UI shows it.
        "kompile.speedup_stable": "" if t.speedup_stable is None else str(t.speedup_stable).lower(),
        "kompile.source_uri": cm.spec.source.uri,
        "kompile.source_digest": digest or "",
        "kompile.artifact_digest": t.artifact.digest if t.artifact else "",
    }
    return {k: v for k, v in tags.items() if v}


SQLITE_HEADER = b"SQLite format 3\x00"


def without_userinfo(uri: str) -> str:
    """The URI without a user:password@ part, to show in a message."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri  # as given: geturl() would drop the empty host of sqlite:////abs/path
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def hide_userinfo(text: str) -> str:
    """`text` with the user:password@ of every URL in it removed: MLflow's errors quote the
    request URL whole, keys included, and such a message goes to a status, an Event or a terminal."""
    return re.sub(r"(://)[^/@\s]+@", r"\1", text)


def unusable_tracking(uri: str, timeout: float = 10.0) -> str | None:
    """Why MLflow at `uri` cannot record anything, found with one cheap look before a run's work
    (registration comes after the whole compile): an http(s) server nobody answers for, or an
    sqlite path that is a folder or no database. None when it may work; a server that answers,
    even with an error, is left to the registration, which reports what it says."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        bare = without_userinfo(uri)  # keys in the URI are MLflow's to send, not this look's
        try:
            urllib.request.urlopen(f"{bare.rstrip('/')}/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            return None  # it answered
        except (urllib.error.URLError, OSError, ValueError) as err:
            why = getattr(err, "reason", None) or err
            return f"MLflow at {bare} does not answer ({why})"
        return None
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
        if path.is_dir():
            return f"MLflow database {path} ({uri}) is a folder"
        if not path.parent.is_dir():
            return f"MLflow database {path} ({uri}): its folder {path.parent} does not exist"
        if path.is_file() and path.stat().st_size > 0:
            with path.open("rb") as f:
                if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    return f"MLflow database {path} ({uri}) is not an SQLite database"
    return None


def _client(tracking_uri: str) -> Any:
    from mlflow import MlflowClient

    # MLflow's own INFO lines (database migrations) would interleave with our progress display.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # Nor its "View run ... at: <tracking URI>" lines on stdout, which carry any keys in the URI.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return MlflowClient(tracking_uri=tracking_uri)


def source_lineage(client: Any, uri: str) -> dict[str, str]:
    """When the source is itself an MLflow model version, the run and version it came from."""
    from mlflow.exceptions import MlflowException

    out = {"mlflow.source.uri": uri} if uri.startswith(("models:/", "runs:/")) else {}
    match = re.fullmatch(r"models:/([^/@]+)/(\d+)", uri)
    if match:
        try:
            mv = client.get_model_version(match.group(1), match.group(2))
        except MlflowException:
            return out
        out |= {
            "kompile.source_model": match.group(1),
            "kompile.source_version": str(mv.version),
            "kompile.source_run_id": mv.run_id or "",
        }
    elif uri.startswith("runs:/"):
        out["kompile.source_run_id"] = uri.removeprefix("runs:/").split("/")[0]
    return {k: v for k, v in out.items() if v}


def model_name(cm: CompiledModel) -> str:
    """The registered model's name: spec.registry.modelName, else the CompiledModel's name."""
    return (cm.spec.registry.model_name if cm.spec.registry else None) or cm.metadata.name


def check_model_owner(tracking_uri: str, name: str, namespace: str) -> str | None:
    """Why a CompiledModel of `namespace` may not register under `name`, or None: the model exists
    and its owner tag names another namespace, or it has none (made by hand, by `kompile run`, or by
    an operator older than the tag). Absent models are free: record() creates them with the tag."""
    from mlflow.exceptions import MlflowException

    try:
        model = _client(tracking_uri).get_registered_model(name)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    owner = (model.tags or {}).get(OWNER_TAG)
    if owner == namespace:
        return None
    held = f"belongs to namespace {owner}" if owner else f"has no {OWNER_TAG} tag (not made by the operator)"
    return (
        f"MLflow model {name!r} {held}: set spec.registry.modelName to a name of your own "
        f"(for example {namespace}-{name})"
        + ("" if owner else f", or, if the model is yours, tag it {OWNER_TAG}={namespace} in MLflow")
    )


def record(
    cm: CompiledModel,
    status: CompiledModelStatus,
    records: list[TargetRecord],
    tracking_uri: str,
    lineage: Mapping[str, str] | None = None,
    artifact_location: str | None = None,
    alias_validated: bool = True,
) -> RegistryStatus:
    """A parent run, a child run per target, a model version per built artifact. With
    alias_validated, each validated target's alias points at its version (`kompile run`); the
    operator instead moves per-class aliases itself once the rollout is Ready (`set_alias`)."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    name = model_name(cm)
    experiment = f"kompile/{cm.metadata.namespace or 'local'}/{cm.metadata.name}"
    exp = client.get_experiment_by_name(experiment)
    # With a database store and no server, MLflow would put artifacts in ./mlruns of the cwd.
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment(experiment, artifact_location=artifact_location)
    )
    lineage = {**source_lineage(client, cm.spec.source.uri), **(lineage or {})}
    parent_tags = {
        "kompile.run": "generation",
        "kompile.name": cm.metadata.name,
        "kompile.namespace": cm.metadata.namespace or "",
        "kompile.uid": cm.metadata.uid or "",
        "kompile.generation": str(cm.metadata.generation or ""),
        "kompile.source_uri": cm.spec.source.uri,
        "kompile.source_digest": status.source_digest or "",
        **lineage,
    }
    try:
        client.get_registered_model(name)
    except MlflowException:
        owner = {OWNER_TAG: cm.metadata.namespace} if cm.metadata.namespace else {}
        client.create_registered_model(name, tags={"kompile.compiledmodel": cm.metadata.name, **owner})
    # An operator's generation is recorded once: a retry after a crash finds the parent it wrote.
    found = _runs(client, exp_id, parent_tags, "kompile.run", "kompile.uid", "kompile.generation")
    parent = (
        found[0]
        if found and cm.metadata.uid
        else client.create_run(
            exp_id, run_name=cm.metadata.name, tags={k: v for k, v in parent_tags.items() if v}
        )
    )
    try:
        for rec in records:
            _record_target(
                client,
                cm,
                name,
                exp_id,
                parent.info.run_id,
                rec,
                status.source_digest,
                lineage,
                alias_validated,
            )
        client.log_dict(parent.info.run_id, status.to_wire(), "status.json")
    finally:
        client.set_terminated(parent.info.run_id)
    # Every reader of the CompiledModel sees this: no keys.
    return RegistryStatus(
        tracking_uri=without_userinfo(tracking_uri), model_name=name, run_id=parent.info.run_id
    )


def record_late(
    cm: CompiledModel,
    status: CompiledModelStatus,
    records: list[TargetRecord],
    registry: RegistryStatus,
) -> None:
    """Targets that settled after their generation was recorded (a hardware class that joined the
    fleet later): child runs and versions under the generation's existing parent run."""
    assert registry.tracking_uri and registry.model_name and registry.run_id
    client = _client(registry.tracking_uri)
    exp_id = client.get_run(registry.run_id).info.experiment_id
    lineage = source_lineage(client, cm.spec.source.uri)
    for rec in records:
        _record_target(
            client,
            cm,
            registry.model_name,
            exp_id,
            registry.run_id,
            rec,
            status.source_digest,
            lineage,
            False,
        )


def _record_target(
    client: Any,
    cm: CompiledModel,
    name: str,
    exp_id: str,
    parent_id: str,
    rec: TargetRecord,
    digest: str | None,
    lineage: Mapping[str, str],
    alias_validated: bool,
) -> None:
    from mlflow.entities import Metric, Param

    t = rec.status
    tags = {"mlflow.parentRunId": parent_id, "kompile.run": "target", **_version_tags(cm, t, digest)}
    found = _runs(client, exp_id, tags, "kompile.run", "mlflow.parentRunId", "kompile.target")
    if found:  # recorded before a crash: its figures are there, find its version below
        run_id = found[0].info.run_id
    else:
        run_id = client.create_run(exp_id, run_name=t.name, tags=tags).info.run_id
        now = int(time.time() * 1000)
        try:
            client.log_batch(
                run_id,
                metrics=[Metric(k, v, now, 0) for k, v in _metrics(t).items()],
                params=[Param(k, str(v)[:6000]) for k, v in rec.params.items()],
            )
            client.log_text(run_id, json.dumps(t.to_wire(), indent=2), "result.json")
            if rec.model_dir is not None:
                client.log_artifacts(run_id, str(rec.model_dir), artifact_path=f"model/{rec.model_dir.name}")
            for c in t.candidates:
                _record_candidate(client, exp_id, run_id, t, c)
        finally:
            client.set_terminated(run_id)
    if t.artifact is None:
        return  # nothing was built: a failed compile has no version to register
    # A version registered before a crash is found by its run, never made twice.
    existing = [v for v in client.search_model_versions(f"run_id = '{run_id}'") if v.name == name]
    # The version's source is the artifact itself where it lives in a store the server can reach
    # (s3://); a local run's artifacts were logged to the run instead.
    source = f"runs:/{run_id}/model" if rec.model_dir is not None else t.artifact.uri
    version = (
        existing[0]
        if existing
        else client.create_model_version(
            name,
            source=source,
            run_id=run_id,
            tags={**_version_tags(cm, t, digest), **lineage, "kompile.artifact_uri": t.artifact.uri},
            description=f"{t.backend} {t.precision} for {t.hardware_class or t.name}",
        )
    )
    t.registered_version = str(version.version)
    if alias_validated and t.validation is not None and t.validation.passed:
        client.set_registered_model_alias(name, alias_for(t.name), version.version)


def _runs(client: Any, exp_id: str, tags: Mapping[str, str], *keys: str) -> list[Any]:
    """Runs of the experiment whose tags equal `tags` at `keys`, oldest first."""
    quoted = [f"tags.`{k}` = '{str(tags[k]).replace(chr(39), '')}'" for k in keys if tags.get(k)]
    if len(quoted) < len(keys):
        return []
    runs = client.search_runs(
        [exp_id], filter_string=" and ".join(quoted), order_by=["attributes.start_time ASC"]
    )
    return list(runs)


def _record_candidate(client: Any, exp_id: str, target_run: str, t: TargetStatus, c: CandidateStatus) -> None:
    """A child run under the target's run per candidate, so the MLflow UI compares them side by side."""
    from mlflow.entities import Metric, Param

    tags = {
        "mlflow.parentRunId": target_run,
        "kompile.target": t.name,
        "kompile.candidate": c.name,
        "kompile.backend": c.backend,
        "kompile.precision": c.precision,
        "kompile.phase": c.phase,
        "kompile.selected": str(c.selected).lower(),
        "kompile.reason": c.reason or "",
    }
    run = client.create_run(exp_id, run_name=f"{t.name}/{c.name}", tags={k: v for k, v in tags.items() if v})
    now = int(time.time() * 1000)
    metrics = {
        "speedup": c.speedup,
        "compile_seconds": c.compile_seconds,
        "max_abs_error": c.max_abs_error,
        "min_cosine": c.min_cosine,
        "accuracy": c.accuracy,
        "accuracy_drop": c.accuracy_drop,
        "detection_agreement": c.detection_agreement,
        **_figures(c.latency),
    }
    params = {
        "backend": c.backend,
        "precision": c.precision,
        **{f"option.{k}": v for k, v in (c.options or {}).items()},
    }
    try:
        client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None],
            params=[Param(k, str(v)[:6000]) for k, v in params.items()],
        )
        if c.message:
            client.log_text(run.info.run_id, c.message, "message.txt")
    finally:
        client.set_terminated(run.info.run_id)


def set_alias(tracking_uri: str, model_name: str, alias: str, version: str) -> None:
    """Point alias at version (the operator calls this only for a validated, Ready rollout)."""
    _client(tracking_uri).set_registered_model_alias(model_name, alias_for(alias), version)
