"""The rollout state machine, as pure functions (import it from kompile.operator.rollout).

`step` looks at the last recorded RolloutStatus, the InferenceService as the API server returned it,
and the storageUri that should serve, and says what to do next. Its body is a manifest to create or
a JSON merge patch (RFC 7386: null deletes a field) for the InferenceService. Transitions:

  no InferenceService                        -> create   Progressing (a first rollout has no canary)
  another model serves, canary asked         -> update   Canary (canaryTrafficPercent or spec.canary)
  another model serves, no canary possible   -> update   Progressing (direct; status says why)
  canary Ready                               -> promote  Ready
  canary not Ready after the timeout         -> rollback RolledBack (the previous model serves)
  direct rollout not Ready after the timeout -> rollback RolledBack
  desired model serves and is Ready          -> none     Ready
  otherwise                                  -> wait     (phase unchanged, message says what for)

Readiness is read the way KServe writes it (kompile.operator.rollout's docstring has the facts).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kompile.api.status import RolloutPhase, RolloutStatus
from kompile.operator.jobs import LABEL_TARGET

MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
CONTAINER_NAME = "kserve-container"
SERVERLESS_MODES = frozenset({"Serverless", "Knative"})  # Knative: the name since KServe v0.17
STANDARD_MODES = frozenset({"Standard", "RawDeployment"})  # RawDeployment: the name before v0.17
# PredictorReady's reason while a Standard-mode Deployment rolls out: old pods keep it Available;
# it becomes NewReplicaSetAvailable once the new ReplicaSet serves.
_MID_ROLLOUT = "MinimumReplicasAvailable"

CanaryStyle = Literal["traffic", "spec", "none"]
Action = Literal["create", "update", "promote", "rollback", "wait", "none"]


def effective_mode(isvc: dict[str, Any] | None, mode: str) -> str:
    """An existing InferenceService's recorded mode (KServe refuses to change it), else `mode`."""
    if isvc is None:
        return mode
    recorded = (isvc.get("status") or {}).get("deploymentMode")
    annotated = ((isvc.get("metadata") or {}).get("annotations") or {}).get(MODE_ANNOTATION)
    return str(recorded or annotated or mode)


def canary_style(mode: str, spec_canary: bool) -> CanaryStyle:
    """traffic: predictor.canaryTrafficPercent; spec: spec.canary; none: no traffic splitting."""
    if mode in SERVERLESS_MODES:
        return "traffic"
    return "spec" if mode in STANDARD_MODES and spec_canary else "none"


def canary_predictor_name(uri: str) -> str:
    """Standard-mode canary name, from the model: a new candidate never clashes with the stable one."""
    return "c" + hashlib.sha256(uri.encode()).hexdigest()[:8]


def canary_entry(model: dict[str, Any], percent: int) -> dict[str, Any]:
    """One spec.canary item: KServe overlays this predictor on the stable one."""
    name = canary_predictor_name(str(model.get("storageUri", "")))
    # KServe v0.20.0's CRD requires model.name (the container name) inside spec.canary (its Makefile
    # strips that `required` for spec.predictor only); KServe names the container this anyway.
    canary_model = {**copy.deepcopy(model), "name": CONTAINER_NAME}
    return {"trafficPercent": percent, "predictor": {"name": name, "model": canary_model}}


# -- reading an InferenceService -----------------------------------------------------------------


def _predictor(isvc: dict[str, Any]) -> dict[str, Any]:
    return dict((isvc.get("spec") or {}).get("predictor") or {})


def _uri(predictor: dict[str, Any]) -> str | None:
    uri = (predictor.get("model") or {}).get("storageUri")
    return str(uri) if uri else None


