"""The operator's pure parts: fleet classes, target resolution, Job manifests, results from Jobs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC
from typing import Any

import pytest

from kompile.api import parse_manifest
from kompile.api.cache import cache_key
from kompile.api.candidates import backends_of
from kompile.api.job_contract import (
    TERMINATION_LIMIT,
    ExitCode,
    JobContractError,
    JobDeadline,
    JobEnv,
    JobResult,
    JobSpec,
    compact_result,
    parse_compact,
)
from kompile.api.status import LatencyStats, OutputCheck, TargetStatus, Thresholds, ValidationResult
from kompile.operator.fleet import discover
from kompile.operator.jobs import build_job, compile_image, job_name
from kompile.operator.results import from_job, job_state
from kompile.operator.settings import Settings
from kompile.operator.targets import resolve_targets


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {}}


def gpu(name: str, product: str, major: str, minor: str) -> dict[str, Any]:
    return node(
        name,
        **{
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.compute.major": major,
            "nvidia.com/gpu.compute.minor": minor,
        },
    )


FLEET = [
    gpu("h100-a", "NVIDIA-H100-80GB-HBM3", "9", "0"),
    gpu("h100-b", "NVIDIA-H100-80GB-HBM3-SHARED", "9", "0"),
    gpu("l4", "NVIDIA-L4", "8", "9"),
    node("cpu-1", **{"kubernetes.io/arch": "amd64"}),
    node("cpu-2", **{"kubernetes.io/arch": "amd64"}),
    node("edge-1", **{"kubernetes.io/arch": "arm64"}),
    node("avx", **{"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}),
]


def cm(**spec: Any) -> Any:
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "resnet", "namespace": "ml", "uid": "u-1", "generation": 3},
        "spec": {
            "source": {"uri": "s3://models/resnet.onnx"},
            "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}],
            **spec,
        },
    }
    return parse_manifest(doc)


def test_discover_groups_by_arch_product_and_capability() -> None:
    classes = {c.name: c for c in discover(FLEET)}
    assert set(classes) == {
        "gpu-nvidia-h100-80gb-hbm3-sm90",
        "gpu-nvidia-l4-sm89",
        "cpu-amd64",
        "cpu-arm64",
        "cpu-amd64-avx2",
    }
    h100 = classes["gpu-nvidia-h100-80gb-hbm3-sm90"]
    assert h100.nodes == ("h100-a", "h100-b") and h100.compute_capability == "9.0"
    assert set(h100.products) == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED"}
    assert classes["cpu-arm64"].node_selector == {"kubernetes.io/arch": "arm64"}
    unschedulable = [{**FLEET[2], "spec": {"unschedulable": True}}]
    assert discover(unschedulable) == []


def test_a_cpu_class_keeps_off_the_nodes_of_a_wider_isa() -> None:
    """A wider node carries the narrower ISA labels too; the class's affinity names the ones classify()
    reads first, so the scheduler places the class's Job only where classify() would."""
    vnni = node(
        "vnni",
        **{
            "kubernetes.io/arch": "amd64",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI": "true",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
            "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
        },
    )
    classes = {c.name: c for c in discover([*FLEET, vnni])}

    def excluded(name: str) -> set[str]:
        terms = classes[name].affinity()["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (term,) = terms["nodeSelectorTerms"]
        return {
            e["key"].rsplit(".", 1)[1]
            for e in term["matchExpressions"]
            if e["operator"] == "NotIn" and e["values"] == ["true"]
        }

    assert classes["cpu-amd64-avx2"].node_selector["feature.node.kubernetes.io/cpu-cpuid.AVX2"] == "true"
    assert excluded("cpu-amd64-avx2") == {"AMXINT8", "AVX512BF16", "AVX512VNNI", "AVX512F", "AVXVNNI"}
    assert excluded("cpu-amd64-avx512vnni") == {"AMXINT8", "AVX512BF16"}
    assert excluded("cpu-amd64") == {
        *("AMXINT8", "AVX512BF16", "AVX512VNNI", "AVX512F", "AVXVNNI", "AVX2", "ASIMDDP")
    }


def test_amx_and_bf16_nodes_are_not_one_class_with_plain_vnni_nodes() -> None:
    """Sapphire Rapids (AMX), Zen 4 (AVX-512 BF16) and Ice Lake (VNNI) compute bf16 and int8 at
    different speeds: a winner measured on one is not the fastest, or not native, on the others."""
    cpuid = "feature.node.kubernetes.io/cpu-cpuid."
    ice = {f"{cpuid}{f}": "true" for f in ("AVX2", "AVX512F", "AVX512VNNI")}
    zen4 = ice | {f"{cpuid}AVX512BF16": "true"}
    spr = zen4 | {f"{cpuid}{f}": "true" for f in ("AMXTILE", "AMXINT8", "AMXBF16")}
    nodes = [node(n, **{"kubernetes.io/arch": "amd64", **labels}) for n, labels in
             [("ice", ice), ("zen4", zen4), ("spr", spr)]]  # fmt: skip
    classes = {c.name: c for c in discover(nodes)}
    assert {n: c.nodes for n, c in classes.items()} == {
        "cpu-amd64-avx512vnni": ("ice",),
        "cpu-amd64-avx512bf16": ("zen4",),
        "cpu-amd64-amx": ("spr",),
    }
    assert classes["cpu-amd64-amx"].node_selector[f"{cpuid}AMXINT8"] == "true"
    (term,) = classes["cpu-amd64-avx512vnni"].affinity()["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"] if e["operator"] == "NotIn"} == {
        f"{cpuid}AMXINT8",
        f"{cpuid}AVX512BF16",
    }


