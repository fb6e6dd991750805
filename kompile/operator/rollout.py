"""KServe rollout, as pure functions: which artifact may serve a hardware class, the InferenceService
that serves it, and the canary state machine that moves it there. The operator reads the cluster,
calls these, and applies what they return (a manifest to create or a JSON merge patch).

KServe facts this relies on (read in KServe v0.20.0's source, pkg/apis/serving/v1beta1 and
pkg/controller/v1beta1/inferenceservice, and its canary docs):
- Serverless mode (renamed Knative in v0.17; both spellings are accepted) splits traffic with
  `predictor.canaryTrafficPercent`: that share goes to the latest *ready* revision, the rest to
  `latestRolledoutRevision`; removing the field sends 100% to the latest ready revision. A revision
  that never becomes Ready never receives traffic, so the old one keeps serving.
- Standard mode (RawDeployment before v0.17) silently ignores canaryTrafficPercent. Since v0.20 it
  has `spec.canary: [{trafficPercent, predictor: {name, ...}}]`: a second Deployment
  `<isvc>-<name>-predictor`, readiness in `status.canaryStatuses[].ready`; promotion sets
  `predictor.name` to the canary's name (the canary Deployment becomes the stable one, no restart)
  and removes the entry; rollback removes the entry. Older KServe has no traffic split there at all.
- The mode is fixed once KServe records `status.deploymentMode`: an update that changes the
  annotation is rejected, so an existing InferenceService's own mode wins over the cluster default.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import yaml

from kompile.api.catalog import CATALOG
from kompile.api.resource import CompiledModel
from kompile.api.spec import Rollout, RolloutGate
from kompile.api.status import TargetStatus
from kompile.operator.fleet import GPU_RESOURCE
from kompile.operator.jobs import LABEL_CLASS, LABEL_NAME, LABEL_TARGET, label_value, owner_reference
from kompile.operator.rollout_state import (
    MODE_ANNOTATION,
    SERVERLESS_MODES,
    STANDARD_MODES,
    Decision,
    canary_entry,
    canary_style,
    effective_mode,
    step,
)
from kompile.operator.targets import ResolvedTarget

# The state machine lives in rollout_state (to keep files small); import it from here.
__all__ = [
    "DEFAULT_MODE",
    "MODE_ANNOTATION",
    "Decision",
    "canary_style",
    "cluster_mode",
    "crd_supports_spec_canary",
    "device_winner",
    "effective_mode",
    "gitops_configmap",
    "gitops_files",
    "inference_service",
    "service_name",
    "step",
    "storage_uri",
    "winner",
]

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
DEFAULT_MODE = "Serverless"  # KServe's documented default and the value its shipped ConfigMap holds
DIGEST_ANNOTATION = "kompile.dev/artifact-digest"
MANAGED_BY = {"app.kubernetes.io/managed-by": "kompile"}
# KServe model formats and Triton file names per backend come from the catalog; Triton (runtime
# kserve-tritonserver, set explicitly) serves every backend whose entry has a serving format.
MODEL_FORMATS = {name: e.serving.kserve_format for name, e in CATALOG.items() if e.serving}
NAME_MAX = 63
# KServe's own name rule (DNS-1035: a letter first), stricter than a DNS-1123 label.
_ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MODEL_SUFFIXES = sorted(
    {name.rsplit(".", 1)[-1] for e in CATALOG.values() if e.serving for name in e.serving.files}
)
# <root>/<model>/<version>/<file>
_MODEL_FILE = re.compile(r"/[^/]+/\d+/[^/]+\.(" + "|".join(map(re.escape, _MODEL_SUFFIXES)) + ")$")
_MODEL_CONFIG = re.compile(r"/[^/]+/config\.pbtxt$")


# -- what may serve ------------------------------------------------------------------------------


def _p50(t: TargetStatus) -> float:
    return t.latency[0].p50_ms if t.latency else math.inf


def _serving_refusal(t: TargetStatus) -> str | None:
    if t.backend in MODEL_FORMATS:
        return None
    if t.backend in CATALOG and CATALOG[t.backend].for_devices:
        return (
            f"a {t.backend} artifact is for devices, not KServe: devices of class {t.hardware_class} "
            "fetch the winner through the class's MLflow alias (docs/operations.md, Device fleets); "
            "list candidates of a served backend for classes that serve"
        )
    return (
        f"a {t.backend} artifact has no Triton model format kompile can roll out (Triton serves "
        f"{' and '.join(sorted(MODEL_FORMATS))} artifacts): list candidates of those backends for "
        "classes that serve"
    )


def _gate_refusal(t: TargetStatus, gate: RolloutGate | None) -> str | None:
    if gate is None:
        return None
    if gate.min_speedup is not None and (t.speedup is None or t.speedup < gate.min_speedup):
        shown = "unknown" if t.speedup is None else f"{t.speedup:.3g}"
        return f"speedup {shown} < gate {gate.min_speedup:g}"
    if gate.max_abs_error is not None:
        outputs = t.validation.outputs if t.validation else []
        worst = max((o.max_abs_error for o in outputs), default=math.nan)
        # NaN (no outputs, or a NaN figure) can never prove the bound: refuse.
        if not worst <= gate.max_abs_error:
            return f"max abs error {worst:.3g} > gate {gate.max_abs_error:g}"
    return None


def winner(
    targets: list[TargetStatus], hardware_class: str, gate: RolloutGate | None
) -> tuple[TargetStatus | None, str]:
    """The fastest target of a class that passed validation and the gate, or None and why not.

    Only Succeeded targets whose validation passed are candidates: an unvalidated artifact never
    serves, whatever the gate says. Ties on p50 go to the name, so the choice is deterministic.
    """
    mine = [t for t in targets if t.hardware_class == hardware_class]
    if not mine:
        return None, f"no target for hardware class {hardware_class}"
    validated = [
        t
        for t in mine
        if t.phase == "Succeeded" and t.validation is not None and t.validation.passed and t.artifact
    ]
    if not validated:
        states = ", ".join(f"{t.name}: {t.reason or t.phase}" for t in mine)
        return None, f"no validated target for {hardware_class} ({states})"
    refusals = {t.name: _serving_refusal(t) or _gate_refusal(t, gate) for t in validated}
    allowed = [t for t in validated if refusals[t.name] is None]
    if not allowed:
        if len(validated) == 1:
            return None, str(refusals[validated[0].name])
        return None, "gate refused every validated target: " + "; ".join(
            f"{name}: {why}" for name, why in refusals.items()
        )
    best = min(allowed, key=lambda t: (_p50(t), t.name))
    p50 = "unknown" if math.isinf(_p50(best)) else f"{_p50(best):.3g} ms"
    speedup = "unknown" if best.speedup is None else f"{best.speedup:.3g}"
    return best, f"{best.name}: p50 {p50}, speedup {speedup}"


def device_winner(targets: list[TargetStatus], hardware_class: str) -> TargetStatus | None:
    """The fastest validated artifact of a class that is for devices (ExecuTorch), which no
    InferenceService serves: its class alias is the pointer devices fetch from."""
    mine = [
        t
        for t in targets
        if t.hardware_class == hardware_class
        and t.phase == "Succeeded"
        and t.validation is not None
        and t.validation.passed
        and t.artifact
        and t.backend in CATALOG
        and CATALOG[t.backend].for_devices
    ]
    return min(mine, key=lambda t: (_p50(t), t.name)) if mine else None


# -- the InferenceService ------------------------------------------------------------------------


def service_name(cm_name: str, prefix: str | None, hardware_class: str, classes_served: int) -> str:
    """`prefix` (default: the CompiledModel's name) as is for one class, else `<prefix>-<class>`."""
    base = prefix or cm_name
    name = base
    if classes_served > 1:
        name = re.sub(r"[^a-z0-9]+", "-", f"{base}-{hardware_class}".lower()).strip("-")
        if len(name) > NAME_MAX:
            # Truncation alone could make two classes collide: keep a digest of the full name.
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            name = f"{name[: NAME_MAX - 9].rstrip('-')}-{digest}"
    if not _ISVC_NAME.match(name) or len(name) > NAME_MAX:
        raise ValueError(
            f"InferenceService name {name!r} is not valid for KServe (a letter first, then lowercase "
            "letters, digits or '-', at most 63): set spec.rollout.inferenceService"
        )
    return name


def storage_uri(artifact_uri: str) -> str:
    """The Triton model repository root KServe serves: `<root>` of `<root>/<model>/1/model.plan`.

    Artifact URIs already name the root; a URI of a model file or config.pbtxt is walked back up.
    """
    uri = artifact_uri.rstrip("/")
    for pattern in (_MODEL_CONFIG, _MODEL_FILE):
        found = pattern.search(uri)
        if found:
            return uri[: found.start()]
    return uri


def model_format(backend: str) -> str:
    if backend not in MODEL_FORMATS:
        raise ValueError(
            f"backend {backend!r} has no Triton model format: serve {', '.join(sorted(MODEL_FORMATS))}"
        )
    return MODEL_FORMATS[backend]


def _resources(rt: ResolvedTarget) -> dict[str, Any]:
    res = copy.deepcopy(rt.resources)
    if rt.gpu:
        # A TensorRT plan needs the GPU it was built for: never schedule the server without one.
        res.setdefault("limits", {}).setdefault(GPU_RESOURCE, "1")
        res.setdefault("requests", {})[GPU_RESOURCE] = res["limits"][GPU_RESOURCE]
    return res


def inference_service(
    cm: CompiledModel,
    rt: ResolvedTarget,
    winner: TargetStatus,
    name: str,
    mode: str,
    canary_percent: int | None,
    owned: bool,
    service_account: str | None = None,
    *,
    stable_model: dict[str, Any] | None = None,
    runtime_version: str | None = None,
) -> dict[str, Any]:
    """The InferenceService serving `winner` on `rt`'s hardware class.

    `runtime_version` (TensorRT plans: the Triton release carrying the TensorRT that built them)
    becomes the model's runtimeVersion; None keeps the runtime's default image.

    `runtime` is always set: otherwise OpenVINO's runtime may claim modelFormat onnx. S3 credentials
    come from `service_account` (a ServiceAccount whose Secret carries KServe's s3 annotations).
    Canary: Serverless modes get predictor.canaryTrafficPercent; Standard modes get spec.canary
    (KServe >= 0.20; pass `stable_model` only where crd_supports_spec_canary) when `stable_model`,
    the model serving now, is given, since a canary needs a stable predictor beside it. In
    Serverless mode the class's nodeSelector, affinity and tolerations need Knative's
    kubernetes.podspec-* feature flags enabled.
    """
    if winner.artifact is None:
        raise ValueError(f"target {winner.name} has no artifact to serve")
    if owned and not cm.metadata.uid:
        raise ValueError("an owned InferenceService needs the CompiledModel's uid (create it first)")
    rollout = cm.spec.rollout or Rollout()
    model: dict[str, Any] = {
        "modelFormat": {"name": model_format(winner.backend)},
        "runtime": rollout.runtime,
        "storageUri": storage_uri(winner.artifact.uri),
        "resources": _resources(rt),
    }
    if runtime_version and winner.backend == "tensorrt":
        model["runtimeVersion"] = runtime_version
    predictor: dict[str, Any] = {"model": model}
    if rt.node_selector:
        predictor["nodeSelector"] = dict(rt.node_selector)
    if rt.affinity:
        predictor["affinity"] = copy.deepcopy(rt.affinity)
    if rt.tolerations:
        predictor["tolerations"] = copy.deepcopy(rt.tolerations)
    if rt.runtime_class:
        predictor["runtimeClassName"] = rt.runtime_class
    if service_account:
        predictor["serviceAccountName"] = service_account
    spec: dict[str, Any] = {"predictor": predictor}
    if canary_percent is not None and mode in SERVERLESS_MODES:
        predictor["canaryTrafficPercent"] = canary_percent
    elif canary_percent is not None and mode in STANDARD_MODES and stable_model is not None:
        spec["canary"] = [canary_entry(model, canary_percent)]
        predictor["model"] = copy.deepcopy(stable_model)
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            LABEL_NAME: cm.metadata.name,
            LABEL_TARGET: label_value(winner.name),
            LABEL_CLASS: label_value(rt.hardware_class),
            **MANAGED_BY,
        },
        "annotations": {MODE_ANNOTATION: mode, DIGEST_ANNOTATION: winner.artifact.digest},
    }
    if cm.metadata.namespace:
        meta["namespace"] = cm.metadata.namespace
    if owned:
        meta["ownerReferences"] = [owner_reference(cm)]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


