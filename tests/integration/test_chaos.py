"""The operator killed while it works: many CompiledModels x 5 hardware classes on the real control
plane (KWOK fleet), a real MLflow server and a real S3 server, while the operator is killed at the
three worst moments (the env-gated crash points: right after a Job create, right after MLflow
registration, right before the status patch) and then SIGKILLed at random moments.

Invariants, checked from the servers themselves: one Job per (uid, generation, target) ever created
(a watch sees every Job); every CompiledModel Ready; one parent run per generation and one model
version per target (searched by tags); the per-class aliases equal the winners; every artifact URI
holds its files; after deletion no CompiledModel, Job or finalizer is left.

The default run is a reduced case (6 models x 5 classes: the three worst moments, then 3 random
kills; 142 s here); `pytest -m chaos` runs the issue's full one (50 x 5, 20 kills).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from mlflow import MlflowClient

from devtools.devcluster import ControlPlane
from kompile.artifact_store import file_sizes
from kompile.operator.crashpoints import EXIT_CODE, POINTS
from tests.integration.fleet import (
    LOCAL_NODE,
    KwokReporter,
    OperatorProcess,
    cpu_target,
    gpu_target,
    kwok_node,
    publishing_decide,
    small_cnn_manifest,
    tenant_with_store,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.support.servers import MlflowServer, S3Server

NS = "kompile-chaos"
BUCKET = "kompile-chaos"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
LABEL_UID, LABEL_GEN, LABEL_TARGET = "kompile.dev/uid", "kompile.dev/generation", "kompile.dev/target"
CHAOS_TAINT = {"key": "kompile.dev/chaos", "value": "no-real-compiles", "effect": "NoSchedule"}
A10_NODES = {
    f"a10-{i}": {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.product": "NVIDIA-A10",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "6",
        "nvidia.com/gpu.count": "4",
    }
    for i in range(2)
}
"""A fifth hardware class for this module only (the session fleet has four on KWOK nodes)."""


TARGETS = [
    gpu_target("h100", "NVIDIA-H100-80GB-HBM3"),
    gpu_target("l4", "NVIDIA-L4"),
    gpu_target("a10", "NVIDIA-A10"),
    cpu_target("x86", "amd64"),
    cpu_target("arm", "arm64"),
]


class JobLedger:
    """Every Job the API server ever admitted in the namespace, from a watch: the uids seen per
    (CompiledModel uid, generation, target). A Job deleted and made again has a new uid."""

    def __init__(self, batch: client.BatchV1Api) -> None:
        self.batch = batch
        self.seen: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="job-ledger")

    def start(self) -> JobLedger:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self.batch.list_namespaced_job, NS, resource_version=version, timeout_seconds=30
                )
                for event in stream:
                    job = event["object"]
                    version = job.metadata.resource_version or version
                    labels = job.metadata.labels or {}
                    key = (labels.get(LABEL_UID, ""), labels.get(LABEL_GEN, ""), labels.get(LABEL_TARGET, ""))
                    self.seen[key].add(job.metadata.uid)
            except client.exceptions.ApiException as err:
                if err.status == 410:  # history compacted: a fresh list replays what exists
                    version = ""
                time.sleep(0.5)
            except (OSError, ValueError, urllib3.exceptions.HTTPError):  # dropped: resume where it was
                time.sleep(0.5)


@pytest.fixture(scope="module")
def chaos(
    control_plane: ControlPlane,
    sim_fleet: KubeletStandIn,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("chaos")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom, batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)
    creds = tenant_with_store(core, NS, s3_server, BUCKET)

    # Latency varies by (model, target), so each class's winner is a real choice.
    decide = publishing_decide(
        s3_server.endpoint, creds, p50=lambda prefix: 0.5 + random.Random(prefix).random()
    )

    # The stand-in kubelet's node would run real compiles: keep this module's pods off it.
    core.patch_node(LOCAL_NODE, {"spec": {"taints": [CHAOS_TAINT]}})
    for name, labels in A10_NODES.items():
        core.create_node(kwok_node(name, labels))
    ledger = JobLedger(batch).start()
    reporter = KwokReporter(control_plane.kubeconfig, NS, decide).start()
    try:
        yield {
            "core": core,
            "custom": custom,
            "batch": batch,
            "ledger": ledger,
            "mlflow": mlflow_server,
            "s3": s3_server,
            "creds": creds,
            "work": work,
            "plane": control_plane,
        }
    finally:
        reporter.stop()
        ledger.stop()
        for name in A10_NODES:
            core.delete_node(name)
        core.patch_node(LOCAL_NODE, {"spec": {"taints": None}})


def _manifest(name: str, s3: S3Server, mlflow: MlflowServer) -> dict[str, Any]:
    registry = {
        "trackingUri": mlflow.tracking_uri,
        "artifactStore": f"s3://{BUCKET}/store",
        "s3Endpoint": s3.endpoint,
        "credentialsSecret": {"name": "s3-creds"},
        "modelName": f"chaos-{name}",
    }
    return small_cnn_manifest(name, targets=TARGETS, registry=registry)


def _ready_count(c: dict[str, Any], names: list[str]) -> int:
    items = c["custom"].list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    ready = 0
    for obj in items:
        if obj["metadata"]["name"] not in names:
            continue
        status = obj.get("status") or {}
        conds = {x["type"]: x for x in status.get("conditions", [])}
        if (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and conds.get("Ready", {}).get("status") == "True"
            and conds.get("Registered", {}).get("status") == "True"
        ):
            ready += 1
    return ready


def _run_chaos(c: dict[str, Any], prefix: str, models: int, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"{prefix}-{i:03d}" for i in range(models)]
    log = c["work"] / f"{prefix}-operator.log"
    began = time.monotonic()
    crashes: list[str] = []

    def operator(crash_at: str | None = None) -> OperatorProcess:
        extra = {"KOMPILE_CRASH_AT": crash_at} if crash_at else {}
        return OperatorProcess(c["plane"].kubeconfig, NS, "s3://unused/", log, extra_env=extra).start()

    # 1. The three worst moments, each once, in the order the work reaches them.
    op = operator(POINTS[0])
    for name in names:
        c["custom"].create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, _manifest(name, c["s3"], c["mlflow"])
        )
    for point in POINTS:
        assert op.proc is not None
        proc = op.proc
        wait_for(
            f"the operator to crash at {point}",
            lambda p=proc: p.exit_status() is not None,  # type: ignore[misc]
            timeout=240,
        )
        assert proc.exit_status() in (EXIT_CODE, -9, 128 + 9), proc.exit_status()
        crashes.append(point)
        op.stop(hard=True)  # reaps the exited process
        following = POINTS.index(point) + 1
        op = operator(POINTS[following] if following < len(POINTS) else None)

    # 2. SIGKILLs at random moments while the rest settles.
    for _ in range(kills):
        time.sleep(rng.uniform(0.5, 6.0))
        op.stop(hard=True)
        op = operator()
    try:
        wait_for(
            f"all {models} CompiledModels Ready and Registered",
            lambda: _ready_count(c, names) == models or None,
            timeout=120 + models * 12,
            interval=2.0,
        )
        settled = time.monotonic() - began
        _check_invariants(c, names)
        _delete_all(c, names)
    finally:
        op.stop()
    return {"models": models, "kills": kills, "crash_points": crashes, "seconds_to_settle": round(settled, 1)}


def _check_invariants(c: dict[str, Any], names: list[str]) -> None:
    ml = MlflowClient(tracking_uri=c["mlflow"].tracking_uri)
    time.sleep(3)  # the watch has seen every Job created before the last status patch
    for name in names:
        obj = c["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        uid, gen, status = obj["metadata"]["uid"], str(obj["metadata"]["generation"]), obj["status"]
        for t in TARGETS:
            uids = c["ledger"].seen.get((uid, gen, t["name"]), set())
            # A cache hit (same key from an earlier model) needs no Job; never two.
            assert len(uids) <= 1, (name, t["name"], uids)
        targets = {t["name"]: t for t in status["targets"]}
        assert {t["phase"] for t in targets.values()} == {"Succeeded"}, (name, targets)
        ran = [t for t in TARGETS if c["ledger"].seen.get((uid, gen, t["name"]))]
        assert len(ran) + sum(1 for t in targets.values() if t.get("cached")) == len(TARGETS), name

        exp = ml.get_experiment_by_name(f"kompile/{NS}/{name}")
        parents = ml.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`kompile.run` = 'generation' and tags.`kompile.uid` = '{uid}'",
        )
        assert len(parents) == 1, (name, [r.info.run_id for r in parents])
        versions = ml.search_model_versions(f"name='chaos-{name}'")
        per_target = defaultdict(list)
        for v in versions:
            per_target[v.tags["kompile.target"]].append(v.version)
        assert {k: len(v) for k, v in per_target.items()} == {t["name"]: 1 for t in TARGETS}, (
            name,
            per_target,
        )

        winners: dict[str, tuple[float, str]] = {}
        for t in targets.values():
            p50 = t["latency"][0]["p50Ms"]
            if t["hardwareClass"] not in winners or p50 < winners[t["hardwareClass"]][0]:
                winners[t["hardwareClass"]] = (p50, t["registeredVersion"])
        aliases = ml.get_registered_model(f"chaos-{name}").aliases
        assert aliases == {cls: v for cls, (_, v) in winners.items()}, (name, aliases, winners)

        for t in targets.values():
            uri = t["artifact"]["uri"]
            files = file_sizes(uri, c["s3"].endpoint, c["creds"])
            assert "result.json" in files and len(files) >= 2, (uri, files)


def _delete_all(c: dict[str, Any], names: list[str]) -> None:
    for name in names:
        c["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)

    def gone() -> bool:
        left = [
            o["metadata"]["name"]
            for o in c["custom"].list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
            if o["metadata"]["name"] in names
        ]
        jobs = [
            j
            for j in c["batch"].list_namespaced_job(NS).items
            if (j.metadata.labels or {}).get("kompile.dev/compiledmodel") in names
        ]
        return not left and not jobs

    wait_for("every CompiledModel and Job gone after deletion", gone, timeout=120)


def test_kills_at_the_worst_moments_lose_and_duplicate_nothing(chaos: dict[str, Any]) -> None:
    figures = _run_chaos(chaos, "chaos-small", models=6, kills=3, seed=1)
    print(f"\nchaos (reduced): {json.dumps(figures)}")


@pytest.mark.chaos
def test_fifty_models_twenty_kills(chaos: dict[str, Any]) -> None:
    figures = _run_chaos(chaos, "chaos-full", models=50, kills=20, seed=2)
    print(f"\nchaos (full): {json.dumps(figures)}")