def test_fleet_mode_gets_one_target_per_class_and_precision() -> None:
    model = cm(fleet={"enabled": True, "precisions": ["fp32", "int8"]})
    resolved = resolve_targets(model.spec, discover(FLEET), gpu_runtime="nvidia")
    assert len(resolved) == 10
    by_name = {r.name: r for r in resolved}
    g = by_name["gpu-nvidia-l4-sm89-fp32"]
    # auto: the GPU class's candidates (tensorrt, inductor on CUDA) compete in one GPU Job.
    assert g.gpu and g.target.backend == "auto" and g.runtime_class == "nvidia"
    assert backends_of(g.target, "cuda") == ["inductor", "tensorrt"]
    assert g.resources["limits"]["nvidia.com/gpu"] == "1"
    assert g.tolerations[0]["key"] == "nvidia.com/gpu"
    c = by_name["cpu-arm64-int8"]
    assert not c.gpu and c.target.backend == "auto" and c.node_selector == {"kubernetes.io/arch": "arm64"}
    # arm64 edge classes: executorch and litert join auto there, and only there.
    assert c.arch == "arm64" and backends_of(c.target, "cpu", c.arch) == [
        "executorch",
        "inductor",
        "litert",
        "onnxruntime",
        "openvino",
    ]
    x86 = by_name["cpu-amd64-int8"]
    assert backends_of(x86.target, "cpu", x86.arch) == ["inductor", "onnxruntime", "openvino"]


def test_explicit_target_keeps_its_selector_and_finds_its_class() -> None:
    model = cm(
        targets=[
            {
                "name": "l4",
                "backend": "tensorrt",
                "precision": "fp16",
                "hardware": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            }
        ]
    )
    (rt,) = resolve_targets(model.spec, discover(FLEET))
    assert rt.hardware_class == "gpu-nvidia-l4-sm89"
    assert rt.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}


def test_job_manifest() -> None:
    model = cm(
        targets=[{"name": "cpu", "backend": "onnxruntime"}],
        registry={"artifactStore": "s3://bucket/kompile", "credentialsSecret": {"name": "s3-creds"}},
    )
    (rt,) = resolve_targets(model.spec, discover(FLEET))
    job = build_job(model, rt, "k" * 40, "s3://bucket/kompile/cache/ns/kkk", Settings())
    assert job["metadata"]["name"] == job_name("resnet", "u-1", 3, "cpu")
    assert len(job["metadata"]["name"]) <= 63
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = job["spec"]
    assert spec["backoffLimit"] == 2
    # An eviction is ignored before any exit code is read (it kills with 137 too); bad input and
    # an out-of-memory kill fail the Job at once: a retry at the same limit cannot help either.
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [2, 137]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["KOMPILE_ARTIFACT_PREFIX"].startswith("s3://")
    assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
    # deterministic: another generation gets another name, the same one the same
    assert job_name("resnet", "u-1", 4, "cpu") != job["metadata"]["name"]


def test_a_target_with_an_own_environment_backend_runs_in_that_environments_image() -> None:
    """litert runs in its own environment: its Job gets the compile-litert image (KOMPILE_ENV_IMAGES),
    a CPU target without it the CPU image."""
    model = cm(
        fleet={"enabled": True},
        targets=[
            {
                "name": "edge",
                "backend": "auto",
                "candidates": [{"backend": "onnxruntime"}, {"backend": "litert"}],
            },
            {"name": "plain", "backend": "onnxruntime"},
        ],
    )
    settings = Settings.from_env({"KOMPILE_CPU_IMAGE": "example/compile-cpu:1"})
    assert settings.env_images == {
        "litert": "ghcr.io/kompile/compile-litert:0.1.0",
        "iree": "ghcr.io/kompile/compile-iree:0.1.0",
        "tvm": "ghcr.io/kompile/compile-tvm:0.1.0",
        "xla": "ghcr.io/kompile/compile-xla:0.1.0",
    }
    custom = Settings.from_env({"KOMPILE_ENV_IMAGES": "litert=example/compile-litert:2"})
    images = {}
    for rt in resolve_targets(model.spec, discover(FLEET)):
        if not rt.gpu:
            job = build_job(model, rt, "k" * 40, "s3://bucket/cache/ns/k", settings)
            images[rt.target.name] = job["spec"]["template"]["spec"]["containers"][0]["image"]
            if rt.target.name == "edge":
                other = build_job(model, rt, "k" * 40, "s3://bucket/cache/ns/k", custom)
                assert (
                    other["spec"]["template"]["spec"]["containers"][0]["image"] == "example/compile-litert:2"
                )
    assert (
        images["edge"] == "ghcr.io/kompile/compile-litert:0.1.0"
        and images["plain"] == "example/compile-cpu:1"
    )


def test_a_target_needing_several_environments_runs_in_the_image_that_has_them_all() -> None:
    """One Job builds every candidate of its target: litert and xla candidates need both
    environments, so the Job gets KOMPILE_ENVS_IMAGE (compile-envs), or the image that
    KOMPILE_ENV_IMAGES names for exactly that set."""
    model = cm(
        targets=[
            {"name": "both", "backend": "auto", "candidates": [{"backend": "litert"}, {"backend": "xla"}]},
            {"name": "one", "backend": "xla"},
        ],
    )
    (both, one) = resolve_targets(model.spec, [])
    settings = Settings.from_env({})
    assert compile_image(both, settings) == "ghcr.io/kompile/compile-envs:0.1.0"
    assert compile_image(one, settings) == settings.env_images["xla"]
    custom = Settings.from_env({"KOMPILE_ENV_IMAGES": "litert+xla=example/edge-and-xla:1"})
    assert compile_image(both, custom) == "example/edge-and-xla:1"
    assert compile_image(both, Settings.from_env({"KOMPILE_ENVS_IMAGE": "example/all:2"})) == "example/all:2"


