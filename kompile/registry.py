"""MLflow lineage: a parent run per pipeline execution, a child run per target, a registered model
with a version per target, and an alias per target that only a validated version ever gets.

Aliases, not stages: stages are deprecated in MLflow. Shared by `kompile run` and the operator, so
it depends on the API types only.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kompile.api.resource import CompiledModel
from kompile.api.status import CompiledModelStatus, RegistryStatus, TargetStatus

DEFAULT_TRACKING_URI = "sqlite:///.kompile/mlflow.db"


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
        for lat in t.latency:
            out[f"p50_ms_b{lat.batch_size}"] = lat.p50_ms
    if t.speedup is not None:
        out["speedup"] = t.speedup
    if t.validation and t.validation.outputs:
        out["max_abs_error"] = max(o.max_abs_error for o in t.validation.outputs)
        out["min_cosine"] = min(o.cosine for o in t.validation.outputs)
    return out


def _version_tags(cm: CompiledModel, t: TargetStatus, digest: str | None) -> dict[str, str]:
    verdict = "passed" if t.validation and t.validation.passed else "failed"
    tags = {
        "kompile.target": t.name,
        "kompile.backend": t.backend,
        "kompile.precision": t.precision,
        "kompile.hardware_class": t.hardware_class or "",
        "kompile.verdict": verdict,
        "kompile.speedup": f"{t.speedup:.3f}" if t.speedup is not None else "",
        "kompile.source_uri": cm.spec.source.uri,
        "kompile.source_digest": digest or "",
        "kompile.artifact_digest": t.artifact.digest if t.artifact else "",
    }
    return {k: v for k, v in tags.items() if v}


def record(
    cm: CompiledModel,
    status: CompiledModelStatus,
    records: list[TargetRecord],
    tracking_uri: str,
    lineage: Mapping[str, str] | None = None,
    artifact_location: str | None = None,
) -> RegistryStatus:
    """Log runs and register versions; set each validated target's alias. Returns what was written."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    # MLflow's own INFO lines (database migrations) would interleave with our progress display.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    name = (cm.spec.registry.model_name if cm.spec.registry else None) or cm.metadata.name
    experiment = f"kompile/{cm.metadata.namespace or 'local'}/{cm.metadata.name}"
    exp = client.get_experiment_by_name(experiment)
    # With a database store and no server, MLflow would put artifacts in ./mlruns of the cwd.
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment(experiment, artifact_location=artifact_location)
    )
    parent_tags = {
        "kompile.name": cm.metadata.name,
        "kompile.namespace": cm.metadata.namespace or "",
        "kompile.uid": cm.metadata.uid or "",
        "kompile.generation": str(cm.metadata.generation or ""),
        "kompile.source_uri": cm.spec.source.uri,
        "kompile.source_digest": status.source_digest or "",
        **(lineage or {}),
    }
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, tags={"kompile.compiledmodel": cm.metadata.name})
    with mlflow.start_run(experiment_id=exp_id, run_name=f"{cm.metadata.name}", tags=parent_tags) as parent:
        mlflow.log_dict(status.to_wire(), "status.json")
        for rec in records:
            _record_target(client, cm, name, exp_id, parent.info.run_id, rec, status.source_digest, lineage)
    return RegistryStatus(tracking_uri=tracking_uri, model_name=name, run_id=parent.info.run_id)


def _record_target(
    client: object,
    cm: CompiledModel,
    name: str,
    exp_id: str,
    parent_id: str,
    rec: TargetRecord,
    digest: str | None,
    lineage: Mapping[str, str] | None,
) -> None:
    import mlflow
    from mlflow import MlflowClient

    assert isinstance(client, MlflowClient)
    t = rec.status
    tags = {"mlflow.parentRunId": parent_id, **_version_tags(cm, t, digest)}
    with mlflow.start_run(experiment_id=exp_id, run_name=t.name, nested=True, tags=tags) as run:
        mlflow.log_params(dict(rec.params))
        mlflow.log_metrics(_metrics(t))
        mlflow.log_text(json.dumps(t.to_wire(), indent=2), "result.json")
        if rec.model_dir is not None:
            mlflow.log_artifacts(str(rec.model_dir), artifact_path=f"model/{rec.model_dir.name}")
    if t.artifact is None:
        return  # nothing was built: a failed compile has no version to register
    source = f"runs:/{run.info.run_id}/model"
    version = client.create_model_version(
        name,
        source=source,
        run_id=run.info.run_id,
        tags={**_version_tags(cm, t, digest), **(lineage or {}), "kompile.artifact_uri": t.artifact.uri},
        description=f"{t.backend} {t.precision} for {t.hardware_class or t.name}",
    )
    t.registered_version = str(version.version)
    if t.validation is not None and t.validation.passed:
        client.set_registered_model_alias(name, alias_for(t.name), version.version)