# -- the deployment mode -------------------------------------------------------------------------


def cluster_mode(config_map: dict[str, Any] | None, requested: str | None) -> str:
    """The deployment mode new InferenceServices get: `requested`, else the cluster's default.

    It must be read, not assumed: canaryTrafficPercent only splits traffic in Serverless mode and is
    silently ignored in Standard/RawDeployment mode, so a wrong guess turns a canary into a full
    rollout without any error. The default lives in ConfigMap `inferenceservice-config` (KServe's
    namespace), key `deploy`, a JSON document with `defaultDeploymentMode`; without it, Serverless.
    """
    if requested:
        return requested
    raw = ((config_map or {}).get("data") or {}).get("deploy")
    if raw:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"ConfigMap inferenceservice-config: key deploy is not JSON ({err})") from None
        mode = parsed.get("defaultDeploymentMode") if isinstance(parsed, dict) else None
        if isinstance(mode, str) and mode:
            return mode
    return DEFAULT_MODE


def crd_supports_spec_canary(crd: dict[str, Any] | None) -> bool:
    """True when the installed InferenceService CRD has spec.canary (KServe >= 0.20)."""
    for version in ((crd or {}).get("spec") or {}).get("versions") or []:
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        if "canary" in schema.get("properties", {}).get("spec", {}).get("properties", {}):
            return True
    return False