def test_a_gpu_target_with_an_own_environment_backend_runs_in_the_gpu_environments_image() -> None:
    """tvm, iree and xla build for cuda in their own environments, which TensorRT's compile-gpu
    image lacks: their GPU targets get KOMPILE_GPU_ENVS_IMAGE (compile-gpu-envs); auto keeps the
    GPU image."""
    model = cm(fleet={"enabled": True, "precisions": ["fp32"]})
    auto = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.gpu)
    settings = Settings.from_env({"KOMPILE_GPU_IMAGE": "example/gpu:1"})
    assert compile_image(auto, settings) == "example/gpu:1"
    for backend in ("iree", "tvm", "xla"):
        named = replace(auto, target=auto.target.model_copy(update={"backend": backend}))
        assert compile_image(named, settings) == "ghcr.io/kompile/compile-gpu-envs:0.1.0", backend
        custom = Settings.from_env({"KOMPILE_GPU_ENVS_IMAGE": "example/gpu-envs:2"})
        assert compile_image(named, custom) == "example/gpu-envs:2"
    # A CPU-only environment backend named on a GPU class offers no cuda candidate: the GPU image.
    litert = replace(auto, target=auto.target.model_copy(update={"backend": "litert"}))
    assert compile_image(litert, settings) == "example/gpu:1"


