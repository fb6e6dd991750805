"""Integration tests run against a real control plane (devtools.devcluster), one per test session.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok start on loopback from the
binaries of scripts/build-control-plane.sh (KOMPILE_K8S_BIN points at them; otherwise the script
runs, which takes 10-25 minutes the first time). The repository's CRDs are installed when present.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from devtools.devcluster import ControlPlane, find_bin_dir
from tests.integration.fleet import FLEET, LOCAL_LABELS, LOCAL_NODE, kwok_node
from tests.integration.kubelet_standin import KubeletStandIn
from tests.integration.kwok_stages import write_stages
from tests.support.fixtures import report_line

HERE = Path(__file__).resolve().parent
CRDS_DIR = HERE.parent.parent / "crds"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item, not only this directory's: mark ours alone.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A started control plane with controllers, kwok and the CRDs; `.kubectl(...)` talks to it."""
    work_dir = tmp_path_factory.mktemp("control-plane")
    bin_dir = find_bin_dir()
    # kwok's defaults, with kompile's compile pods reporting what the operator tests decide.
    stages = write_stages(bin_dir.parent / "etc" / "kwok-stages.yaml", work_dir / "kwok-stages.yaml")
    plane = ControlPlane(bin_dir, work_dir, controllers=True, kwok=True, kwok_config=stages)
    began = time.monotonic()
    plane.start()  # on failure it stops what it started and raises with the server log's tail
    try:
        if CRDS_DIR.is_dir() and any(CRDS_DIR.glob("*.y*ml")):
            plane.apply_crds(CRDS_DIR)
        steps = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in plane.timings.items())
        report_line(request.config, f"\ncontrol plane up in {time.monotonic() - began:.1f}s ({steps})")
        yield plane
    finally:
        plane.stop()
        _finish(request, work_dir, plane)


def _finish(request: pytest.FixtureRequest, work_dir: Path, plane: ControlPlane) -> None:
    """Keep the logs (and etcd data) when a test failed; remove them otherwise."""
    if request.session.testsfailed:
        report_line(request.config, f"\ncontrol plane logs kept in {plane.log_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def sim_fleet(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletStandIn]:
    """The simulated fleet (KWOK nodes of several hardware classes) and the one node whose pods the
    kubelet stand-in runs as local processes. Nodes are cluster-wide: one fleet per session."""
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core = client.CoreV1Api(api)
    for name, labels in FLEET.items():
        core.create_node(kwok_node(name, labels))
    kubelet = KubeletStandIn(
        control_plane.kubeconfig,
        LOCAL_NODE,
        LOCAL_LABELS,
        tmp_path_factory.mktemp("kubelet"),
        HERE.parent.parent / "examples",
    ).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
