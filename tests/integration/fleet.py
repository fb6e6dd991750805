"""The simulated fleet for operator tests: KWOK nodes of several hardware classes, one node run by
the kubelet stand-in (so its compile really happens), the operator as a real process, and a
reporter that tells each KWOK compile pod what to report (TEST STAND-IN for a compile container
on hardware this machine does not have)."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from devtools.processes import ManagedProcess, free_port
from kompile.api.job_contract import compact_result
from kompile.api.status import Artifact, LatencyStats, OutputCheck, TargetStatus, Thresholds, ValidationResult
from tests.integration.kwok_stages import EXIT_CODE, MESSAGE

KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
LOCAL_NODE = "local-avx2"
LOCAL_LABELS = {
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/os": "linux",
    "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
}


def gpu_labels(product: str, major: str, minor: str) -> dict[str, str]:
    return {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/gpu.count": "8",
    }


FLEET: dict[str, dict[str, str]] = {
    "h100-0": gpu_labels("NVIDIA-H100-80GB-HBM3", "9", "0"),
    "h100-1": gpu_labels("NVIDIA-H100-80GB-HBM3", "9", "0"),
    "l4-0": gpu_labels("NVIDIA-L4", "8", "9"),
    **{f"cpu-{i}": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"} for i in range(3)},
    **{f"edge-{i}": {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"} for i in range(2)},
}
CLASSES = {
    "gpu-nvidia-h100-80gb-hbm3-sm90": {"h100-0", "h100-1"},
    "gpu-nvidia-l4-sm89": {"l4-0"},
    "cpu-amd64": {"cpu-0", "cpu-1", "cpu-2"},
    "cpu-arm64": {"edge-0", "edge-1"},
    "cpu-amd64-avx2": {LOCAL_NODE},
}


def gpu_target(name: str, product: str) -> dict[str, Any]:
    """A TensorRT fp16 target pinned to one GPU product (KWOK nodes only: no real compile)."""
    return {
        "name": name,
        "backend": "tensorrt",
        "precision": "fp16",
        "hardware": {"nodeSelector": {"nvidia.com/gpu.product": product}},
    }


def cpu_target(name: str, arch: str) -> dict[str, Any]:
    """An ONNX Runtime fp32 target pinned to a CPU architecture."""
    return {
        "name": name,
        "backend": "onnxruntime",
        "precision": "fp32",
        "hardware": {"nodeSelector": {"kubernetes.io/arch": arch}},
    }


KWOK_TARGETS = [gpu_target("l4", "NVIDIA-L4"), cpu_target("arm", "arm64")]
"""Two targets only KWOK nodes take: each test's pods are completed by its KwokReporter."""


def kwok_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    gpu = "nvidia.com/gpu.product" in labels
    alloc = {"cpu": "32", "memory": "256Gi", "pods": "110", **({"nvidia.com/gpu": "8"} if gpu else {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": KWOK_ANNOTATION},
        "spec": {"taints": [GPU_TAINT] if gpu else []},
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def operator_fleet() -> dict[str, Any]:
    """spec.fleet for tests about the operator rather than the pick among compilers: CPU classes build
    with onnxruntime alone (`auto`'s three real compiles on the local node took minutes per model on
    its worker's one core)."""
    return {"enabled": True, "precisions": ["fp32"], "cpuBackend": "onnxruntime"}


def small_cnn_manifest(name: str, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
    """A CompiledModel of the small example CNN with quick validation and benchmark settings;
    `spec` adds or overrides fields (targets, fleet, registry, rollout...)."""
    metadata: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": metadata,
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [
                {
                    "name": "input",
                    "shape": [-1, 3, 32, 32],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}],
                }
            ],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
            **spec,
        },
    }


def success_result(
    target: str,
    backend: str,
    precision: str,
    p50: float = 1.0,
    eager: float = 4.0,
    artifact_uri: str | None = None,
) -> str:
    """What a compile on real hardware would hand back for a validated artifact."""
    ts = TargetStatus(
        name=target,
        artifact=Artifact(uri=artifact_uri, digest="sha256:" + "0" * 64) if artifact_uri else None,
        backend=backend,
        precision=precision,
        phase="Succeeded",
        reason="Validated",
        latency=[LatencyStats(batch_size=1, p50_ms=p50, p90_ms=p50, p99_ms=p50, throughput=1000 / p50)],
        speedup=round(eager / p50, 3),
        validation=ValidationResult(
            passed=True,
            samples=4,
            thresholds=Thresholds(min_cosine=0.999, top_k=5),
            outputs=[
                OutputCheck(name="output", max_abs_error=1e-3, max_rel_error=1e-2, cosine=0.9999, finite=True)
            ],
        ),
    )
    return compact_result(ts, None, "test")


