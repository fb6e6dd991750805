"""Smoke test of the test control plane: API server, controller-manager, scheduler and kwok together."""

from __future__ import annotations

import json
from typing import Any

from devtools.devcluster import KWOK_NODE_SELECTOR, ControlPlane

NODE = "kwok-smoke-node"
NAMESPACE = "smoke"


def _apply(plane: ControlPlane, manifest: dict[str, Any], *args: str) -> None:
    plane.kubectl("apply", *args, "-f", "-", input=json.dumps(manifest))


def _fake_node(name: str) -> dict[str, Any]:
    """A Node that kwok simulates (the annotation opts it in), with room for a few pods."""
    key, value = KWOK_NODE_SELECTOR.split("=")
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def _job(name: str) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox:stable", "command": ["true"]}
    # Pinned to this test's node: other tests' simulated nodes may be up in the same control plane.
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                }
            },
        },
    }


def test_api_server_answers_kubectl_version(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]


def test_namespace_can_be_created(control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "namespace", NAMESPACE)
    phase = control_plane.kubectl("get", "namespace", NAMESPACE, "-o", "jsonpath={.status.phase}")
    assert phase.stdout == "Active"


def test_job_completes_on_kwok_node(control_plane: ControlPlane) -> None:
    namespace = f"{NAMESPACE}-job"
    control_plane.kubectl("create", "namespace", namespace)
    _apply(control_plane, _fake_node(NODE))
    control_plane.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=60s")

    _apply(control_plane, _job("hello"), "-n", namespace)
    # Scheduler binds the pod to the fake node, kwok's Stages run it and mark it Succeeded, and the
    # Job controller in kube-controller-manager completes the Job.
    control_plane.kubectl(
        "wait", "-n", namespace, "--for=condition=Complete", "job/hello", "--timeout=90s", timeout=120
    )
    listing = control_plane.kubectl("get", "pods", "-n", namespace, "-l", "job-name=hello", "-o", "json")
    pods = json.loads(listing.stdout)["items"]
    assert pods, "the Job created no pod"
    assert {pod["spec"]["nodeName"] for pod in pods} == {NODE}
    assert {pod["status"]["phase"] for pod in pods} == {"Succeeded"}