def test_gpu_class_auto_target_gets_a_cuda_job_on_the_gpu_image() -> None:
    """The CUDA path's Job: GPU image, device cuda for the candidates, GPU limit and toleration."""
    model = cm(fleet={"enabled": True, "precisions": ["fp16"]})
    rt = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.hardware_class.startswith("gpu-"))
    settings = Settings(gpu_image="example/compile-gpu:1", cpu_image="example/compile-cpu:1")
    job = build_job(model, rt, "k" * 40, "s3://bucket/cache/ns/k", settings)
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["image"] == "example/compile-gpu:1" and env["KOMPILE_DEVICE"] == "cuda"
    assert env["KOMPILE_TIMING_CACHE_URI"] == "s3://bucket/timing-caches"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in job["spec"]["template"][
        "spec"
    ]["tolerations"]
    cpu = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.hardware_class == "cpu-arm64")
    cpu_env = {
        e["name"]: e["value"]
        for e in build_job(model, cpu, "k" * 40, "p", settings)["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    # CPU Jobs share TVM tuning databases there.
    assert cpu_env["KOMPILE_DEVICE"] == "cpu" and cpu_env["KOMPILE_TIMING_CACHE_URI"] == "p/timing-caches"


def test_arm64_class_job_is_pinned_to_arm64_on_the_multi_arch_cpu_image() -> None:
    model = cm(fleet={"enabled": True, "precisions": ["int8"]})
    settings = Settings(gpu_image="example/compile-gpu:1", cpu_image="example/compile-cpu:1")
    by_class = {r.hardware_class: r for r in resolve_targets(model.spec, discover(FLEET))}
    jobs = {c: build_job(model, by_class[c], "k" * 40, "p", settings) for c in ("cpu-arm64", "cpu-amd64")}
    arm, x86 = (jobs[c]["spec"]["template"]["spec"] for c in ("cpu-arm64", "cpu-amd64"))
    assert arm["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert x86["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    # One multi-arch tag: each node pulls its own architecture's variant of it. The arm64 class's
    # auto offers litert, so its Job runs the image that carries litert's environment too.
    assert x86["containers"][0]["image"] == "example/compile-cpu:1"
    assert arm["containers"][0]["image"] == settings.env_images["litert"]
    env = {e["name"]: e["value"] for e in arm["containers"][0]["env"]}
    assert env["KOMPILE_ARCH"] == "arm64" and JobSpec.from_env(env).arch == "arm64"
    # The cache key's versions follow the class's candidates: executorch's only on arm64.
    assert "executorch" in backends_of(by_class["cpu-arm64"].target, "cpu", JobSpec.from_env(env).arch)
    # An explicit target pins an architecture only through its own selector.
    free = cm(targets=[{"name": "cpu", "backend": "onnxruntime"}])
    (rt,) = resolve_targets(free.spec, discover(FLEET))
    env = {
        e["name"]: e["value"]
        for e in build_job(free, rt, "k", "p", settings)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert rt.arch is None and "KOMPILE_ARCH" not in env


def test_auto_target_on_a_gpu_selector_is_a_gpu_target() -> None:
    model = cm(
        targets=[{"name": "l4", "hardware": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}}]
    )
    (rt,) = resolve_targets(model.spec, discover(FLEET))
    assert rt.gpu and rt.hardware_class == "gpu-nvidia-l4-sm89"
    inductor_cuda = cm(targets=[{"name": "g", "backend": "inductor", "options": {"device": "cuda"}}])
    assert resolve_targets(inductor_cuda.spec, discover(FLEET))[0].gpu


def test_cache_key_covers_candidates_and_selection() -> None:
    plain = cm(targets=[{"name": "cpu"}])
    listed = cm(
        targets=[{"name": "cpu", "candidates": [{"backend": "onnxruntime"}, {"backend": "inductor"}]}]
    )
    picky = cm(targets=[{"name": "cpu", "selection": {"policy": "maxThroughput", "latencyBudgetMs": 5}}])
    keys = {
        cache_key("sha256:x", m.spec.targets[0], "v", "cpu", m.spec.inputs, m.spec.validation, "m")
        for m in (plain, listed, picky)
    }
    assert len(keys) == 3


def test_cache_key_changes_with_what_shapes_the_artifact() -> None:
    a = cm(targets=[{"name": "cpu", "backend": "onnxruntime"}])
    b = cm(targets=[{"name": "cpu", "backend": "onnxruntime", "precision": "int8"}])
    t_a, t_b = a.spec.targets[0], b.spec.targets[0]
    k = cache_key("sha256:x", t_a, "1.0", "cpu-amd64", a.spec.inputs, a.spec.validation, "m")
    assert k == cache_key("sha256:x", t_a, "1.0", "cpu-amd64", a.spec.inputs, a.spec.validation, "m")
    assert k != cache_key("sha256:x", t_b, "1.0", "cpu-amd64", a.spec.inputs, a.spec.validation, "m")
    assert k != cache_key("sha256:y", t_a, "1.0", "cpu-amd64", a.spec.inputs, a.spec.validation, "m")
    assert k != cache_key("sha256:x", t_a, "1.1", "cpu-amd64", a.spec.inputs, a.spec.validation, "m")
    assert k != cache_key("sha256:x", t_a, "1.0", "cpu-arm64", a.spec.inputs, a.spec.validation, "m")


def _result() -> TargetStatus:
    return TargetStatus(
        name="cpu",
        backend="onnxruntime",
        precision="fp32",
        phase="Succeeded",
        speedup=2.5,
        latency=[LatencyStats(batch_size=b, p50_ms=1, p90_ms=1, p99_ms=1, throughput=1) for b in (1, 8)],
        validation=ValidationResult(
            passed=True,
            samples=4,
            thresholds=Thresholds(min_cosine=0.99, top_k=5),
            outputs=[
                OutputCheck(name=f"o{i}", max_abs_error=1e-4, max_rel_error=1e-3, cosine=0.999, finite=True)
                for i in range(80)
            ],
        ),
    )


def test_compact_result_fits_the_termination_message() -> None:
    text = compact_result(_result(), "sha256:abc", "1.31.1")
    assert len(text.encode()) <= TERMINATION_LIMIT
    target, digest, version = parse_compact(text)
    assert target.speedup == 2.5 and target.validation and target.validation.passed
    assert digest == "sha256:abc" and version == "1.31.1"


def _job(cond: str | None, reason: str | None = None) -> dict[str, Any]:
    conds = [{"type": cond, "status": "True", "reason": reason}] if cond else []
    return {"metadata": {"name": "j"}, "status": {"conditions": conds}}


def _pod(message: str = "", exit_code: int = 0, node_name: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node_name},
        "status": {
            "containerStatuses": [{"state": {"terminated": {"message": message, "exitCode": exit_code}}}]
        },
    }


def test_results_from_jobs() -> None:
    (rt,) = resolve_targets(cm(targets=[{"name": "cpu", "backend": "onnxruntime"}]).spec, [])
    assert job_state(_job(None)) == ("Running", None)
    running, _ = from_job(rt, _job(None), [], None)
    assert running.phase == "Pending"
    ok, digest = from_job(rt, _job("Complete"), [_pod(compact_result(_result(), "sha256:d", "1"))], None)
    assert ok.phase == "Succeeded" and ok.node == "n1" and ok.job == "j" and digest == "sha256:d"
    crashed, _ = from_job(
        rt, _job("Failed", "BackoffLimitExceeded"), [_pod("Killed: out of memory", 137)], None
    )
    assert crashed.phase == "Failed" and crashed.reason == "BackoffLimitExceeded"
    assert "exit code 137" in (crashed.message or "") and "out of memory" in (crashed.message or "")
    silent, _ = from_job(rt, _job("Complete"), [_pod("")], None)
    assert silent.phase == "Failed" and silent.reason == "NoResult"


def test_a_result_not_yet_readable_is_waited_for_then_reported() -> None:
    """A Job that ended moments ago with no readable result (store briefly down, pod gone) is not
    final: status says the result is awaited, and only after RESULT_WAIT is it NoResult."""
    from datetime import datetime, timedelta

    from kompile.operator.results import RESULT_WAIT_SECONDS

    (rt,) = resolve_targets(cm(targets=[{"name": "cpu", "backend": "onnxruntime"}]).spec, [])
    ended = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    job = _job("Complete")
    job["status"]["completionTime"] = ended.isoformat().replace("+00:00", "Z")
    soon, _ = from_job(rt, job, [], None, now=ended + timedelta(seconds=30))
    assert soon.phase == "Running" and soon.reason == "AwaitingResult"
    assert "retrying" in (soon.message or "")
    late, _ = from_job(rt, job, [], None, now=ended + timedelta(seconds=RESULT_WAIT_SECONDS + 1))
    assert late.phase == "Failed" and late.reason == "NoResult"


def test_tensorrt_targets_are_refused_when_the_compile_image_cannot_build_for_the_runtime() -> None:
    from kompile.operator.target_step import tensorrt_refusal

    model = cm(
        fleet={"enabled": True, "precisions": ["fp16"]},
        rollout={"enabled": False, "tensorrtVersion": "10.13.3"},
        registry={"artifactStore": "s3://b/k"},
    )
    resolved = resolve_targets(model.spec, discover(FLEET))
    gpu = next(r for r in resolved if r.gpu)
    cpu = next(r for r in resolved if not r.gpu)
    mismatched = Settings(gpu_tensorrt_version="10.9.0", gpu_image="example/compile-gpu:trt10.9")
    why = tensorrt_refusal(model, gpu, mismatched)
    assert why and "10.13.3" in why and "10.9.0" in why and "example/compile-gpu:trt10.9" in why
    assert tensorrt_refusal(model, cpu, mismatched) is None  # CPU classes never build plans
    assert tensorrt_refusal(model, gpu, Settings(gpu_tensorrt_version="10.13.3")) is None
    unknown = tensorrt_refusal(model, gpu, Settings())
    assert unknown and "KOMPILE_GPU_TENSORRT_VERSION" in unknown
    no_trt = cm(targets=[{"name": "g", "backend": "inductor", "options": {"device": "cuda"}}])
    (rt,) = resolve_targets(no_trt.spec, discover(FLEET))
    assert tensorrt_refusal(no_trt, rt, mismatched) is None


def test_the_job_reads_what_the_operator_set_through_one_contract() -> None:
    """kompile.api.job_contract: the Job's environment is written by the operator's builder and
    read back by the Job's JobSpec.from_env; a missing variable is named."""

    model = cm(targets=[{"name": "gpu", "backend": "tensorrt", "options": {"optLevel": "4"}}])
    (rt,) = resolve_targets(model.spec, discover(FLEET))
    job = build_job(model, rt, "k" * 40, "s3://b/root/cache/ns/kkk", Settings(s3_endpoint="http://s3:9000"))
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    spec = JobSpec.from_env(env)
    assert spec.target == rt.target and spec.device == "cuda" and spec.hardware_class == rt.hardware_class
    assert spec.artifact_prefix == "s3://b/root/cache/ns/kkk" and spec.s3_endpoint == "http://s3:9000"
    assert spec.timing_cache_uri == "s3://b/root/timing-caches"
    assert (
        spec.compiled_model["metadata"]["uid"] == "u-1"
        and spec.compiled_model["spec"] == model.spec.to_wire()
    )
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert int(ExitCode.BAD_INPUT) in rules[1]["onExitCodes"]["values"]
    del env[JobEnv.ARTIFACT_PREFIX]
    with pytest.raises(JobContractError, match="KOMPILE_ARTIFACT_PREFIX is required"):
        JobSpec.from_env(env)


def test_result_json_is_one_model_for_both_sides() -> None:
    doc = JobResult(target=_result(), source_digest="sha256:d", backend_version="1.31.1")
    back = JobResult.loads(doc.dumps())
    assert back == doc and back.target.validation == _result().validation
    # Keys a newer Job adds are ignored rather than breaking an older operator.
    assert JobResult.loads('{"target": ' + _result().model_dump_json(by_alias=True) + ', "later": 1}')
    with pytest.raises(ValueError, match=r"not a kompile result\.json"):
        JobResult.loads('{"targets": []}')


def test_a_failed_alias_move_stays_pending_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow refusing an alias move is not marked done: status lists it as pending, a reconcile
    inside MLflow's backoff makes no call, the next one after it moves it, and a move already made
    costs no call. MLflow is a stand-in here."""
    from mlflow.exceptions import MlflowException

    from kompile import registry
    from kompile.api.status import CompiledModelStatus, RegistryStatus
    from kompile.operator import lineage
    from kompile.operator.lineage import move_alias
    from kompile.operator.outages import Breaker

    now = [0.0]
    monkeypatch.setattr(lineage, "BREAKER", Breaker(first=5.0, clock=lambda: now[0]))

    calls: list[tuple[str, str]] = []
    down = [True]

    def set_alias(uri: str, model: str, alias: str, version: str) -> None:
        calls.append((alias, version))
        if down[0]:
            raise MlflowException("503 Service Unavailable")

    monkeypatch.setattr(registry, "set_alias", set_alias)
    model = cm(
        targets=[{"name": "cpu", "backend": "onnxruntime"}], registry={"trackingUri": "http://mlflow:5000"}
    )
    status = CompiledModelStatus(registry=RegistryStatus(model_name="resnet", run_id="r"))
    target = _result().model_copy(update={"registered_version": "7"})
    events: list[tuple[str, str]] = []
    event = lambda kind, reason, message: events.append((kind, reason))  # noqa: E731
    assert not move_alias(model, status, Settings(), "cpu-x86", target, event)
    assert status.registry is not None
    assert status.registry.pending_aliases == [
        "cpu-x86: version 7 (MlflowException: 503 Service Unavailable)"
    ]
    assert events[-1] == ("Warning", "AliasFailed")
    registered = next(c for c in status.conditions if c.type == "Registered")
    assert (registered.status, registered.reason) == ("False", "RegistryUnavailable")
    down[0] = False
    assert not move_alias(model, status, Settings(), "cpu-x86", target, event)  # in the backoff
    assert len(calls) == 1 and status.registry.pending_aliases == ["cpu-x86: version 7 (MLflow unavailable)"]
    now[0] = 5.0
    assert move_alias(model, status, Settings(), "cpu-x86", target, event)
    assert status.registry.pending_aliases == [] and status.registry.aliases == {"cpu-x86": "7"}
    assert move_alias(model, status, Settings(), "cpu-x86", target, event)
    assert calls == [("cpu-x86", "7"), ("cpu-x86", "7")]  # the third found it done


def test_an_alias_move_mlflow_refused_waits_saying_it_was_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move MLflow refused (403: no permission on the model) waits out this model's own backoff;
    the pending entry says it was refused, not that MLflow is down. MLflow is a stand-in here."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    from kompile import registry
    from kompile.api.status import CompiledModelStatus, RegistryStatus
    from kompile.operator import lineage
    from kompile.operator.lineage import move_alias
    from kompile.operator.outages import Breaker

    monkeypatch.setattr(lineage, "BREAKER", Breaker(first=5.0))
    monkeypatch.setattr(lineage, "REFUSED", Breaker(first=60.0))

    def set_alias(uri: str, model: str, alias: str, version: str) -> None:
        raise MlflowException("no permission on model 'resnet'", error_code=PERMISSION_DENIED)

    monkeypatch.setattr(registry, "set_alias", set_alias)
    model = cm(
        targets=[{"name": "cpu", "backend": "onnxruntime"}], registry={"trackingUri": "http://mlflow:5000"}
    )
    status = CompiledModelStatus(registry=RegistryStatus(model_name="resnet", run_id="r"))
    target = _result().model_copy(update={"registered_version": "7"})
    assert not move_alias(model, status, Settings(), "cpu-x86", target, lambda *e: None)
    assert not move_alias(model, status, Settings(), "cpu-x86", target, lambda *e: None)  # its backoff
    assert status.registry is not None
    (pending,) = status.registry.pending_aliases
    assert "unavailable" not in pending and "refused" in pending, pending
    registered = next(c for c in status.conditions if c.type == "Registered")
    assert (registered.status, registered.reason) == ("False", "RegistryFailed")


def test_fleet_resources_size_every_fleet_compile_job_and_gpu_jobs_keep_their_gpu() -> None:
    """A model too big for the default 16Gi limit must be compilable in fleet mode too: before,
    fleet targets always got the defaults, with no field to raise them."""
    model = cm(fleet={"enabled": True, "resources": {"limits": {"memory": "48Gi"}}})
    resolved = {r.name: r for r in resolve_targets(model.spec, discover(FLEET))}
    cpu, gpu_target = resolved["cpu-amd64-fp32"], resolved["gpu-nvidia-l4-sm89-fp32"]
    assert cpu.resources == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "48Gi"}}
    assert gpu_target.resources["limits"] == {"memory": "48Gi", "nvidia.com/gpu": "1"}
    assert cpu.resources_field == "spec.fleet.resources"


def test_target_resources_merge_over_the_defaults_and_stay_consistent() -> None:
    """Before, a target's resources replaced the defaults whole: a TensorRT target given only a
    memory limit lost its nvidia.com/gpu and ran without a GPU. Merged, each key given wins; a
    default request never exceeds a limit given below it, nor a default limit a request above it."""
    l4 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}
    model = cm(
        targets=[
            {
                "name": "l4",
                "backend": "tensorrt",
                "hardware": {**l4, "resources": {"limits": {"memory": "32Gi"}}},
            },
            {
                "name": "small",
                "backend": "onnxruntime",
                "hardware": {"resources": {"limits": {"memory": "2Gi"}}},
            },
            {
                "name": "big",
                "backend": "onnxruntime",
                "hardware": {"resources": {"requests": {"memory": "40Gi"}}},
            },
            {
                "name": "two",
                "backend": "tensorrt",
                "hardware": {**l4, "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            },
        ]
    )
    r = {t.name: t for t in resolve_targets(model.spec, discover(FLEET))}
    assert r["l4"].resources == {
        "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
    }
    assert r["small"].resources == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert r["big"].resources == {"requests": {"cpu": "1", "memory": "40Gi"}, "limits": {"memory": "40Gi"}}
    # An extended resource's request must equal its limit.
    assert r["two"].resources["requests"]["nvidia.com/gpu"] == "2"
    assert r["small"].resources_field == "spec.targets[1].hardware.resources"


def test_an_oom_killed_compile_job_says_which_memory_limit_to_raise() -> None:
    """Exit code 137 alone left a user guessing; the pod says OOMKilled and the limit it hit."""
    model = cm(fleet={"enabled": True})
    rt = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.name == "cpu-amd64-fp32")
    pod = _pod("", 137)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    pod["spec"]["containers"] = [{"name": "compile", "resources": rt.resources}]
    failed, _ = from_job(rt, _job("Failed", "BackoffLimitExceeded"), [pod], None)
    assert failed.phase == "Failed" and failed.reason == "OutOfMemory"
    message = failed.message or ""
    assert "16Gi" in message and "spec.fleet.resources.limits.memory" in message, message


def _waiting_pod(node: str | None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"name": "compile", "image": "reg.example/compile:9"}]},
        "status": status,
    }


def test_a_compile_pod_that_cannot_start_says_why_while_its_job_runs() -> None:
    """A pod the scheduler cannot place, or whose image the node cannot pull, left the target at
    "waiting for a node" / "compile Job running" until the Job's deadline: the reason a user must act
    on (the scheduler's or the kubelet's words, and what to change) is in the target's status."""
    model = cm(fleet={"enabled": True})
    rt = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.name == "cpu-amd64-fp32")
    unschedulable = _waiting_pod(
        None,
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory.",
            }
        ],
    )
    stuck, _ = from_job(rt, _job(None), [unschedulable], None)
    assert stuck.phase == "Pending" and stuck.reason == "Unschedulable", stuck
    message = stuck.message or ""
    assert "0/3 nodes are available: 3 Insufficient memory." in message
    assert "spec.fleet.resources.requests" in message, message
    # Not yet looked at by the scheduler: no condition, nothing to say but that it waits.
    fresh, _ = from_job(rt, _job(None), [_waiting_pod(None, phase="Pending")], None)
    assert fresh.phase == "Pending" and fresh.reason is None

    def waiting(reason: str, text: str) -> dict[str, Any]:
        state = {"waiting": {"reason": reason, "message": text}}
        return _waiting_pod("n1", phase="Pending", containerStatuses=[{"name": "compile", "state": state}])

    pull, _ = from_job(rt, _job(None), [waiting("ImagePullBackOff", 'Back-off pulling image "x"')], None)
    assert pull.phase == "Pending" and pull.reason == "ImagePullBackOff" and pull.node == "n1"
    message = pull.message or ""
    assert "reg.example/compile:9" in message and "Back-off pulling image" in message
    assert "KOMPILE_CPU_IMAGE" in message, message
    config, _ = from_job(
        rt, _job(None), [waiting("CreateContainerConfigError", 'secret "s3-creds" not found')], None
    )
    assert config.reason == "CreateContainerConfigError" and 's3-creds" not found' in (config.message or "")
    # A container being created is not stuck.
    creating, _ = from_job(rt, _job(None), [waiting("ContainerCreating", "")], None)
    assert creating.phase == "Running" and creating.reason is None


