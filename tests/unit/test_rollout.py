"""The KServe rollout's pure parts: the winner and its gate, the InferenceService, the deployment mode,
the canary state machine and the GitOps outputs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from kompile.api import parse_manifest
from kompile.api.resource import CompiledModel
from kompile.api.spec import RolloutGate, Target
from kompile.api.status import (
    Artifact,
    LatencyStats,
    OutputCheck,
    TargetStatus,
    Thresholds,
    ValidationResult,
)
from kompile.operator import rollout
from kompile.operator.targets import GPU_TOLERATION, ResolvedTarget

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
GPU_CLASS = "gpu-nvidia-l4-sm89"
CPU_CLASS = "cpu-amd64"


def model(**rollout_spec: Any) -> CompiledModel:
    return parse_manifest(
        {
            "apiVersion": "kompile.dev/v1alpha1",
            "kind": "CompiledModel",
            "metadata": {"name": "resnet", "namespace": "ml", "uid": "u-1", "generation": 2},
            "spec": {
                "source": {"uri": "s3://models/resnet.onnx"},
                "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}],
                "fleet": {"enabled": True},
                "registry": {"artifactStore": "s3://art"},
                "rollout": {"enabled": True, **rollout_spec},
            },
        }
    )


def target(
    name: str,
    cls: str = GPU_CLASS,
    backend: str = "tensorrt",
    p50: float = 1.0,
    speedup: float | None = 3.0,
    err: float = 1e-3,
    passed: bool | None = True,
    phase: str = "Succeeded",
) -> TargetStatus:
    validation = None
    if passed is not None:
        validation = ValidationResult(
            passed=passed,
            samples=4,
            outputs=[OutputCheck(name="y", max_abs_error=err, max_rel_error=err, cosine=1.0, finite=True)],
            thresholds=Thresholds(min_cosine=0.99, top_k=5),
        )
    return TargetStatus(
        name=name,
        backend=backend,
        precision="fp16",
        phase=phase,  # type: ignore[arg-type]
        hardware_class=cls,
        artifact=Artifact(uri=f"s3://art/resnet/{name}-1234", digest="sha256:" + "a" * 64),
        latency=[LatencyStats(batch_size=1, p50_ms=p50, p90_ms=p50, p99_ms=p50, throughput=1 / p50)],
        speedup=speedup,
        validation=validation,
    )


def gpu_rt() -> ResolvedTarget:
    return ResolvedTarget(
        target=Target(name="l4-fp16", backend="tensorrt", precision="fp16"),
        hardware_class=GPU_CLASS,
        gpu=True,
        node_selector={"kubernetes.io/arch": "amd64", "nvidia.com/gpu.compute.major": "8"},
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        tolerations=[GPU_TOLERATION],
        resources={"requests": {"cpu": "1"}, "limits": {"memory": "16Gi"}},
        runtime_class="nvidia",
    )


def cpu_rt() -> ResolvedTarget:
    return ResolvedTarget(
        target=Target(name="cpu-fp32", backend="onnxruntime"),
        hardware_class="cpu-amd64",
        gpu=False,
        node_selector={"kubernetes.io/arch": "amd64"},
        resources={"requests": {"cpu": "1"}},
    )


OLD_T, NEW_T = target("old"), target("new")
OLD, NEW = rollout.storage_uri(OLD_T.artifact.uri), rollout.storage_uri(NEW_T.artifact.uri)  # type: ignore[union-attr]


# -- winner and gate -----------------------------------------------------------------------------


def test_winner_is_the_fastest_validated_target_of_its_class() -> None:
    targets = [target("slow", p50=3.0), target("fast", p50=1.0), target("cpu", cls="cpu-amd64", p50=0.1)]
    best, why = rollout.winner(targets, GPU_CLASS, None)
    assert best is not None and best.name == "fast" and "fast" in why


def test_an_unvalidated_target_never_wins_however_fast() -> None:
    targets = [
        target("unchecked", p50=0.1, passed=None),
        target("failed", p50=0.1, passed=False, phase="Failed"),
        target("succeeded-but-failed-validation", p50=0.1, passed=False),
        target("ok", p50=5.0),
    ]
    best, _ = rollout.winner(targets, GPU_CLASS, RolloutGate())
    assert best is not None and best.name == "ok"
    best, why = rollout.winner(targets[:3], GPU_CLASS, None)
    assert best is None and why.startswith("no validated target")


def test_gate_refusals_say_which_bound_failed() -> None:
    best, why = rollout.winner([target("a", speedup=1.2)], GPU_CLASS, RolloutGate(min_speedup=1.5))
    assert best is None and why == "speedup 1.2 < gate 1.5"
    best, why = rollout.winner([target("a", err=0.02)], GPU_CLASS, RolloutGate(max_abs_error=0.01))
    assert best is None and why == "max abs error 0.02 > gate 0.01"
    best, why = rollout.winner([target("a", speedup=None)], GPU_CLASS, RolloutGate(min_speedup=1.0))
    assert best is None and "unknown" in why
    two = [target("a", speedup=1.2), target("b", err=0.5)]
    best, why = rollout.winner(two, GPU_CLASS, RolloutGate(min_speedup=1.5, max_abs_error=0.1))
    assert best is None and "a: speedup 1.2 < gate 1.5" in why and "b: max abs error 0.5" in why


def test_gate_passes_a_slower_target_when_the_fastest_is_refused() -> None:
    targets = [target("fast", p50=1.0, speedup=1.1), target("steady", p50=2.0, speedup=2.0)]
    best, _ = rollout.winner(targets, GPU_CLASS, RolloutGate(min_speedup=1.5))
    assert best is not None and best.name == "steady"
    assert rollout.winner(targets, "cpu-arm64", None) == (None, "no target for hardware class cpu-arm64")


# -- names and URIs ------------------------------------------------------------------------------


def test_an_artifact_triton_cannot_serve_never_wins() -> None:
    fast_pt2 = target("cpu-tvm", CPU_CLASS, backend="tvm", p50=1.0)
    slow_onnx = target("cpu-ort", CPU_CLASS, backend="onnxruntime", p50=5.0)
    best, _ = rollout.winner([fast_pt2, slow_onnx], CPU_CLASS, None)
    assert best is not None and best.name == "cpu-ort"
    none, why = rollout.winner([fast_pt2], CPU_CLASS, None)
    assert none is None and "tvm artifact has no Triton model format" in why


def test_device_artifacts_are_never_rolled_out_and_exported_ones_never_win() -> None:
    pte = target("edge", CPU_CLASS, backend="executorch", p50=0.5)
    mlpackage = target("mac", CPU_CLASS, backend="coreml", p50=0.1, passed=None, phase="Exported")
    ort = target("cpu-ort", CPU_CLASS, backend="onnxruntime", p50=5.0)
    best, _ = rollout.winner([pte, mlpackage, ort], CPU_CLASS, None)
    assert best is not None and best.name == "cpu-ort"
    none, why = rollout.winner([pte], CPU_CLASS, None)
    assert none is None and "executorch artifact is for devices, not KServe" in why
    assert "MLflow alias" in why
    none, why = rollout.winner([mlpackage], CPU_CLASS, None)
    assert none is None and "mac: Exported" in why
    # The class alias for devices: the fastest validated device artifact, never an exported one.
    assert rollout.device_winner([pte, mlpackage, ort], CPU_CLASS) is pte
    assert rollout.device_winner([mlpackage, ort], CPU_CLASS) is None


def test_tensorrt_plans_get_the_matching_triton_release() -> None:
    isvc = rollout.inference_service(
        model(), gpu_rt(), target("l4-fp16"), "r", "Serverless", None, True, runtime_version="25.10-py3"
    )
    assert isvc["spec"]["predictor"]["model"]["runtimeVersion"] == "25.10-py3"
    onnx = rollout.inference_service(
        model(),
        cpu_rt(),
        target("cpu", backend="onnxruntime"),
        "r",
        "Serverless",
        None,
        True,
        runtime_version="25.10-py3",
    )
    assert "runtimeVersion" not in onnx["spec"]["predictor"]["model"]


def test_service_names() -> None:
    assert rollout.service_name("resnet", "serve-me", GPU_CLASS, 1) == "serve-me"
    assert rollout.service_name("resnet", None, GPU_CLASS, 1) == "resnet"
    assert rollout.service_name("resnet", None, GPU_CLASS, 2) == f"resnet-{GPU_CLASS}"
    long_a = rollout.service_name("m" * 60, None, "gpu-a", 2)
    long_b = rollout.service_name("m" * 60, None, "gpu-b", 2)
    assert len(long_a) <= 63 and len(long_b) <= 63 and long_a != long_b
    with pytest.raises(ValueError, match="inferenceService"):
        rollout.service_name("9lives", None, GPU_CLASS, 1)


def test_storage_uri_is_the_triton_repository_root() -> None:
    assert rollout.storage_uri("s3://art/resnet/t-1/") == "s3://art/resnet/t-1"
    assert rollout.storage_uri("s3://art/resnet/t-1/resnet/1/model.plan") == "s3://art/resnet/t-1"
    assert rollout.storage_uri("s3://art/resnet/t-1/resnet/config.pbtxt") == "s3://art/resnet/t-1"
    assert rollout.storage_uri("s3://art/resnet/t-1/resnet/1/model.pt2") == "s3://art/resnet/t-1"
    assert rollout.storage_uri("s3://art/models/1/2024") == "s3://art/models/1/2024"


# -- the InferenceService ------------------------------------------------------------------------


def test_gpu_inference_service() -> None:
    isvc = rollout.inference_service(
        model(), gpu_rt(), target("l4-fp16"), "resnet", "Serverless", None, True, service_account="s3-reader"
    )
    meta, predictor = isvc["metadata"], isvc["spec"]["predictor"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert meta["namespace"] == "ml"
    assert meta["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    assert meta["labels"]["kompile.dev/compiledmodel"] == "resnet"
    assert meta["labels"]["kompile.dev/target"] == "l4-fp16"
    assert meta["labels"]["kompile.dev/hardware-class"] == GPU_CLASS
    assert meta["ownerReferences"][0]["uid"] == "u-1" and meta["ownerReferences"][0]["controller"]
    assert predictor["model"]["modelFormat"] == {"name": "tensorrt"}
    assert predictor["model"]["runtime"] == "kserve-tritonserver"  # explicit, or OpenVINO claims onnx
    assert predictor["model"]["storageUri"] == "s3://art/resnet/l4-fp16-1234"
    assert predictor["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert predictor["model"]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert predictor["nodeSelector"]["nvidia.com/gpu.compute.major"] == "8"
    assert predictor["tolerations"] == [GPU_TOLERATION] and "nodeAffinity" in predictor["affinity"]
    assert predictor["runtimeClassName"] == "nvidia" and predictor["serviceAccountName"] == "s3-reader"
    assert "canaryTrafficPercent" not in predictor and "canary" not in isvc["spec"]


def test_cpu_inference_service_adopted_with_custom_runtime() -> None:
    cm = model(runtime="my-triton")
    isvc = rollout.inference_service(
        cm, cpu_rt(), target("cpu", backend="onnxruntime"), "x", "Standard", None, False
    )
    predictor = isvc["spec"]["predictor"]
    assert "ownerReferences" not in isvc["metadata"]
    assert (
        predictor["model"]["modelFormat"] == {"name": "onnx"} and predictor["model"]["runtime"] == "my-triton"
    )
    assert "nvidia.com/gpu" not in str(predictor) and "serviceAccountName" not in predictor
    with pytest.raises(ValueError, match="no Triton model format"):
        rollout.inference_service(cm, cpu_rt(), target("i", backend="tvm"), "x", "Standard", None, False)
    aoti = rollout.inference_service(
        cm, cpu_rt(), target("i", backend="inductor"), "x", "Standard", None, False
    )
    assert aoti["spec"]["predictor"]["model"]["modelFormat"] == {"name": "pytorch"}
    assert aoti["spec"]["predictor"]["model"]["runtime"] == "my-triton"


def test_canary_field_follows_the_mode() -> None:
    cm, rt, won = model(), gpu_rt(), target("l4-fp16")
    serverless = rollout.inference_service(cm, rt, won, "r", "Knative", 10, True)
    assert serverless["spec"]["predictor"]["canaryTrafficPercent"] == 10
    stable = {"modelFormat": {"name": "tensorrt"}, "runtime": "kserve-tritonserver", "storageUri": OLD}
    standard = rollout.inference_service(cm, rt, won, "r", "Standard", 10, True, stable_model=stable)
    assert standard["spec"]["predictor"]["model"]["storageUri"] == OLD
    entry = standard["spec"]["canary"][0]
    assert entry["trafficPercent"] == 10 and entry["predictor"]["model"]["storageUri"].endswith(
        "l4-fp16-1234"
    )
    assert "canaryTrafficPercent" not in standard["spec"]["predictor"]
    no_stable = rollout.inference_service(cm, rt, won, "r", "RawDeployment", 10, True)
    assert "canary" not in no_stable["spec"] and "canaryTrafficPercent" not in no_stable["spec"]["predictor"]


# -- the deployment mode -------------------------------------------------------------------------


def test_cluster_mode_is_read_not_assumed() -> None:
    cfg = {"data": {"deploy": '{"defaultDeploymentMode": "RawDeployment"}'}}
    assert rollout.cluster_mode(cfg, "Serverless") == "Serverless"
    assert rollout.cluster_mode(cfg, None) == "RawDeployment"
    assert rollout.cluster_mode({"data": {}}, None) == "Serverless"
    assert rollout.cluster_mode(None, None) == "Serverless"
    with pytest.raises(ValueError, match="inferenceservice-config"):
        rollout.cluster_mode({"data": {"deploy": "{not json"}}, None)


def test_an_existing_inference_service_keeps_its_mode() -> None:
    assert rollout.effective_mode(None, "Standard") == "Standard"
    assert rollout.effective_mode({"status": {"deploymentMode": "Knative"}}, "Standard") == "Knative"
    annotated = {"metadata": {"annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}}}
    assert rollout.effective_mode(annotated, "Serverless") == "RawDeployment"
    assert rollout.canary_style("Knative", False) == "traffic"
    assert rollout.canary_style("Standard", True) == "spec"
    assert rollout.canary_style("RawDeployment", False) == "none"
    crd: dict[str, Any] = {
        "spec": {
            "versions": [
                {"schema": {"openAPIV3Schema": {"properties": {"spec": {"properties": {"canary": {}}}}}}}
            ]
        }
    }
    assert rollout.crd_supports_spec_canary(crd) and not rollout.crd_supports_spec_canary(None)


# -- GitOps --------------------------------------------------------------------------------------


def test_gitops_outputs() -> None:
    cm = model()
    manifests = [
        rollout.inference_service(cm, gpu_rt(), NEW_T, "resnet-gpu", "Serverless", None, True),
        rollout.inference_service(
            cm, cpu_rt(), target("c", backend="onnxruntime"), "resnet-cpu", "Serverless", None, True
        ),
    ]
    files = rollout.gitops_files(manifests)
    assert sorted(files) == ["resnet-cpu.yaml", "resnet-gpu.yaml"]
    back = yaml.safe_load(files["resnet-gpu.yaml"])
    assert back["spec"] == manifests[0]["spec"] and "ownerReferences" not in back["metadata"]
    assert "ownerReferences" in manifests[0]["metadata"]  # the input is left alone
    cfg = rollout.gitops_configmap(cm, manifests, "resnet-isvcs")
    assert cfg["kind"] == "ConfigMap" and cfg["metadata"]["namespace"] == "ml"
    assert cfg["metadata"]["ownerReferences"][0]["name"] == "resnet" and cfg["data"] == files
    with pytest.raises(ValueError, match="two InferenceServices"):
        rollout.gitops_files([manifests[0], manifests[0]])


class _NoKServeCluster:
    """The reads reconcile_rollouts makes of a cluster; every write would be a failure here."""

    def get_config_map(self, namespace: str, name: str) -> None:
        return None

    def get_crd(self, name: str) -> None:
        return None


def test_a_class_whose_winner_is_for_devices_gets_its_alias_and_no_inference_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kompile.api.status import CompiledModelStatus
    from kompile.operator import serve
    from kompile.operator.settings import Settings

    moved: list[tuple[str, str]] = []
    monkeypatch.setattr(
        serve, "move_alias", lambda cm, st, s, cls, t, ev: moved.append((cls, t.name)) or True
    )
    pte = target("edge-int8", CPU_CLASS, backend="executorch", p50=0.5)
    status = CompiledModelStatus(targets=[pte])
    events: list[tuple[str, ...]] = []
    serve.reconcile_rollouts(
        model(),
        status,
        [cpu_rt()],
        _NoKServeCluster(),
        Settings(),
        lambda *a: events.append(a),  # type: ignore[arg-type]
    )
    (state,) = status.rollouts
    assert state.phase == "Blocked" and "for devices, not KServe" in (state.message or "")
    assert "the class alias points at edge-int8 for devices to fetch" in (state.message or "")
    assert moved == [("cpu-amd64", "edge-int8")] and not events
