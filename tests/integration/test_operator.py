"""The operator on the real control plane (apiserver, controller-manager, scheduler, kwok) with a
simulated fleet: Jobs per hardware class, real scheduling, a real compile on the stand-in node,
results into status, the cache, restarts, failures, generations, suspend and deletion.

Each test creates the CompiledModels it reads (under its own names) or takes them from a fixture,
so the tests pass alone and in any order; they share the operator, the fleet and the namespace.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from devtools.devcluster import ControlPlane
from kompile.api.cache import progress_uri
from kompile.api.candidates import backends_of
from kompile.api.job_contract import JobProgress, JobSpec
from kompile.artifact_store import read_bytes, write_bytes
from tests.integration.fleet import (
    CLASSES,
    LOCAL_NODE,
    KwokReporter,
    OperatorProcess,
    gpu_target,
    kwok_node,
    operator_fleet,
    small_cnn_manifest,
    succeed_and_publish,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.integration.kwok_stages import EXIT_CODE, MESSAGE, MISSING_IMAGE
from tests.support.kstatus import kstatus

ROOT = Path(__file__).resolve().parents[2]
NS = "kompile-it"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
TIMINGS: dict[str, float] = {}
FLAKY, FAILING_TARGET = "flaky", "gpu-nvidia-l4-sm89-fp32"
FAIL_TARGETS = {(FLAKY, FAILING_TARGET)}
"""(CompiledModel, target) pairs whose compile fails: only that model's target, whatever runs beside it."""


HELD = "held"
"""A CompiledModel whose KWOK compile pods stay Running until the test reports them."""


def decide(pod: dict[str, Any]) -> tuple[int, str] | None:
    """KWOK pods succeed with a plausible result unless their (model, target) is in FAIL_TARGETS;
    HELD's wait for the test."""
    labels = pod["metadata"].get("labels", {})
    target = labels.get("kompile.dev/target", "")
    if labels.get("kompile.dev/compiledmodel") == HELD:
        return None
    if (labels.get("kompile.dev/compiledmodel", ""), target) in FAIL_TARGETS:
        return 1, "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: out of memory"
    return succeed_and_publish(pod)


