"""Resolve a CompiledModel's targets against the fleet: explicit targets keep their own selectors,
fleet mode gets one target per (hardware class, precision). Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils import parse_quantity

from kompile.api.candidates import needs_gpu
from kompile.api.spec import CompiledModelSpec, Target
from kompile.api.spec_targets import Resources
from kompile.api.vocabulary import TargetPrecision
from kompile.operator.fleet import ARCH, GPU_PRODUCT, GPU_RESOURCE, HardwareClass

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class ResolvedTarget:
    """A target with everything its compile Job needs to land on the right hardware."""

    target: Target
    hardware_class: str
    gpu: bool
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)
    runtime_class: str | None = None
    arch: str | None = None
    """kubernetes.io/arch of its nodes where known (decides auto's candidates); None: any."""
    resources_field: str = ""
    """Where the user sizes this target's Job (spec.fleet.resources, spec.targets[i].hardware.resources)."""
    hardware_field: str = ""
    """Where the user places this target (spec.targets[i].hardware); empty for a fleet target,
    placed by its hardware class."""

    @property
    def name(self) -> str:
        return self.target.name


def _class_for(selector: dict[str, str], classes: Sequence[HardwareClass]) -> HardwareClass | None:
    for cls in classes:
        own = dict(cls.node_selector)
        if all(own.get(k) == v or (k == GPU_PRODUCT and v in cls.products) for k, v in selector.items()):
            return cls
    return None


def _default_resources(gpu: bool) -> dict[str, Any]:
    base: dict[str, Any] = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
    if gpu:
        base["limits"][GPU_RESOURCE] = "1"
        base["requests"][GPU_RESOURCE] = "1"
    return base


def _resources(gpu: bool, given: Resources | None) -> dict[str, Any]:
    """The user's resources merged over the defaults, key by key: a target that sets only a memory
    limit keeps its GPU. A default never contradicts what was given: a default request above a
    given limit drops to it, a default limit below a given request rises to it, and an extended
    resource (a GPU) has its request equal to its limit, as Kubernetes requires."""
    base = _default_resources(gpu)
    if given is None:
        return base
    asked, capped = dict(given.requests or {}), dict(given.limits or {})
    requests, limits = {**base["requests"], **asked}, {**base["limits"], **capped}
    for name, limit in capped.items():
        if name not in asked and name in requests and _above(requests[name], limit, name):
            requests[name] = limit
    for name, request in asked.items():
        if name not in capped and name in limits and _above(request, limits[name], name):
            limits[name] = request
    return {"requests": requests, "limits": limits}


def _above(a: int | str, b: int | str, name: str) -> bool:
    """Whether quantity a exceeds b (any difference, for a resource that must match exactly)."""
    if "/" in name:  # extended resources (nvidia.com/gpu): request == limit
        return str(a) != str(b)
    try:
        return bool(parse_quantity(a) > parse_quantity(b))
    except ValueError:  # the API server names a malformed quantity itself
        return False


def _explicit(
    index: int, target: Target, classes: Sequence[HardwareClass], gpu_runtime: str | None
) -> ResolvedTarget:
    hw = target.hardware
    selector = dict(hw.node_selector or {}) if hw else {}
    cls = _class_for(selector, classes) if selector else None
    # A selector that lands on a GPU class makes an auto target a GPU target too.
    gpu = needs_gpu(target) or (cls is not None and cls.kind == "gpu")
    tolerations = [t.to_wire() for t in (hw.tolerations or [])] if hw else []
    if gpu and not tolerations:
        tolerations = [GPU_TOLERATION]
    resources = _resources(gpu, hw.resources if hw else None)
    return ResolvedTarget(
        target=target,
        hardware_class=cls.name if cls else (f"selector-{target.name}" if selector else "any"),
        gpu=gpu,
        node_selector=selector,
        affinity=None,
        tolerations=tolerations,
        resources=resources,
        runtime_class=(
            hw.runtime_class_name if hw and hw.runtime_class_name else (gpu_runtime if gpu else None)
        ),
        # Only what the user's selector pins: a class found by a looser selector may share it.
        arch=selector.get(ARCH),
        resources_field=f"spec.targets[{index}].hardware.resources",
        hardware_field=f"spec.targets[{index}].hardware",
    )


def _fleet_target(
    cls: HardwareClass, spec: CompiledModelSpec, precision: TargetPrecision, gpu_runtime: str | None
) -> ResolvedTarget:
    fleet = spec.fleet
    assert fleet is not None
    gpu = cls.kind == "gpu"
    target = Target(
        name=f"{cls.name}-{precision}"[:63].rstrip("-"),
        backend=fleet.gpu_backend if gpu else fleet.cpu_backend,
        precision=precision,
        selection=fleet.selection,
    )
    return ResolvedTarget(
        target=target,
        hardware_class=cls.name,
        gpu=gpu,
        node_selector=dict(cls.node_selector),
        affinity=cls.affinity(),
        tolerations=[GPU_TOLERATION] if gpu else [],
        resources=_resources(gpu, fleet.resources),
        runtime_class=gpu_runtime if gpu else None,
        arch=cls.arch,
        resources_field="spec.fleet.resources",
    )


def resolve_targets(
    spec: CompiledModelSpec, classes: Sequence[HardwareClass], gpu_runtime: str | None = None
) -> list[ResolvedTarget]:
    """Explicit targets first, then fleet targets (explicit names win on a clash)."""
    out = [_explicit(i, t, classes, gpu_runtime) for i, t in enumerate(spec.targets or [])]
    names = {r.name for r in out}
    if spec.fleet and spec.fleet.enabled:
        for cls in classes:
            for precision in spec.fleet.precisions:
                r = _fleet_target(cls, spec, precision, gpu_runtime)
                if r.name not in names:
                    out.append(r)
                    names.add(r.name)
    return out
