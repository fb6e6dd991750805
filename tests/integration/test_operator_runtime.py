"""How the operator runs, on the real control plane: one active replica by a Lease (a standby takes
over when the leader is killed), no Kopf finalizer (a CompiledModel deleted while the operator is
down goes at once; one carrying an older operator's finalizer has it removed), and a settled
CompiledModel looked at no more.

Its own namespace and operators (the session's simulated fleet is shared): nothing here waits on
the other modules' operators, nor they on these Leases.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from devtools.devcluster import ControlPlane
from tests.integration.fleet import (
    CLASSES,
    KwokReporter,
    OperatorProcess,
    operator_fleet,
    small_cnn_manifest,
    succeed_and_publish,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn

NS = "kompile-runtime"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
LEASE = "kompile"  # the default name
LEASE_SECONDS = 6
OLD_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # Kopf's default, as an older operator left it


@pytest.fixture(scope="module")
def rt(
    control_plane: ControlPlane, sim_fleet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("runtime")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})
    reporter = KwokReporter(control_plane.kubeconfig, NS, succeed_and_publish).start()
    try:
        yield {
            "plane": control_plane,
            "custom": client.CustomObjectsApi(api),
            "batch": client.BatchV1Api(api),
            "coordination": client.CoordinationV1Api(api),
            "work": work,
        }
    finally:
        reporter.stop()


@pytest.fixture
def operator(rt: dict[str, Any]) -> Iterator[Callable[[str], OperatorProcess]]:
    """Starts operators for one test (a short Lease); each is stopped at the test's end, so the
    next test's first operator finds the Lease handed back."""
    started: list[OperatorProcess] = []

    def start(name: str) -> OperatorProcess:
        env = {"KOMPILE_LEASE_DURATION_SECONDS": str(LEASE_SECONDS)}
        store = (rt["work"] / "store").as_uri()
        op = OperatorProcess(rt["plane"].kubeconfig, NS, store, rt["work"] / f"{name}.log", env)
        started.append(op.start())
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    doc = small_cnn_manifest(name, NS, fleet=operator_fleet())
    doc["metadata"].update(extra)
    return doc


def get(rt: dict[str, Any], name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = rt["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return obj


def jobs_of(rt: dict[str, Any], name: str) -> list[Any]:
    items: list[Any] = (
        rt["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
    )
    return items


def ready(rt: dict[str, Any], name: str) -> dict[str, Any] | None:
    obj = get(rt, name)
    status = (obj or {}).get("status") or {}
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    targets = status.get("targets") or []
    settled = targets and all(t["phase"] in ("Succeeded", "Failed") for t in targets)
    return obj if settled and conds.get("Ready") == "True" else None


def holder(rt: dict[str, Any]) -> str | None:
    try:
        lease = rt["coordination"].read_namespaced_lease(LEASE, NS)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec else None


def pid_of(op: OperatorProcess) -> int:
    assert op.proc is not None and op.proc._proc is not None
    return op.proc._proc.pid


def reconciles(op: OperatorProcess) -> float:
    with urllib.request.urlopen(op.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(r"^kompile_reconciles_total ([0-9.e+]+)$", text, re.M)
    assert match, text[:2000]
    return float(match.group(1))


def test_one_leader_acts_and_a_standby_takes_over_when_it_is_killed(
    rt: dict[str, Any], operator: Callable[[str], OperatorProcess]
) -> None:
    leader = operator("leader")
    wait_for(
        "the first operator to hold the Lease", lambda: (h := holder(rt)) and h.endswith(f"_{pid_of(leader)}")
    )
    standby = operator("standby")
    standby_log: Path = standby.log_path
    wait_for("the standby to say it waits", lambda: "standby: Lease" in standby_log.read_text(), timeout=60)

    rt["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest("led"))
    wait_for("one Job per class", lambda: len(jobs_of(rt, "led")) == len(CLASSES), timeout=120)
    log = standby_log.read_text()
    assert "hardware classes now" not in log, log[-2000:]  # its controller never started
    assert holder(rt) is not None and holder(rt).endswith(f"_{pid_of(leader)}")  # type: ignore[union-attr]

    standby_pid = pid_of(standby)
    killed = time.monotonic()
    leader.stop(hard=True)
    wait_for(
        "the standby to take the Lease",
        lambda: (h := holder(rt)) and h.endswith(f"_{standby_pid}"),
        timeout=LEASE_SECONDS * 4,
        interval=0.2,
    )
    took_over = time.monotonic() - killed
    # Free once unrenewed for LEASE_SECONDS on the standby's clock, plus one poll (LEASE_SECONDS / 5).
    assert took_over < LEASE_SECONDS * 1.2 + 3, took_over
    obj = wait_for("Ready under the new leader", lambda: ready(rt, "led"), timeout=240)
    names = [j.metadata.name for j in jobs_of(rt, "led")]
    assert len(names) == len(set(names)) == len(CLASSES), names
    assert len(obj["status"]["targets"]) == len(CLASSES)
    assert "leader: holding Lease" in standby_log.read_text()


def test_a_settled_model_is_not_looked_at_again(
    rt: dict[str, Any], operator: Callable[[str], OperatorProcess]
) -> None:
    """KOMPILE_RESYNC_SECONDS is 2 here: a timer would have reconciled it several times."""
    op = operator("settled")
    rt["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest("quiet"))
    wait_for("Ready", lambda: ready(rt, "quiet"), timeout=240)
    wait_for("the operator serving metrics", lambda: _answers(op))
    # The last Job events may still be on their way: wait until the count stops moving.
    before = wait_for("reconciles to stop", lambda: _steady(op), timeout=60)
    resource_version = get(rt, "quiet")["metadata"]["resourceVersion"]  # type: ignore[index]
    time.sleep(8)
    assert reconciles(op) == before
    assert get(rt, "quiet")["metadata"]["resourceVersion"] == resource_version  # type: ignore[index]


def _steady(op: OperatorProcess) -> float | None:
    first = reconciles(op)
    time.sleep(2)
    return first if reconciles(op) == first else None


def _answers(op: OperatorProcess) -> bool:
    try:
        reconciles(op)
    except OSError:
        return False
    return True


def test_deleted_while_the_operator_is_down_goes_at_once(
    rt: dict[str, Any], operator: Callable[[str], OperatorProcess]
) -> None:
    op = operator("deleter")
    rt["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest("gone"))
    wait_for("Jobs", lambda: len(jobs_of(rt, "gone")) == len(CLASSES), timeout=120)
    assert not get(rt, "gone")["metadata"].get("finalizers")  # type: ignore[index]
    op.stop()
    rt["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gone")
    wait_for("the CompiledModel gone", lambda: get(rt, "gone") is None, timeout=10)
    # The controller-manager's garbage collector removes what it owned.
    wait_for("its Jobs garbage-collected", lambda: not jobs_of(rt, "gone"), timeout=120)


def test_an_older_operators_finalizer_is_removed_on_resume(
    rt: dict[str, Any], operator: Callable[[str], OperatorProcess]
) -> None:
    rt["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, manifest("legacy", finalizers=[OLD_FINALIZER])
    )
    operator("resumer")
    wait_for("Kopf's finalizer removed", lambda: not (get(rt, "legacy") or {})["metadata"].get("finalizers"))
    rt["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "legacy")
    wait_for("deleted without waiting", lambda: get(rt, "legacy") is None, timeout=10)