@pytest.fixture(scope="module")
def fleet(
    control_plane: ControlPlane, sim_fleet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("fleet")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom, batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})
    kubelet = sim_fleet
    reporter = KwokReporter(control_plane.kubeconfig, NS, decide).start()
    store = (work / "store").as_uri()
    # xla's compile image is one the registry lacks (kwok's pull stand-in): xla is in no `auto`, so
    # only a target naming it gets that image.
    env = {"KOMPILE_ENV_IMAGES": f"xla={MISSING_IMAGE}", "KOMPILE_PROGRESS_SWEEP_SECONDS": "2"}
    op = OperatorProcess(control_plane.kubeconfig, NS, store, work / "operator.log", env).start()
    try:
        yield {
            "core": core,
            "custom": custom,
            "batch": batch,
            "operator": op,
            "kubelet": kubelet,
            "store": work / "store",
            "plane": control_plane,
            "log": work / "operator.log",
        }
    finally:
        op.stop()
        reporter.stop()
        print(f"\noperator log: {work / 'operator.log'}\ntimings: {json.dumps(TIMINGS)}")


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A fleet-mode CompiledModel built with one CPU backend (operator_fleet);
    test_fleet_compiles_per_class_and_becomes_ready passes its own `fleet` and keeps `auto`."""
    return small_cnn_manifest(name, **{"fleet": operator_fleet(), **spec})


def get(f: dict[str, Any], name: str) -> dict[str, Any]:
    obj: dict[str, Any] = f["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return obj


def jobs_of(f: dict[str, Any], name: str) -> list[Any]:
    items: list[Any] = (
        f["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
    )
    return items


def ready(f: dict[str, Any], name: str) -> dict[str, Any] | None:
    obj = get(f, name)
    status = obj.get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions", [])}
    gen_ok = status.get("observedGeneration") == obj["metadata"]["generation"]
    settled = all(t["phase"] in ("Succeeded", "Failed", "Skipped") for t in status.get("targets", []))
    return obj if gen_ok and settled and conds.get("Ready", {}).get("status") in ("True", "False") else None


def create_settled(f: dict[str, Any], name: str, timeout: float = 300, **spec: Any) -> dict[str, Any]:
    """Create a fleet-mode CompiledModel and wait until every target has settled and Ready is decided."""
    f["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest(name, **spec))
    obj: dict[str, Any] = wait_for(f"{name} settled", lambda: ready(f, name), timeout=timeout)
    return obj


def ready_condition(obj: dict[str, Any]) -> dict[str, Any]:
    cond: dict[str, Any] = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    return cond


@pytest.fixture(scope="module")
def healthy(fleet: dict[str, Any]) -> str:
    """A CompiledModel all of whose targets compiled and validated (Ready True); tests only read it."""
    obj = create_settled(fleet, "healthy")
    assert ready_condition(obj)["status"] == "True", obj["status"]
    return "healthy"


@pytest.fixture(scope="module")
def flaky(fleet: dict[str, Any]) -> str:
    """A CompiledModel whose FAILING_TARGET fails to compile and the others succeed; tests only read it."""
    create_settled(fleet, FLAKY)
    return FLAKY


def test_fleet_compiles_per_class_and_becomes_ready(fleet: dict[str, Any]) -> None:
    began = time.monotonic()
    # Sized through spec.fleet.resources (kept by the CRD schema), merged over the defaults.
    sized = {"enabled": True, "precisions": ["fp32"], "resources": {"limits": {"memory": "12Gi"}}}
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, manifest("small", fleet=sized)
    )
    jobs = wait_for(
        "one Job per hardware class", lambda: (j := jobs_of(fleet, "small")) and len(j) == 5 and j
    )
    TIMINGS["apply_to_all_jobs_s"] = round(time.monotonic() - began, 2)

    by_class = {j.metadata.labels["kompile.dev/hardware-class"]: j for j in jobs}
    assert set(by_class) == set(CLASSES)
    gpu_job = by_class["gpu-nvidia-l4-sm89"].spec.template.spec
    assert gpu_job.containers[0].resources.limits == {"nvidia.com/gpu": "1", "memory": "12Gi"}
    assert by_class["cpu-amd64"].spec.template.spec.containers[0].resources.limits == {"memory": "12Gi"}
    assert any(t.key == "nvidia.com/gpu" for t in gpu_job.tolerations)
    assert gpu_job.node_selector["nvidia.com/gpu.compute.major"] == "8"
    assert all(j.metadata.owner_references[0].kind == "CompiledModel" for j in jobs)
    # arm64 edge class: pinned to arm64, told its arch, and its auto target offers executorch and
    # litert (read back through the Job contract as the compile Job reads it); amd64 classes do not.
    for cls, arch in (("cpu-arm64", "arm64"), ("cpu-amd64", "amd64")):
        pod = by_class[cls].spec.template.spec
        assert pod.node_selector["kubernetes.io/arch"] == arch
        spec = JobSpec.from_env({e.name: e.value for e in pod.containers[0].env})
        assert spec.arch == arch and spec.target.backend == "auto"
        offered = backends_of(spec.target, spec.device, spec.arch)
        assert {"executorch", "litert"} <= set(offered) if arch == "arm64" else "litert" not in offered
        assert ("executorch" in offered) == (arch == "arm64") and "onnxruntime" in offered

    def placed() -> dict[str, str] | None:
        pods = fleet["core"].list_namespaced_pod(NS, label_selector="kompile.dev/compiledmodel=small").items
        nodes = {
            p.metadata.labels["kompile.dev/hardware-class"]: p.spec.node_name
            for p in pods
            if p.spec.node_name
        }
        return nodes if len(nodes) == 5 else None

    for cls, node in wait_for("every pod scheduled", placed).items():
        assert node in CLASSES[cls], f"{cls} pod landed on {node}"

    obj = wait_for("Ready", lambda: ready(fleet, "small"), timeout=300)
    status = obj["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True", status
    assert status["targetsReady"] == "5/5" and status["observedGeneration"] == 1
    local = next(t for t in status["targets"] if t["hardwareClass"] == "cpu-amd64-avx2")
    assert local["node"] == LOCAL_NODE and local["validation"]["passed"] and local["speedup"] > 0
    repo = Path(local["artifact"]["uri"].removeprefix("file://"))
    assert (repo / "small" / "1" / "model.onnx").is_file() and (repo / "result.json").is_file()
    assert LOCAL_NODE in {t["node"] for t in status["targets"]}
    # Each class's `latest` pointer in the store names its winner (devices poll it).
    pointers = {p["hardwareClass"]: p for p in status["latest"]}
    assert pointers["cpu-amd64-avx2"]["target"] == local["name"]
    for p in pointers.values():
        doc = json.loads(Path(p["uri"].removeprefix("file://")).read_text())
        assert doc["digest"] == p["digest"] and doc["generation"] == 1 and doc["compiledModel"] == "small"
    assert pointers["cpu-amd64-avx2"]["uri"].endswith(f"/latest/{NS}/small/cpu-amd64-avx2.json")

    last_end = max(j.status.completion_time for j in jobs_of(fleet, "small") if j.status.completion_time)
    ready_at = next(c for c in status["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    from datetime import datetime

    TIMINGS["last_job_end_to_ready_s"] = (
        datetime.fromisoformat(ready_at.replace("Z", "+00:00")) - last_end
    ).total_seconds()
    table = fleet["plane"].kubectl("get", "cmodel", "-n", NS).stdout
    assert "READY" in table and "5/5" in table and "True" in table, table
    events = fleet["core"].list_namespaced_event(NS, field_selector="involvedObject.name=small").items
    assert {"JobCreated", "Validated"} <= {e.reason for e in events}
    with urllib.request.urlopen(fleet["operator"].metrics_url, timeout=5) as resp:
        assert b"kompile_reconciles_total" in resp.read()


def test_reapplying_uses_the_cache_and_deleting_removes_jobs(fleet: dict[str, Any]) -> None:
    obj = create_settled(fleet, "reapply")
    assert ready_condition(obj)["status"] == "True", obj["status"]
    assert jobs_of(fleet, "reapply")
    fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "reapply")
    wait_for(
        "Jobs garbage-collected with their CompiledModel", lambda: not jobs_of(fleet, "reapply"), timeout=120
    )
    obj = create_settled(fleet, "reapply", timeout=120)
    assert all(t["cached"] for t in obj["status"]["targets"]), obj["status"]
    assert not jobs_of(fleet, "reapply")


def test_operator_restart_midway_creates_no_duplicate(fleet: dict[str, Any]) -> None:
    op: OperatorProcess = fleet["operator"]
    fleet["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest("restart"))
    wait_for("Jobs created", lambda: len(jobs_of(fleet, "restart")) == 5)
    op.stop(hard=True)
    op.start()
    obj = wait_for("Ready after restart", lambda: ready(fleet, "restart"), timeout=300)
    assert {c["type"]: c["status"] for c in obj["status"]["conditions"]}["Ready"] == "True"
    names = [j.metadata.name for j in jobs_of(fleet, "restart")]
    assert len(names) == len(set(names)) == 5


def test_one_failing_target_leaves_the_others(fleet: dict[str, Any], flaky: str) -> None:
    obj = get(fleet, flaky)
    targets = {t["name"]: t for t in obj["status"]["targets"]}
    bad = targets[FAILING_TARGET]
    assert bad["phase"] == "Failed" and bad["reason"] == "BackoffLimitExceeded"
    assert "CUDA error: out of memory" in bad["message"]
    assert all(t["phase"] == "Succeeded" for n, t in targets.items() if n != bad["name"])
    ready_cond = ready_condition(obj)
    assert ready_cond["status"] == "False" and FAILING_TARGET in ready_cond["message"]


def test_new_generation_replaces_jobs_and_suspend_pauses(fleet: dict[str, Any]) -> None:
    custom = fleet["custom"]
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest("gen", suspend=True))
    obj = wait_for(
        "suspended status", lambda: (o := get(fleet, "gen")).get("status", {}).get("targets") and o
    )
    assert all(t["reason"] == "Suspended" for t in obj["status"]["targets"])
    time.sleep(3)
    assert not jobs_of(fleet, "gen")
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gen", {"spec": {"suspend": False}})
    wait_for("generation 2 Jobs", lambda: len(jobs_of(fleet, "gen")) == 5)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "gen", {"spec": {"validation": {"samples": 3}}}
    )
    wait_for(
        "only generation 3 Jobs remain",
        lambda: {j.metadata.labels["kompile.dev/generation"] for j in jobs_of(fleet, "gen")} == {"3"},
    )
    obj = wait_for("Ready at generation 3", lambda: ready(fleet, "gen"), timeout=300)
    assert obj["status"]["observedGeneration"] == 3


def test_argocd_health_on_documents_the_operator_wrote(
    fleet: dict[str, Any], healthy: str, flaky: str
) -> None:
    from tests.unit.test_health_lua import health

    assert health(get(fleet, healthy))[0] == "Healthy"
    status, message = health(get(fleet, flaky))
    assert status == "Degraded" and FAILING_TARGET in message
    fresh = manifest("fresh")
    fleet["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, fresh)
    assert health(get(fleet, "fresh"))[0] == "Progressing"
    # Its compile would go on beside the next tests on the one local core.
    fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fresh")


def test_a_new_hardware_class_joining_gets_its_compile(fleet: dict[str, Any]) -> None:
    obj = create_settled(fleet, "joiner")
    assert len(obj["status"]["targets"]) == len(CLASSES), obj["status"]
    fleet["core"].create_node(
        kwok_node(
            "a10-0",
            {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.product": "NVIDIA-A10",
                "nvidia.com/gpu.compute.major": "8",
                "nvidia.com/gpu.compute.minor": "6",
            },
        )
    )
    try:
        obj = wait_for(
            "the new class's target on an existing CompiledModel",
            lambda: (o := ready(fleet, "joiner")) and len(o["status"]["targets"]) == len(CLASSES) + 1 and o,
            timeout=120,
        )
        new = next(t for t in obj["status"]["targets"] if t["hardwareClass"] == "gpu-nvidia-a10-sm86")
        assert new["phase"] == "Succeeded" and new["node"] == "a10-0"
    finally:
        # The simulated fleet is shared by the session's tests: leave it as fleet.py declares it.
        fleet["core"].delete_node("a10-0")


def held_up(f: dict[str, Any], name: str, reason: str) -> dict[str, Any]:
    """The CompiledModel once its one target waits with `reason`; on a timeout, the error says what
    its status and pods showed instead."""

    def held() -> dict[str, Any] | None:
        obj = get(f, name)
        targets = (obj.get("status") or {}).get("targets") or []
        return obj if targets and targets[0].get("reason") == reason else None

    try:
        obj: dict[str, Any] = wait_for(f"{name} {reason}", held, timeout=120)
    except AssertionError as err:
        pods = f["core"].list_namespaced_pod(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
        seen = [(p.spec.node_name, p.status.phase, p.status.container_statuses) for p in pods]
        raise AssertionError(f"{err}; status {get(f, name).get('status')}; pods {seen}") from None
    return obj


def one_warning(f: dict[str, Any], name: str, reason: str) -> Any:
    """The one Warning Event of `reason` a hold-up posts (kubectl describe, alerts on events), not
    one per look: read after a few looks have passed."""
    time.sleep(5)
    events = f["core"].list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
    told = [e for e in events if e.reason == reason]
    assert len(told) == 1 and told[0].type == "Warning", [(e.reason, e.message) for e in events]
    assert (told[0].count or 1) == 1, told[0]
    return told[0]


def test_a_compile_pod_the_scheduler_cannot_place_says_what_it_lacks(fleet: dict[str, Any]) -> None:
    """A request no node can meet left the target "waiting for a node" until the Job's deadline:
    the real scheduler's verdict and the field to lower reach the target's status and Ready."""
    target = {
        "name": "huge",
        "backend": "onnxruntime",
        "hardware": {
            "nodeSelector": {"kubernetes.io/hostname": LOCAL_NODE},
            "resources": {"requests": {"memory": "900Gi"}, "limits": {"memory": "900Gi"}},
        },
    }
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest("huge", targets=[target])
    )
    try:
        obj = held_up(fleet, "huge", "Unschedulable")
        (status,) = obj["status"]["targets"]
        assert status["phase"] == "Pending" and "Insufficient memory" in status["message"], status
        assert "spec.targets[0].hardware.resources.requests" in status["message"]
        assert ready_condition(obj)["message"] == "compile in progress; waiting: huge: Unschedulable"
        # Flux (kstatus) waits on it, and says why.
        assert kstatus(obj) == ("InProgress", "compile in progress; waiting: huge: Unschedulable")
        assert "Insufficient memory" in one_warning(fleet, "huge", "Unschedulable").message
    finally:
        fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "huge")


def test_a_target_whose_labels_no_node_has_says_to_check_the_selector(fleet: dict[str, Any]) -> None:
    """A nodeSelector no node matches (a typo) was told to lower its resource requests: the real
    scheduler's verdict ("didn't match Pod's node affinity/selector") now names the selector."""
    target = {"name": "typo", "backend": "onnxruntime", "hardware": {"nodeSelector": {"pool": "edge-tpyo"}}}
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest("typo", targets=[target])
    )
    try:
        (status,) = held_up(fleet, "typo", "Unschedulable")["status"]["targets"]
        message = status["message"]
        assert "didn't match Pod's node affinity/selector" in message, message
        assert "spec.targets[0].hardware.nodeSelector (pool=edge-tpyo)" in message, message
        assert "requests" not in message, message
    finally:
        fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "typo")


