"""MLflow lineage from the operator: once every target of a generation has settled, one parent run
for the generation, a child run and a model version per built target (source: the artifact in the
store), and per hardware class an alias on the validated winner, moved only once it serves (or at
once when no rollout is asked for). Failures here are reported and retried, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kompile.api.resource import CompiledModel
from kompile.api.status import READY, CompiledModelStatus, TargetStatus, set_condition
from kompile.operator.settings import Settings

log = logging.getLogger("kompile.operator")

EventFn = Callable[[str, str, str], None]

REGISTERED = "Registered"
TAKEN = "ModelNameTaken"


def tracking_uri(cm: CompiledModel, settings: Settings) -> str | None:
    return (cm.spec.registry.tracking_uri if cm.spec.registry else None) or settings.tracking_uri


def _params(t: TargetStatus, settings: Settings) -> dict[str, str]:
    return {
        "backend": t.backend,
        "backend_version": settings.backend_versions.get(t.backend, "unknown"),
        "precision": t.precision,
        "hardware_class": t.hardware_class or "",
        "cached": str(t.cached).lower(),
        "cache_key": t.cache_key or "",
    }


def register_generation(
    cm: CompiledModel, status: CompiledModelStatus, settings: Settings, event: EventFn
) -> None:
    """Record the settled generation in MLflow, once (status.registry.runId marks it done); a
    target built after that (a class that joined the fleet) is added to the same parent run."""
    uri = tracking_uri(cm, settings)
    if uri is None:
        return
    if status.registry is not None and status.registry.run_id:
        _register_late(cm, status, settings, event)
        return
    from mlflow.exceptions import MlflowException

    from kompile.registry import TargetRecord, record

    records = [TargetRecord(t, None, _params(t, settings)) for t in status.targets if t.phase != "Skipped"]
    try:
        if _name_taken(cm, status, uri, event):
            return
        status.registry = record(cm, status, records, uri, alias_validated=False)
    except (MlflowException, OSError) as err:
        # Retried at the next reconcile: status.registry stays empty until it succeeds.
        event("Warning", "RegistryFailed", f"MLflow at {uri}: {type(err).__name__}: {str(err)[:300]}")
        return
    versions = ", ".join(f"{t.name}=v{t.registered_version}" for t in status.targets if t.registered_version)
    event("Normal", "Registered", f"MLflow model {status.registry.model_name}: {versions or 'no version'}")


def _name_taken(cm: CompiledModel, status: CompiledModelStatus, uri: str, event: EventFn) -> bool:
    """Refuse, before any run or version, a model name that another namespace's CompiledModel (or
    someone outside kompile) registered: Registered and Ready go False, reason ModelNameTaken."""
    from kompile.registry import check_model_owner, model_name

    namespace = cm.metadata.namespace or "default"
    refused = check_model_owner(uri, model_name(cm), namespace)
    if refused is None:
        return False
    generation = cm.metadata.generation
    before = next((c for c in status.conditions if c.type == REGISTERED), None)
    for type_ in (REGISTERED, READY):
        status.conditions = set_condition(status.conditions, type_, "False", TAKEN, refused, generation)
    if before is None or before.reason != TAKEN:
        event("Warning", TAKEN, refused)
    return True


def _register_late(
    cm: CompiledModel, status: CompiledModelStatus, settings: Settings, event: EventFn
) -> None:
    late = [t for t in status.targets if t.artifact is not None and not t.registered_version]
    if not late or status.registry is None:
        return
    from mlflow.exceptions import MlflowException

    from kompile.registry import TargetRecord, record_late

    try:
        record_late(cm, status, [TargetRecord(t, None, _params(t, settings)) for t in late], status.registry)
    except (MlflowException, OSError) as err:
        event("Warning", "RegistryFailed", f"MLflow: {type(err).__name__}: {str(err)[:300]}")
        return
    versions = ", ".join(f"{t.name}=v{t.registered_version}" for t in late if t.registered_version)
    event("Normal", "Registered", f"MLflow model {status.registry.model_name}: {versions}")


def move_alias(
    cm: CompiledModel,
    status: CompiledModelStatus,
    settings: Settings,
    hardware_class: str,
    target: TargetStatus,
    event: EventFn,
) -> bool:
    """Point the class's alias at the target's version (only for a validated target that serves),
    unless it already points there. False when MLflow refused: the move stays in
    status.registry.pendingAliases and the next reconcile tries again."""
    uri = tracking_uri(cm, settings)
    registry = status.registry
    if uri is None or registry is None or not registry.model_name or not target.registered_version:
        return True  # nothing to point at: not a failure to retry
    assert target.validation is not None and target.validation.passed
    version = target.registered_version
    if registry.aliases.get(hardware_class) == version:
        return True
    from mlflow.exceptions import MlflowException

    from kompile.registry import set_alias

    registry.pending_aliases = [p for p in registry.pending_aliases if not p.startswith(f"{hardware_class}:")]
    try:
        set_alias(uri, registry.model_name, hardware_class, version)
    except (MlflowException, OSError) as err:
        why = f"{type(err).__name__}: {str(err)[:200]}"
        registry.pending_aliases.append(f"{hardware_class}: version {version} ({why})")
        event("Warning", "AliasFailed", f"alias {hardware_class}: {why}; retrying at the next reconcile")
        return False
    registry.aliases[hardware_class] = version
    event(
        "Normal",
        "AliasMoved",
        f"alias {hardware_class} -> version {target.registered_version} ({target.name})",
    )
    return True
