"""Fleet discovery: group Nodes into hardware classes from their labels. Pure functions.

A TensorRT plan only runs on the compute capability it was built for, and ONNX Runtime's saved
layouts and int8 kernels depend on the CPU's vector ISA, so a class is (architecture, GPU product,
compute capability) for GPU nodes and (architecture, ISA where node-feature-discovery labels it)
for CPU nodes. A class carries the scheduling constraints that pin a compile Job to it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ARCH = "kubernetes.io/arch"
GPU_PRODUCT = "nvidia.com/gpu.product"
CC_MAJOR = "nvidia.com/gpu.compute.major"
CC_MINOR = "nvidia.com/gpu.compute.minor"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_RESOURCE = "nvidia.com/gpu"
# node-feature-discovery's CPUID labels, widest first: the first one a node has names its ISA.
NFD_ISA = [
    ("feature.node.kubernetes.io/cpu-cpuid.AMXINT8", "amx"),
    ("feature.node.kubernetes.io/cpu-cpuid.AVX512BF16", "avx512bf16"),
    ("feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI", "avx512vnni"),
    ("feature.node.kubernetes.io/cpu-cpuid.AVX512F", "avx512"),
    ("feature.node.kubernetes.io/cpu-cpuid.AVXVNNI", "avxvnni"),
    ("feature.node.kubernetes.io/cpu-cpuid.AVX2", "avx2"),
    ("feature.node.kubernetes.io/cpu-cpuid.ASIMDDP", "dotprod"),
]


@dataclass(frozen=True)
class HardwareClass:
    """One class of interchangeable nodes, and how to pin a pod to it."""

    name: str
    kind: str
    """gpu or cpu"""
    arch: str
    product: str | None = None
    compute_capability: str | None = None
    isa: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    products: tuple[str, ...] = ()
    """Every product label value in the class (time-sliced -SHARED variants join their base)."""
    nodes: tuple[str, ...] = ()

    def affinity(self) -> dict[str, Any]:
        """Required node affinity beyond the nodeSelector: product variants, CPU classes off GPU nodes
        and off the nodes of a wider ISA. A node of a wider ISA carries the narrower ISA's label too
        (an AVX-512 VNNI node says AVX2=true): an AVX2 class's Job placed there would measure and
        tune on the wrong CPU, and a compiler that targets the host (TVM, IREE) would emit
        instructions the class's own nodes do not have."""
        exprs: list[dict[str, Any]] = []
        if self.kind == "gpu":
            exprs.append({"key": GPU_PRODUCT, "operator": "In", "values": sorted(self.products)})
        else:
            exprs.append({"key": GPU_PRODUCT, "operator": "DoesNotExist"})
            # The labels classify() reads before this class's own: a node with one is another class.
            wider = [label for label, isa in itertools.takewhile(lambda e: e[1] != self.isa, NFD_ISA)]
            exprs += [{"key": label, "operator": "NotIn", "values": ["true"]} for label in wider]
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": exprs}]
                }
            }
        }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def base_product(product: str) -> str:
    """Time-slicing adds -SHARED to the product label; the silicon is the same."""
    return product.removesuffix("-SHARED")


def classify(labels: Mapping[str, str]) -> tuple[str, dict[str, str], dict[str, str | None]]:
    """(class name, nodeSelector, facts) for one node's labels."""
    arch = labels.get(ARCH, "amd64")
    product = labels.get(GPU_PRODUCT)
    if product:
        major, minor = labels.get(CC_MAJOR), labels.get(CC_MINOR)
        cc = f"{major}.{minor}" if major and minor else None
        name = f"gpu-{_slug(base_product(product))}" + (f"-sm{major}{minor}" if cc else "")
        selector = {ARCH: arch}
        if cc:
            selector |= {CC_MAJOR: str(major), CC_MINOR: str(minor)}
        return (
            name,
            selector,
            {"kind": "gpu", "arch": arch, "product": base_product(product), "cc": cc, "isa": None},
        )
    isa = next((value for label, value in NFD_ISA if labels.get(label) == "true"), None)
    selector = {ARCH: arch}
    name = f"cpu-{arch}"
    if isa:
        label = next(label for label, value in NFD_ISA if value == isa)
        selector[label] = "true"
        name += f"-{isa}"
    return name, selector, {"kind": "cpu", "arch": arch, "product": None, "cc": None, "isa": isa}


def _schedulable(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec") or {}
    return not spec.get("unschedulable", False)


def discover(nodes: Iterable[Mapping[str, Any]]) -> list[HardwareClass]:
    """The hardware classes present among schedulable nodes, sorted by name."""
    found: dict[str, dict[str, Any]] = {}
    for node in nodes:
        if not _schedulable(node):
            continue
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        name, selector, facts = classify(labels)
        entry = found.setdefault(name, {"selector": selector, "facts": facts, "products": set(), "nodes": []})
        if labels.get(GPU_PRODUCT):
            entry["products"].add(labels[GPU_PRODUCT])
        entry["nodes"].append(meta.get("name", ""))
    return [
        HardwareClass(
            name=name,
            kind=e["facts"]["kind"],
            arch=e["facts"]["arch"],
            product=e["facts"]["product"],
            compute_capability=e["facts"]["cc"],
            isa=e["facts"]["isa"],
            node_selector=e["selector"],
            products=tuple(sorted(e["products"])),
            nodes=tuple(sorted(e["nodes"])),
        )
        for name, e in sorted(found.items())
    ]