def test_an_image_the_node_cannot_pull_names_the_one_setting_that_chose_it() -> None:
    """The pull error listed every image setting; the Job's pod says which one chose its image."""
    settings = Settings(env_images={"xla": "reg.example/xla:9"})
    model = cm(targets=[{"name": "x", "backend": "xla"}, {"name": "o", "backend": "onnxruntime"}])
    xla_rt, ort_rt = resolve_targets(model.spec, [])
    for rt, setting in ((xla_rt, "KOMPILE_ENV_IMAGES (xla)"), (ort_rt, "KOMPILE_CPU_IMAGE")):
        job = build_job(model, rt, "k", "s3://b/cache/ns/k", settings)
        pod = {
            "metadata": job["spec"]["template"]["metadata"],
            "spec": {**job["spec"]["template"]["spec"], "nodeName": "n1"},
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "compile",
                        "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                    }
                ],
            },
        }
        stuck, _ = from_job(rt, _job(None), [pod], None)
        message = stuck.message or ""
        assert f"(set by {setting})" in message, message
        assert "KOMPILE_GPU_IMAGE" not in message, message


def _unschedulable(said: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    return _waiting_pod(None, phase="Pending", conditions=[condition])


def test_a_pod_no_node_matches_says_to_check_the_selector_not_the_requests() -> None:
    """The scheduler found no node with the target's labels (a typo in a nodeSelector, a class
    whose nodes were relabelled): the advice was to lower the resource requests, which cannot help."""
    explicit = cm(
        targets=[{"name": "t", "backend": "onnxruntime", "hardware": {"nodeSelector": {"pool": "edge-typo"}}}]
    )
    (rt,) = resolve_targets(explicit.spec, discover(FLEET))
    said = (
        "0/9 nodes are available: 3 node(s) had untolerated taint(s), "
        "6 node(s) didn't match Pod's node affinity/selector."
    )
    stuck, _ = from_job(rt, _job(None), [_unschedulable(said)], None)
    message = stuck.message or ""
    assert stuck.reason == "Unschedulable" and said in message, message
    assert "spec.targets[0].hardware.nodeSelector" in message and "pool=edge-typo" in message, message
    assert "requests" not in message, message
    tainted = "0/3 nodes are available: 3 node(s) had untolerated taint(s)."
    stuck, _ = from_job(rt, _job(None), [_unschedulable(tainted)], None)
    assert "spec.targets[0].hardware.tolerations" in (stuck.message or ""), stuck.message
    # A fleet target's selector is its class's: the class's nodes are what is missing.
    model = cm(fleet={"enabled": True})
    fleet_rt = next(r for r in resolve_targets(model.spec, discover(FLEET)) if r.name == "cpu-amd64-fp32")
    stuck, _ = from_job(fleet_rt, _job(None), [_unschedulable(said)], None)
    assert "no node of hardware class cpu-amd64" in (stuck.message or ""), stuck.message
    # Both: the room is what to change where some nodes match but are full.
    full = (
        "0/4 nodes are available: 1 Insufficient memory, 3 node(s) didn't match Pod's node affinity/selector."
    )
    stuck, _ = from_job(rt, _job(None), [_unschedulable(full)], None)
    assert "spec.targets[0].hardware.resources.requests" in (stuck.message or ""), stuck.message


def test_a_compile_job_is_told_when_its_deadline_ends() -> None:
    """The Job counts its deadline from its creation, as the Job controller does: a retried pod
    knows how much is left (kompile.compile_jobs.build: no candidate starts in its last 20%)."""
    model = cm(targets=[{"name": "cpu", "backend": "onnxruntime"}])
    (rt,) = resolve_targets(model.spec, [])
    settings = Settings(job_deadline_seconds=1800)
    job = build_job(model, rt, "k" * 40, "s3://b/root/cache/ns/k", settings, created=1000.5)
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    told = JobSpec.from_env(env).deadline
    assert told == JobDeadline(created=1000.5, seconds=1800) and told.ends == 2800.5
    assert job["spec"]["activeDeadlineSeconds"] == 1800
    assert not told.stop_starting(2800.5 - 361) and told.stop_starting(2800.5 - 359)
    env[JobEnv.DEADLINE] = "soon"
    with pytest.raises(JobContractError, match="KOMPILE_JOB_DEADLINE='soon'"):
        JobSpec.from_env(env)


def test_a_job_past_its_deadline_says_which_setting_bounds_it() -> None:
    """DeadlineExceeded with the log tail left a tenant to find out that the operator's setting,
    not the spec, bounds a compile Job: the message names the deadline and where it is set."""
    (rt,) = resolve_targets(cm(targets=[{"name": "cpu", "backend": "onnxruntime"}]).spec, [])
    job = _job("Failed", "DeadlineExceeded")
    job["spec"] = {"activeDeadlineSeconds": 3600}
    stopped, _ = from_job(rt, job, [_pod("kompile-job: stopped by SIGTERM", 143)], None)
    assert stopped.phase == "Failed" and stopped.reason == "DeadlineExceeded"
    message = stopped.message or ""
    assert "3600 s" in message and "KOMPILE_JOB_DEADLINE_SECONDS" in message, message
    assert "jobs.deadlineSeconds" in message and "stopped by SIGTERM" in message, message


def test_a_running_target_says_what_its_job_is_doing() -> None:
    """ "compile Job running" said nothing for the minutes a Job runs: the line its Job last wrote
    to the store (kompile.compile_jobs.progress) is in the target's message, with its age."""
    from datetime import datetime

    from kompile.api.job_contract import JobProgress
    from kompile.operator.results import with_progress

    (rt,) = resolve_targets(cm(targets=[{"name": "cpu", "backend": "onnxruntime"}]).spec, [])
    running, _ = from_job(rt, _job(None), [_waiting_pod("n1", phase="Running")], None)
    told = JobProgress(
        line="[cpu/openvino] compiling with openvino 2025.3 at int8",
        at="2026-11-29T10:00:00Z",
        started="2026-11-29T09:48:00Z",
    )
    now = datetime(2026, 11, 29, 10, 0, 7, tzinfo=UTC)
    shown = with_progress(running, told, now)
    assert shown.message == (
        "compile Job running for 12 min: [cpu/openvino] compiling with openvino 2025.3 at int8 (7 s ago)"
    ), shown.message
    # Nothing told yet, or a target held up for a reason of its own: left as it was.
    assert with_progress(running.model_copy(), None, now).message == running.message
    stuck, _ = from_job(rt, _job(None), [_waiting_pod(None, phase="Pending")], None)
    assert with_progress(stuck, told, now).message == "waiting for a node"


def test_a_hold_up_is_told_once_not_at_each_kubelet_retry() -> None:
    from kompile.operator.results import held_up_anew

    assert held_up_anew(None, "Unschedulable") and held_up_anew(None, "ErrImagePull")
    assert not held_up_anew("Unschedulable", "Unschedulable")
    assert not held_up_anew("ErrImagePull", "ImagePullBackOff")
    assert not held_up_anew("ImagePullBackOff", "ErrImagePull")
    assert held_up_anew("Unschedulable", "ImagePullBackOff")
    assert not held_up_anew(None, None) and not held_up_anew("Unschedulable", "AwaitingResult")


def test_keys_in_a_tracking_uri_never_reach_status_or_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator whose MLFLOW_TRACKING_URI carries user:password@ (requests sends it as basic
    auth) registers every tenant's model there; MLflow's errors quote the request URL whole, so an
    outage put the operator's password in every tenant's Registered condition, Events and pending
    aliases. MLflow is a stand-in here: its message is the one MLflow 3 writes."""
    from mlflow.exceptions import MlflowException

    from kompile import registry
    from kompile.api.status import CompiledModelStatus, RegistryStatus
    from kompile.operator import lineage
    from kompile.operator.outages import Breaker

    monkeypatch.setattr(lineage, "BREAKER", Breaker(first=5.0))
    uri = "https://kompile:s3cret@mlflow.internal:5000"

    def refuse(tracking_uri: str, *args: object, **kwargs: object) -> None:
        raise MlflowException(
            f"API request to {tracking_uri}/api/2.0/mlflow/registered-models/alias failed with "
            "exception HTTPSConnectionPool(host='mlflow.internal', port=5000): Max retries exceeded"
        )

    monkeypatch.setattr(registry, "set_alias", refuse)
    model = cm(targets=[{"name": "cpu", "backend": "onnxruntime"}])
    status = CompiledModelStatus(registry=RegistryStatus(model_name="resnet", run_id="r"))
    target = _result().model_copy(update={"registered_version": "7"})
    events: list[str] = []
    event = lambda kind, reason, message: events.append(message)  # noqa: E731
    settings = Settings(tracking_uri=uri)
    assert not lineage.move_alias(model, status, settings, "cpu-x86", target, event)
    assert status.registry is not None
    shown = [c.message for c in status.conditions] + events + status.registry.pending_aliases
    assert any("mlflow.internal" in m for m in shown), shown
    assert not any("s3cret" in m for m in shown), shown
    assert registry.hide_userinfo(f"at {uri}/x and s3://k:v@bucket/p") == (
        "at https://mlflow.internal:5000/x and s3://bucket/p"
    )