def test_a_compile_image_the_node_cannot_pull_says_which_and_where_it_is_set(fleet: dict[str, Any]) -> None:
    """A compile image the registry lacks kept the target "waiting" until the Job's deadline: the
    kubelet's ImagePullBackOff (kwok's stand-in) reaches the target's status with the image and the
    setting that chose it, Ready and Flux say what it waits on, one Warning tells it."""
    # On the kwok edge nodes (arm64): the local node's kubelet stand-in pulls no image.
    target = {
        "name": "xla",
        "backend": "xla",
        "hardware": {"nodeSelector": {"kubernetes.io/arch": "arm64"}},
    }
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest("pull", targets=[target])
    )
    try:
        obj = held_up(fleet, "pull", "ImagePullBackOff")
        (status,) = obj["status"]["targets"]
        assert status["phase"] == "Pending" and status["node"].startswith("edge-"), status
        assert f"{MISSING_IMAGE} (set by KOMPILE_ENV_IMAGES (xla))" in status["message"], status
        assert ready_condition(obj)["message"] == "compile in progress; waiting: xla: ImagePullBackOff"
        assert kstatus(obj) == ("InProgress", "compile in progress; waiting: xla: ImagePullBackOff")
        assert MISSING_IMAGE in one_warning(fleet, "pull", "ImagePullBackOff").message
    finally:
        fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "pull")


