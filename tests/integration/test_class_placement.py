"""Where the real scheduler places a CPU class's pods: only on nodes classify() puts in that class.

node-feature-discovery labels each ISA a CPU has, so an AVX-512 VNNI node also says AVX2=true (and an
AMX node says AVX512VNNI=true). A
class's nodeSelector alone (AVX2=true) would let its compile Job land on the wider node: measured
and tuned on the wrong CPU, and compiled for the host's instructions by TVM and IREE.
"""

from __future__ import annotations

import json
from typing import Any

from devtools.devcluster import ControlPlane
from kompile.operator.fleet import HardwareClass, discover
from tests.integration.fleet import kwok_node, wait_for

NAMESPACE = "class-placement"
# Only this test's nodes carry it, so other tests' simulated nodes cannot take these pods.
OWN = {"kompile.test/placement": "true"}
CPUID = "feature.node.kubernetes.io/cpu-cpuid."
NODES = {
    "isa-avx2": {"kubernetes.io/arch": "amd64", f"{CPUID}AVX2": "true", **OWN},
    "isa-vnni": {
        "kubernetes.io/arch": "amd64",
        f"{CPUID}AVX2": "true",
        f"{CPUID}AVX512F": "true",
        f"{CPUID}AVX512VNNI": "true",
        **OWN,
    },
    # Sapphire Rapids: every label the VNNI node has and more; bf16 and int8 winners differ there.
    "isa-amx": {
        "kubernetes.io/arch": "amd64",
        **{f"{CPUID}{f}": "true" for f in ("AVX2", "AVX512F", "AVX512VNNI", "AVX512BF16", "AMXINT8")},
        **OWN,
    },
}
PODS_PER_CLASS = 4  # the scheduler spreads pods across the nodes that fit: one would be a coin toss


def _pod(name: str, cls: HardwareClass) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"class": cls.name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:stable", "command": ["true"]}],
            "nodeSelector": {**cls.node_selector, **OWN},
            "affinity": cls.affinity(),
        },
    }


def _placed(plane: ControlPlane) -> dict[str, str] | None:
    listing = plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json")
    pods = json.loads(listing.stdout)["items"]
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    return bound if len(bound) == len(NODES) * PODS_PER_CLASS and all(bound.values()) else None


def test_a_narrower_class_never_lands_on_a_wider_node(control_plane: ControlPlane) -> None:
    nodes = [kwok_node(name, labels) for name, labels in NODES.items()]
    classes = {c.name: c for c in discover(nodes)}
    assert set(classes) == {"cpu-amd64-avx2", "cpu-amd64-avx512vnni", "cpu-amd64-amx"}
    control_plane.kubectl("create", "namespace", NAMESPACE)
    try:
        for node in nodes:
            control_plane.kubectl("apply", "-f", "-", input=json.dumps(node))
        for name in NODES:
            control_plane.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")
        # Pods are refused until the controller-manager has made the namespace's service account.
        account = ("get", "serviceaccount", "default", "-n", NAMESPACE)
        wait_for(
            "the default service account",
            lambda: control_plane.kubectl(*account, check=False).returncode == 0,
        )
        for cls in classes.values():
            for i in range(PODS_PER_CLASS):
                pod = _pod(f"{cls.isa}-{i}", cls)
                control_plane.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(pod))
        bound = wait_for("every pod bound to a node", lambda: _placed(control_plane), timeout=90)
        expected = {"avx2": "isa-avx2", "avx512vnni": "isa-vnni", "amx": "isa-amx"}
        assert bound == {name: expected[name.rsplit("-", 1)[0]] for name in bound}
    finally:
        control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        control_plane.kubectl("delete", "node", *NODES, "--wait=false", check=False)