# -- GitOps ------------------------------------------------------------------------------------------


def _for_gitops(manifest: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out.pop("status", None)
    # The GitOps agent owns what it applies; an ownerReference would let Kubernetes' garbage
    # collector delete what the agent keeps re-applying (and a local run has no uid to point at).
    out.get("metadata", {}).pop("ownerReferences", None)
    return out


def gitops_files(manifests: Sequence[dict[str, Any]]) -> dict[str, str]:
    """File name (`<InferenceService>.yaml`) -> YAML, for the directory mode."""
    files: dict[str, str] = {}
    for manifest in manifests:
        key = f"{manifest['metadata']['name']}.yaml"
        if key in files:
            raise ValueError(f"two InferenceServices are named {manifest['metadata']['name']!r}")
        files[key] = yaml.safe_dump(_for_gitops(manifest), sort_keys=False, default_flow_style=False)
    return files


def gitops_configmap(cm: CompiledModel, manifests: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    """A ConfigMap, owned by the CompiledModel, with one YAML key per InferenceService."""
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_NAME: cm.metadata.name, **MANAGED_BY}}
    if cm.metadata.namespace:
        meta["namespace"] = cm.metadata.namespace
    if cm.metadata.uid:
        meta["ownerReferences"] = [owner_reference(cm)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": gitops_files(manifests)}