def test_a_running_target_shows_what_its_job_last_told(fleet: dict[str, Any]) -> None:
    """A running compile Job writes its latest progress line to the store (progress_uri beside its
    cache entry); the operator shows it in the target's message at its next look, not only
    "compile Job running" until the Job ends. The KWOK pod is held Running; the test writes the
    line the Job would."""
    target = gpu_target("gpu", "NVIDIA-H100-80GB-HBM3")
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest(HELD, targets=[target])
    )
    try:

        def running() -> dict[str, Any] | None:
            targets = (get(fleet, HELD).get("status") or {}).get("targets") or []
            return targets[0] if targets and targets[0]["phase"] == "Running" else None

        wait_for("held target running", running, timeout=120)
        (job,) = jobs_of(fleet, HELD)
        prefix = job.metadata.annotations["kompile.dev/artifact-prefix"]
        line = "[gpu/tensorrt] compiling with tensorrt 10.13 at fp16"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        told = JobProgress(line=line, at=now, started=now)
        write_bytes(progress_uri(prefix), told.dumps().encode())

        def shown() -> str | None:
            status = running()
            return status["message"] if status and line in (status.get("message") or "") else None

        message = wait_for("progress in status", shown, timeout=120)
        assert message.startswith("compile Job running: " + line + " ("), message

        # SIGKILLed (a node's OOM killer, a drain past its grace): the Job never removes its note,
        # so the operator does once the Job has ended; the store keeps no stale progress.
        (pod,) = fleet["core"].list_namespaced_pod(NS, label_selector=f"job-name={job.metadata.name}").items
        killed = {"metadata": {"annotations": {EXIT_CODE: "137", MESSAGE: ""}}}
        fleet["core"].patch_namespaced_pod(pod.metadata.name, NS, killed)
        failed = wait_for("held target failed", lambda: (ready(fleet, HELD) or {}).get("status"), timeout=120)
        assert failed["targets"][0]["phase"] == "Failed", failed["targets"]
        assert read_bytes(progress_uri(prefix)) is None
    finally:
        fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, HELD)