def refused_calls(log: str) -> list[str]:
    """The operator log's lines that show an API call RBAC refused: an ApiException's "(403)" or a
    Forbidden. A bare "403" would also match a random port or a millisecond stamp in the log."""
    return [line for line in log.splitlines() if re.search(r"\(403\)|Forbidden", line)]


STAND_IN_MODEL = b"TEST STAND-IN for a compiled model"


def publish_entry(
    prefix: str, compact: str, endpoint: str | None = None, credentials: dict[str, str] | None = None
) -> None:
    """TEST STAND-IN for a compile container's publish: a model file, then result.json naming it
    (files and sizes, uploaded last), at the content address, so a later reconcile can hit the cache."""
    from kompile.artifact_store import join, write_bytes

    write_bytes(join(prefix, "stand-in", "1", "model.bin"), STAND_IN_MODEL, endpoint, credentials)
    doc = json.loads(compact) | {"files": {"stand-in/1/model.bin": len(STAND_IN_MODEL)}}
    write_bytes(join(prefix, "result.json"), json.dumps(doc).encode(), endpoint, credentials)


def token_kubeconfig(plane: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding a token of a ServiceAccount: the credentials a pod running as it gets
    (not the admin certificate, whose group RBAC and API Priority and Fairness both exempt)."""
    token = plane.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = json.loads(plane.kubeconfig.read_text())
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": admin["clusters"][0]["name"], "user": account}}
        ],
        "current-context": account,
    }
    path.write_text(json.dumps(doc))
    return path


Decide = Callable[[dict[str, Any]], tuple[int, str] | None]
"""A compile pod's exit code and termination message, or None: the test reports it itself later."""
"""Given a KWOK compile pod, the (exit code, termination message) it should report."""


def tenant_with_store(core: Any, namespace: str, s3: Any, bucket: str) -> dict[str, str]:
    """A namespace whose Secret `s3-creds` holds keys to a bucket of the test's S3 server; the keys."""
    core.create_namespace({"metadata": {"name": namespace}})
    s3.create_bucket(bucket)
    creds = {
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
    }
    data = {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()}
    core.create_namespaced_secret(namespace, {"metadata": {"name": "s3-creds"}, "data": data})
    return creds


def publishing_decide(
    endpoint: str, credentials: dict[str, str], p50: float | Callable[[str], float] = 1.0
) -> Decide:
    """Every KWOK compile pod succeeds and publishes its entry straight to S3 at `endpoint`; p50 is
    a latency, or a function of the artifact prefix giving one."""

    def decide(pod: dict[str, Any]) -> tuple[int, str]:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        t = json.loads(env["KOMPILE_TARGET"])
        prefix = env["KOMPILE_ARTIFACT_PREFIX"]
        latency = p50(prefix) if callable(p50) else p50
        compact = success_result(
            t["name"], t["backend"], t.get("precision", "fp32"), p50=latency, artifact_uri=prefix
        )
        publish_entry(prefix, compact, endpoint, credentials)
        return 0, compact

    return decide


def succeed_and_publish(pod: dict[str, Any]) -> tuple[int, str]:
    """A Decide: the compile succeeds with a plausible validated result, published at the content
    address as a real compile container would (so a later reconcile can hit the cache)."""
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    t = json.loads(env["KOMPILE_TARGET"])
    compact = success_result(
        t["name"], t["backend"], t.get("precision", "fp32"), artifact_uri=env["KOMPILE_ARTIFACT_PREFIX"]
    )
    publish_entry(env["KOMPILE_ARTIFACT_PREFIX"], compact)
    return 0, compact


class WatchThread:
    """Calls see(obj) for every object a watch of `list_fn(*args)` streams, from a thread, until
    stopped; the watch is restarted every few seconds so stop() is quick."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any) -> None:
        self.list_fn, self.args = list_fn, args
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=type(self).__name__)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def see(self, obj: Any) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        # List once, then watch from the list's resourceVersion, resuming each 3 s restart where the
        # last one ended. A watch started without one replays every object first, and at 1,000 x 5
        # the 3 s ran out after ~1,700 of the 5,000 pods: the rest were never seen.
        version: str | None = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                if version is None:
                    version = self._list()
                for ev in w.stream(self.list_fn, *self.args, timeout_seconds=3, resource_version=version):
                    self.see(ev["object"])
                    if self._stop.is_set():
                        break
                version = w.resource_version or version
            except ApiException as err:
                if err.status == 410:  # expired: list afresh (see() is idempotent)
                    version = None
                time.sleep(0.5)
            finally:
                w.stop()

    def _list(self) -> str:
        """see() each object listed now; the list's resourceVersion. Typed lists (core, batch) and
        raw ones (custom objects) alike."""
        listed = self.list_fn(*self.args, _request_timeout=120)
        if isinstance(listed, dict):
            items, version = listed.get("items") or [], (listed.get("metadata") or {}).get("resourceVersion")
        else:
            items, version = listed.items, listed.metadata.resource_version
        for obj in items:
            self.see(obj)
        return str(version)


class KwokReporter(WatchThread):
    """Annotates each compile pod bound to a KWOK node with the result the test decided."""

    def __init__(self, kubeconfig: Path, namespace: str, decide: Decide) -> None:
        self.core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.namespace = namespace
        self.decide = decide
        super().__init__(self.core.list_namespaced_pod, namespace)

    def see(self, pod: Any) -> None:
        node = pod.spec.node_name
        if not node or node == LOCAL_NODE or EXIT_CODE in (pod.metadata.annotations or {}):
            return
        decided = self.decide(client.ApiClient().sanitize_for_serialization(pod))
        if decided is None:
            return  # held Running until the test annotates it
        code, message = decided
        patch = {"metadata": {"annotations": {EXIT_CODE: str(code), MESSAGE: message}}}
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, patch)
        except ApiException as err:
            if err.status != 404:
                raise


class OperatorProcess:
    """`kompile operator` as a real process against the test control plane."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        store: str,
        log_path: Path,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.env = {
            # The tests' MLflow and S3 servers on loopback are the endpoints CompiledModels may name.
            "KOMPILE_ALLOWED_ENDPOINTS": "127.0.0.1,localhost",
            # One Lease per test namespace: the session's operators of other modules never wait on it.
            "KOMPILE_LEASE_NAMESPACE": namespace.split(",")[0],  # one of the watched ones
            **(extra_env or {}),
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "KOMPILE_NAMESPACES": namespace,
            "KOMPILE_ARTIFACT_STORE": store,
            "KOMPILE_RESYNC_SECONDS": "2",
            "KOMPILE_JOB_BACKOFF_LIMIT": "1",
            "KOMPILE_HEALTH_PORT": str(free_port()),
            "KOMPILE_METRICS_PORT": str(free_port()),
            # MLflow stages each logged file in a temp folder: an operator killed mid-registration
            # (the chaos tests) leaves it behind, here rather than in the machine's /tmp.
            "TMPDIR": str(log_path.parent / f"{log_path.stem}-tmp"),
        }
        (log_path.parent / f"{log_path.stem}-tmp").mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.proc: ManagedProcess | None = None

    def start(self) -> OperatorProcess:
        argv = [sys.executable, "-m", "kompile.cli", "operator"]
        self.proc = ManagedProcess("kompile operator", argv, self.log_path, env=self.env, grace=20.0)
        self.proc.start()
        return self

    def stop(self, hard: bool = False) -> None:
        """SIGTERM (SIGKILL after a grace period), or with hard=True a SIGKILL at once, as a crash."""
        if self.proc is None:
            return
        if hard:
            self.proc.kill()
        else:
            self.proc.stop()
        self.proc = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.env['KOMPILE_METRICS_PORT']}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.env['KOMPILE_HEALTH_PORT']}/healthz"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0, interval: float = 0.5) -> Any:
    """Poll until check() returns something truthy; fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; last: {json.dumps(last, default=str)[:2000]}"
    )
