"""Resolve a CompiledModel's targets against the fleet: explicit targets keep their own selectors,
fleet mode gets one target per (hardware class, precision). Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kompile.api.candidates import needs_gpu
from kompile.api.spec import CompiledModelSpec, Target
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


def _explicit(target: Target, classes: Sequence[HardwareClass], gpu_runtime: str | None) -> ResolvedTarget:
    hw = target.hardware
    selector = dict(hw.node_selector or {}) if hw else {}
    cls = _class_for(selector, classes) if selector else None
    # A selector that lands on a GPU class makes an auto target a GPU target too.
    gpu = needs_gpu(target) or (cls is not None and cls.kind == "gpu")
    tolerations = [t.to_wire() for t in (hw.tolerations or [])] if hw else []
    if gpu and not tolerations:
        tolerations = [GPU_TOLERATION]
    resources = _default_resources(gpu)
    if hw and hw.resources:
        resources = hw.resources.to_wire()
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
        resources=_default_resources(gpu),
        runtime_class=gpu_runtime if gpu else None,
        arch=cls.arch,
    )


def resolve_targets(
    spec: CompiledModelSpec, classes: Sequence[HardwareClass], gpu_runtime: str | None = None
) -> list[ResolvedTarget]:
    """Explicit targets first, then fleet targets (explicit names win on a clash)."""
    out = [_explicit(t, classes, gpu_runtime) for t in spec.targets or []]
    names = {r.name for r in out}
    if spec.fleet and spec.fleet.enabled:
        for cls in classes:
            for precision in spec.fleet.precisions:
                r = _fleet_target(cls, spec, precision, gpu_runtime)
                if r.name not in names:
                    out.append(r)
                    names.add(r.name)
    return out
