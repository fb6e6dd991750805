"""MLflow lineage from the operator: once every target of a generation has settled, one parent run
for the generation, a child run and a model version per built target (source: the artifact in the
store), and per hardware class an alias on the validated winner, moved only once it serves (or at
once when no rollout is asked for). Failures here are reported and retried, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kompile.api.resource import CompiledModel
from kompile.api.status import READY, CompiledModelStatus, TargetStatus, set_condition
from kompile.operator.crashpoints import crash_point
from kompile.operator.outages import BREAKER, Breaker, is_outage
from kompile.operator.settings import Settings
from kompile.operator.tenancy import host_of
from kompile.registry import hide_userinfo

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
        _register_late(cm, status, settings, event, uri)
        return
    if _waiting(uri, cm, status, event):
        return
    from mlflow.exceptions import MlflowException

    from kompile.registry import TargetRecord, record

    records = [TargetRecord(t, None, _params(t, settings)) for t in status.targets if t.phase != "Skipped"]
    try:
        if _name_taken(cm, status, uri, event):
            BREAKER.succeeded(uri)  # MLflow answered: a refusal, not an outage
            return
        status.registry = record(cm, status, records, uri, alias_validated=False)
    except (MlflowException, OSError) as err:
        # Retried after a backoff: status.registry stays empty until it succeeds, and the tags
        # written so far let the retry find what this attempt made (kompile.registry.record).
        _failed(uri, cm, status, err, event)
        return
    crash_point("after-registration")  # MLflow has it, status does not yet
    _answered(uri, cm)
    versions = _versions(status.targets) or "no version"
    event("Normal", "Registered", f"MLflow model {status.registry.model_name}: {versions}")


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
    cm: CompiledModel, status: CompiledModelStatus, settings: Settings, event: EventFn, uri: str
) -> None:
    late = [t for t in status.targets if t.artifact is not None and not t.registered_version]
    if not late or status.registry is None or _waiting(uri, cm, status, event):
        return
    from mlflow.exceptions import MlflowException

    from kompile.registry import TargetRecord, record_late

    try:
        record_late(cm, status, [TargetRecord(t, None, _params(t, settings)) for t in late], status.registry)
    except (MlflowException, OSError) as err:
        _failed(uri, cm, status, err, event)
        return
    _answered(uri, cm)
    event("Normal", "Registered", f"MLflow model {status.registry.model_name}: {_versions(late)}")


REFUSED = Breaker()
"""Per CompiledModel at an MLflow (keyed by _own_key): its backoff after MLflow refused its request.
A refusal is an answer about that model only; BREAKER, per endpoint, is for outages."""


def _own_key(uri: str, cm: CompiledModel) -> str:
    who = cm.metadata.uid or f"{cm.metadata.namespace}/{cm.metadata.name}"
    return f"{who}@{host_of(uri) or uri}"  # no scheme: not read as a URL by the breaker


def _waiting(uri: str, cm: CompiledModel, status: CompiledModelStatus, event: EventFn) -> str | None:
    """Why this model waits (and Registered=False says so): MLflow at uri in its backoff after an
    outage, or this CompiledModel in its own after MLflow refused it; None when it may call."""
    wait = BREAKER.wait(uri)
    reason = "RegistryUnavailable"
    if wait is None:
        wait, reason = REFUSED.wait(_own_key(uri, cm)), "RegistryFailed"
    if wait is None:
        return None
    seconds, why = wait
    _set_unregistered(status, reason, f"{why}; next attempt in {seconds:.0f} s", event)
    if reason == "RegistryUnavailable":
        return "MLflow unavailable"
    return "MLflow refused this model's last call"


def _failed(
    uri: str, cm: CompiledModel, status: CompiledModelStatus, err: BaseException, event: EventFn
) -> None:
    why = hide_userinfo(f"MLflow at {uri}: {type(err).__name__}: {str(err)[:300]}")
    if is_outage(err):
        delay = BREAKER.failed(uri, why)
        _set_unregistered(status, "RegistryUnavailable", f"{why}; next attempt in {delay:.0f} s", event)
        return
    BREAKER.succeeded(uri)  # it answered: up for every other CompiledModel
    delay = REFUSED.failed(_own_key(uri, cm), why)
    _set_unregistered(status, "RegistryFailed", f"{why}; next attempt in {delay:.0f} s", event)


def _answered(uri: str, cm: CompiledModel) -> None:
    BREAKER.succeeded(uri)
    REFUSED.succeeded(_own_key(uri, cm))


def _set_unregistered(status: CompiledModelStatus, reason: str, message: str, event: EventFn) -> None:
    """Registered=False; a Warning only when the reason changes, so an outage posts one Event
    however many reconciles it lasts."""
    before = next((c for c in status.conditions if c.type == REGISTERED), None)
    status.conditions = set_condition(
        status.conditions, REGISTERED, "False", reason, message[:1000], status.observed_generation
    )
    if before is None or (before.status, before.reason) != ("False", reason):
        event("Warning", reason, message)


def _versions(targets: list[TargetStatus]) -> str:
    return ", ".join(f"{t.name}=v{t.registered_version}" for t in targets if t.registered_version)


def settle_registered(cm: CompiledModel, status: CompiledModelStatus, settings: Settings) -> bool:
    """Registered=True once the generation's run, every built target's version and every alias
    move are in MLflow; a failure this reconcile already set it False. Returns whether done."""
    if tracking_uri(cm, settings) is None:
        status.conditions = [c for c in status.conditions if c.type != REGISTERED]
        return True
    registry = status.registry
    late = [t.name for t in status.targets if t.artifact is not None and not t.registered_version]
    done = bool(registry and registry.run_id and not late and not registry.pending_aliases)
    current = next((c for c in status.conditions if c.type == REGISTERED), None)
    if done and registry is not None:
        message = f"MLflow model {registry.model_name}: {_versions(status.targets) or 'no version'}"
        status.conditions = set_condition(
            status.conditions, REGISTERED, "True", "Registered", message, status.observed_generation
        )
    elif current is None or current.status != "False":
        status.conditions = set_condition(
            status.conditions,
            REGISTERED,
            "Unknown",
            "Pending",
            "recorded in MLflow once every target has settled",
            status.observed_generation,
        )
    return done


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

    pending = [p for p in registry.pending_aliases if p.startswith(f"{hardware_class}:")]
    waiting = _waiting(uri, cm, status, event)
    if waiting:
        # A backoff (MLflow's or this model's own): the move waits in pendingAliases with the reason.
        registry.pending_aliases = [p for p in registry.pending_aliases if p not in pending]
        registry.pending_aliases.append(f"{hardware_class}: version {version} ({waiting})")
        return False
    registry.pending_aliases = [p for p in registry.pending_aliases if p not in pending]
    try:
        set_alias(uri, registry.model_name, hardware_class, version)
    except (MlflowException, OSError) as err:
        why = hide_userinfo(f"{type(err).__name__}: {str(err)[:200]}")
        registry.pending_aliases.append(f"{hardware_class}: version {version} ({why})")
        if not pending:  # one Event per failed move, however many retries it takes
            event("Warning", "AliasFailed", f"alias {hardware_class}: {why}; retrying after a backoff")
        _failed(uri, cm, status, err, lambda *_: None)
        return False
    _answered(uri, cm)
    registry.aliases[hardware_class] = version
    event(
        "Normal",
        "AliasMoved",
        f"alias {hardware_class} -> version {target.registered_version} ({target.name})",
    )
    return True