def _condition(isvc: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in (isvc.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def _observed(isvc: dict[str, Any]) -> bool:
    generation = (isvc.get("metadata") or {}).get("generation")
    observed = (isvc.get("status") or {}).get("observedGeneration")
    return generation is None or (observed is not None and observed >= generation)


def serving_ready(isvc: dict[str, Any], style: CanaryStyle) -> tuple[bool, str]:
    """Whether the spec as written now serves, and if not, why."""
    if style == "traffic":
        # Knative revisions: the status must describe this generation, and its newest revision serve.
        if not _observed(isvc):
            return False, f"KServe has not observed generation {isvc['metadata'].get('generation')} yet"
        comp = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
        created, ready = comp.get("latestCreatedRevision"), comp.get("latestReadyRevision")
        if not created or created != ready:
            return False, f"revision {created or '(none yet)'} is not Ready (latest Ready: {ready or 'none'})"
    cond = _condition(isvc, "Ready")
    if cond.get("status") != "True":
        detail = cond.get("message") or cond.get("reason") or "no Ready condition yet"
        return False, f"Ready is {cond.get('status', 'unset')}: {detail}"
    if style != "traffic" and _condition(isvc, "PredictorReady").get("reason") == _MID_ROLLOUT:
        # Standard mode has no revisions (its observedGeneration is the Deployment's): this reason is
        # the only sign that old pods still serve while the new ReplicaSet comes up.
        return False, "the predictor Deployment is still rolling out (old pods serve)"
    return True, "Ready"


def _in_flight(isvc: dict[str, Any], style: CanaryStyle, desired_uri: str) -> tuple[str | None, int | None]:
    """(storageUri, percent) of a canary the InferenceService holds, if any."""
    predictor = _predictor(isvc)
    if style == "traffic" and predictor.get("canaryTrafficPercent") is not None:
        return _uri(predictor), int(predictor["canaryTrafficPercent"])
    if style == "spec":
        entries = (isvc.get("spec") or {}).get("canary") or []
        mine = [e for e in entries if _uri(e.get("predictor") or {}) == desired_uri] or entries
        if mine:
            return _uri(mine[0].get("predictor") or {}), int(mine[0].get("trafficPercent", 0))
    return None, None


def canary_ready(isvc: dict[str, Any], style: CanaryStyle, uri: str) -> tuple[bool, str]:
    if style == "traffic":  # the candidate is the newest revision
        return serving_ready(isvc, style)
    name = canary_predictor_name(uri)
    for entry in (isvc.get("status") or {}).get("canaryStatuses") or []:
        if entry.get("name") == name:
            return (True, "Ready") if entry.get("ready") else (False, f"canary {name} is not Ready")
    return False, f"KServe reports no status for canary {name} yet"


# -- bodies --------------------------------------------------------------------------------------


def _desired_model(desired: dict[str, Any] | None, uri: str) -> dict[str, Any]:
    if desired is None:
        return {"storageUri": uri}
    entries = desired["spec"].get("canary") or []
    model = dict((entries[0]["predictor"] if entries else desired["spec"]["predictor"])["model"])
    model.pop("name", None)
    if model.get("storageUri") != uri:
        raise ValueError(f"desired manifest serves {model.get('storageUri')}, not {uri}")
    return copy.deepcopy(model)


def _without_canary(desired: dict[str, Any] | None, uri: str) -> dict[str, Any] | None:
    """A first rollout has nothing to compare a canary with: create the plain manifest."""
    if desired is None:
        return None
    out = copy.deepcopy(desired)
    out["spec"]["predictor"]["model"] = _desired_model(desired, uri)
    out["spec"]["predictor"].pop("canaryTrafficPercent", None)
    out["spec"].pop("canary", None)
    return out


def _meta_patch(desired: dict[str, Any] | None) -> dict[str, Any]:
    if desired is None:
        return {}
    meta = desired.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != MODE_ANNOTATION}
    return {"metadata": {"labels": dict(meta.get("labels") or {}), "annotations": annotations}}


def _restore(style: CanaryStyle, previous: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"predictor": {"model": {"storageUri": previous}}}
    if style == "traffic":
        spec["predictor"]["canaryTrafficPercent"] = None
    if style == "spec":
        spec["canary"] = None
    return {"spec": spec}


def _promote(
    isvc: dict[str, Any], style: CanaryStyle, uri: str, desired: dict[str, Any] | None
) -> dict[str, Any]:
    if style == "traffic":
        return {**_meta_patch(desired), "spec": {"predictor": {"canaryTrafficPercent": None}}}
    entry = next(e for e in isvc["spec"]["canary"] if _uri(e.get("predictor") or {}) == uri)
    # The stable predictor takes the canary's name: KServe then serves from the canary Deployment.
    # Its model must not carry a container name (KServe's webhook rejects one on the stable predictor).
    model = {k: v for k, v in entry["predictor"]["model"].items() if k != "name"}
    predictor = {"name": entry["predictor"]["name"], "model": model}
    return {**_meta_patch(desired), "spec": {"predictor": predictor, "canary": None}}


# -- the state machine ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do next, the status to record, and the body for the API call (if any)."""

    action: Action
    status: RolloutStatus
    message: str
    body: dict[str, Any] | None = None
    """create: the manifest to create; update, promote, rollback: a JSON merge patch."""


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Step:
    """What every branch of `step` shares."""

    base: RolloutStatus
    uri: str
    isvc: dict[str, Any]
    style: CanaryStyle
    timeout_s: int
    now: datetime
    desired: dict[str, Any] | None

    @property
    def name(self) -> str:
        return self.base.inference_service or "?"

    def started(self, phases: tuple[str, ...]) -> datetime:
        """When the step in progress began, if the record says one of `phases` for this URI."""
        b = self.base
        if b.phase in phases and b.storage_uri == self.uri and b.started_at:
            return datetime.fromisoformat(b.started_at)
        return self.now

    def late(self, since: datetime) -> bool:
        return (self.now - since).total_seconds() >= self.timeout_s

    def decide(
        self, action: Action, phase: RolloutPhase, msg: str, body: dict[str, Any] | None = None, **fields: Any
    ) -> Decision:
        return Decision(
            action, self.base.model_copy(update={"phase": phase, "message": msg, **fields}), msg, body
        )


def _canary_step(s: _Step, serving: str | None, percent: int | None) -> Decision:
    """A canary of the desired model is in flight: promote, roll back, or wait."""
    started = s.started(("Canary",))
    fields: dict[str, Any] = {
        "storage_uri": s.uri,
        "previous_storage_uri": serving,
        "canary_traffic_percent": None,
    }
    ready, why = canary_ready(s.isvc, s.style, s.uri)
    if ready:
        msg = f"promoted {s.uri}: its canary became Ready and now takes all traffic"
        body = _promote(s.isvc, s.style, s.uri, s.desired)
        return s.decide("promote", "Ready", msg, body, started_at=_stamp(s.now), **fields)
    if s.late(started):
        if s.style == "spec":  # the stable predictor never changed: dropping the canary is the rollback
            body, left = {"spec": {"canary": None}}, serving or "the stable predictor"
        elif serving and serving != s.uri:
            body, left = _restore(s.style, serving), serving
        else:  # what served before is unknown: KServe's own rollback pins the last rolled-out revision
            body, left = {"spec": {"predictor": {"canaryTrafficPercent": 0}}}, "the last rolled-out revision"
        msg = f"rolled back {s.uri}: canary not Ready within {s.timeout_s}s ({why}); {left} serves"
        return s.decide("rollback", "RolledBack", msg, body, started_at=_stamp(s.now), **fields)
    msg = f"canary: {percent}% of traffic to {s.uri}, not Ready yet ({why}); rollback after {s.timeout_s}s"
    fields["canary_traffic_percent"] = percent
    return s.decide("wait", "Canary", msg, started_at=_stamp(started), **fields)


def _settled_step(s: _Step) -> Decision:
    """The desired model is the InferenceService's own: Ready, wait, or roll back a direct rollout."""
    b, ts = s.base, _stamp(s.now)
    ready, why = serving_ready(s.isvc, s.style)
    mine = b.storage_uri == s.uri
    if ready:
        if mine and b.phase == "Ready":
            return Decision("none", b, b.message or "Ready")
        msg = f"Ready: {s.name} serves {s.uri}"
        return s.decide("none", "Ready", msg, storage_uri=s.uri, canary_traffic_percent=None, started_at=ts)
    if mine and b.phase == "Ready" and not _observed(s.isvc):  # a promotion KServe has not seen yet
        return Decision("wait", b, f"waiting for KServe to observe {s.name}'s latest generation")
    if not (mine and b.phase in ("Progressing", "Failed")):
        msg = f"waiting for {s.name} serving {s.uri} to become Ready ({why})"
        return s.decide(
            "wait", "Progressing", msg, storage_uri=s.uri, canary_traffic_percent=None, started_at=ts
        )
    late, previous = s.late(s.started(("Progressing", "Failed"))), b.previous_storage_uri
    if late and previous and previous != s.uri:
        msg = f"rolled back {s.uri}: not Ready within {s.timeout_s}s ({why}); {previous} serves"
        return s.decide("rollback", "RolledBack", msg, _restore(s.style, previous), started_at=ts)
    if late:
        return s.decide(
            "wait", "Failed", f"{s.name} not Ready within {s.timeout_s}s ({why}); nothing to roll back to"
        )
    msg = f"waiting for {s.name} serving {s.uri} to become Ready ({why}); rollback after {s.timeout_s}s"
    return s.decide("wait", b.phase, msg)


def _start_step(s: _Step, serving: str | None, mode: str, canary_percent: int | None) -> Decision:
    """Something else serves: start a canary where the mode allows one, else roll out directly."""
    model = _desired_model(s.desired, s.uri)
    fields: dict[str, Any] = {
        "storage_uri": s.uri,
        "previous_storage_uri": serving,
        "started_at": _stamp(s.now),
    }
    if canary_percent is None or s.style == "none":
        body = {**_meta_patch(s.desired), "spec": {"predictor": {"model": model}}}
        if s.style == "traffic":
            body["spec"]["predictor"]["canaryTrafficPercent"] = None
        if s.style == "spec":
            body["spec"]["canary"] = None
        msg = f"updating {s.name} from {serving} to {s.uri}"
        if canary_percent is not None:
            msg += (
                f"; no canary: {mode} mode has no traffic splitting here (canaryTrafficPercent is ignored "
                "outside Serverless mode; Standard mode needs KServe >= 0.20 for spec.canary), so it "
                "rolled out directly"
            )
        return s.decide("update", "Progressing", msg, body, canary_traffic_percent=None, **fields)
    if s.style == "traffic":
        body = {"spec": {"predictor": {"canaryTrafficPercent": canary_percent, "model": model}}}
    else:
        body = {"spec": {"canary": [canary_entry(model, canary_percent)]}}
    msg = f"canary: {canary_percent}% of traffic to {s.uri}, the rest on {serving}"
    msg += f"; rollback after {s.timeout_s}s"
    return s.decide("update", "Canary", msg, body, canary_traffic_percent=canary_percent, **fields)


def step(
    current: RolloutStatus | None,
    desired_uri: str,
    isvc: dict[str, Any] | None,
    mode: str,
    canary_percent: int | None,
    timeout_s: int,
    now: datetime,
    *,
    desired: dict[str, Any] | None = None,
    spec_canary: bool = False,
    hardware_class: str = "",
) -> Decision:
    """One step of the rollout of `desired_uri` to the InferenceService `isvc` (None: not there yet).

    `desired` is the manifest from `inference_service(..., canary_percent=None)`: its model block and
    labels go into the bodies (without it, bodies carry only the storageUri). `spec_canary` says
    whether the CRD has spec.canary (crd_supports_spec_canary). `hardware_class` names the class when
    there is no `current` yet. A rolled-back candidate is not tried again while `current` records it:
    pass current=None (say, on a new generation) to retry.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    mode = effective_mode(isvc, mode)
    style = canary_style(mode, spec_canary)
    base = current.model_copy() if current else RolloutStatus(hardware_class=hardware_class, phase="Pending")
    meta = (isvc or desired or {}).get("metadata") or {}
    base.inference_service = meta.get("name") or base.inference_service
    base.deployment_mode = mode
    labels = ((desired or {}).get("metadata") or {}).get("labels") or {}
    base.target = labels.get(LABEL_TARGET) or base.target
    s = _Step(base, desired_uri, isvc or {}, style, timeout_s, now, desired)

    if isvc is None:
        msg = f"creating {s.name} serving {desired_uri}"
        return s.decide(
            "create",
            "Progressing",
            msg,
            _without_canary(desired, desired_uri),
            storage_uri=desired_uri,
            previous_storage_uri=None,
            canary_traffic_percent=None,
            started_at=_stamp(now),
        )
    if base.phase == "RolledBack" and base.storage_uri == desired_uri:
        return Decision("none", base, base.message or f"{desired_uri} was rolled back")

    candidate, percent = _in_flight(isvc, style, desired_uri)
    serving = _uri(_predictor(isvc))
    if candidate is not None and style == "traffic":
        # The spec already names the candidate: what served before it is only in our own record.
        serving = current.previous_storage_uri if current else None
    if candidate is not None and candidate == desired_uri:
        return _canary_step(s, serving, percent)
    serving = serving or _uri(_predictor(isvc))
    if serving == desired_uri and candidate is not None:  # an older candidate's canary: drop it
        msg = f"dropping canary {candidate}: {desired_uri} is the winner"
        return s.decide(
            "update",
            "Progressing",
            msg,
            _restore(style, desired_uri),
            storage_uri=desired_uri,
            canary_traffic_percent=None,
            started_at=_stamp(now),
        )
    if serving == desired_uri:
        return _settled_step(s)
    return _start_step(s, serving, mode, canary_percent)