def test_a_progress_note_no_job_writes_any_more_is_swept(fleet: dict[str, Any]) -> None:
    """A Job killed outright whose CompiledModel was deleted before the operator saw it end leaves
    its progress note. No Job outlives its deadline: a note untouched for twice that is removed at a
    reconcile in its namespace (every KOMPILE_PROGRESS_SWEEP_SECONDS: 2 s here); a fresh one stays."""
    folder = fleet["store"] / "cache" / NS / "progress"
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    note = JobProgress(line="[cpu/openvino] compiling", at=now, started=now).dumps()
    stale, fresh = folder / "left-by-a-killed-job.json", folder / "still-written.json"
    stale.write_text(note)
    fresh.write_text(note)
    three_days_ago = time.time() - 3 * 86400
    os.utime(stale, (three_days_ago, three_days_ago))
    target = {"name": "t", "backend": "onnxruntime", "hardware": {"nodeSelector": {"pool": "none"}}}
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest("sweeper", targets=[target])
    )
    try:
        wait_for("stale note swept", lambda: not stale.exists(), timeout=60)
        assert fresh.exists()
    finally:
        fleet["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "sweeper")
        fresh.unlink(missing_ok=True)


def test_a_compile_job_out_of_memory_says_which_limit_to_raise(fleet: dict[str, Any]) -> None:
    """The container's memory limit held (the kubelet stand-in kills the process tree past it, as the
    cgroup would): the Job fails at once (a retry at the same limit would only be killed again) and
    the target says OutOfMemory, with the limit it hit and the field that raises it, not a bare exit
    code 137."""
    target = {
        "name": "tight",
        "backend": "onnxruntime",
        "hardware": {
            "nodeSelector": {"kubernetes.io/hostname": LOCAL_NODE},
            "resources": {"limits": {"memory": "200Mi"}},
        },
    }
    fleet["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest("tight", targets=[target])
    )
    obj = wait_for("tight settled", lambda: ready(fleet, "tight"), timeout=300)
    (status,) = obj["status"]["targets"]
    assert status["phase"] == "Failed" and status["reason"] == "OutOfMemory", status
    assert (
        "200Mi" in status["message"]
        and "spec.targets[0].hardware.resources.limits.memory" in status["message"]
    )
    # The default 4Gi request was lowered to the limit given, so the pod was valid and scheduled.
    (job,) = jobs_of(fleet, "tight")
    assert job.spec.template.spec.containers[0].resources.requests["memory"] == "200Mi"
    # The podFailurePolicy failed the Job on the first kill: one pod, not backoffLimit + 1.
    assert job.status.failed == 1, job.status
    # Flux (kstatus) fails its wait at once, with the reason, rather than timing out on InProgress.
    flux, message = kstatus(obj)
    assert flux == "Failed" and "OutOfMemory" in message, (flux, message)
