"""The IREE backend for real on a small CNN, in its own environment (scripts/setup-backend-env.sh
iree; `make test` builds it): the ONNX export here, IREE's ONNX importer and iree-compile there, the
`.vmfb` validated against eager and timed by the IREE runtime in that environment's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kompile.api.spec import InputSpec, Target
from kompile.compile_jobs import run_results
from kompile.compile_jobs.backends.base import BackendError, Feeds, get_backend
from kompile.compile_jobs.backends.iree import (
    compile_flags,
    cuda_flags,
    cuda_target,
    extra_flags,
    target_flags,
)
from kompile.compile_jobs.benchmark import SelfTimed
from kompile.compile_jobs.build import compile_request
from kompile.compile_jobs.environments import EnvironmentMissing, find_environment
from kompile.compile_jobs.validate import resolve_thresholds
from tests.pipeline.conftest import (
    IMAGE,
    cnn_feeds,
    compile_for_a_stood_in_gpu,
    contrib_attention_request,
    run_static_target,
    torchscript_onnx,
)


@pytest.fixture(scope="module", autouse=True)
def _iree_environment() -> None:
    """`make test` builds it; run by hand without it, each test fails saying how to build it (a
    skip would let CI pass without ever running IREE)."""
    try:
        find_environment("iree")
    except EnvironmentMissing as missing:
        pytest.fail(str(missing))


@pytest.fixture(scope="module")
def feeds() -> list[Feeds]:
    return cnn_feeds(4)


def _build(
    onnx_path: Path, module: Any, signature: list[InputSpec], feeds: list[Feeds], out: Path, **options: str
) -> tuple[Any, Any, Any]:
    target = Target(name="cpu-iree", backend="iree", precision="fp32", options=options or None)
    request = compile_request(
        target, module=module, onnx_path=onnx_path, out_dir=out, signature=signature, feeds=feeds, threads=2
    )
    backend = get_backend("iree")
    artifact = backend.compile(request)
    runner = backend.load(artifact, threads=2)
    outputs = request.reference.with_outputs("iree-fp32", [runner.run(f) for f in feeds])
    return artifact, runner, run_results.compare(request.reference, outputs, resolve_thresholds("fp32"))


@pytest.fixture(scope="module")
def tuned(feeds: list[Feeds], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    from models.small import small_cnn

    out = tmp_path_factory.mktemp("tuned")
    model = small_cnn()
    path = torchscript_onnx(
        model, feeds[0], out / "small.onnx", {"input": {0: "batch"}, "output": {0: "batch"}}, "output"
    )
    return _build(path, model, [IMAGE], feeds, out)


def test_tuned_vmfb_matches_eager_at_the_static_shape_and_is_timed_in_its_environment(
    tuned: tuple[Any, Any, Any], feeds: list[Feeds]
) -> None:
    artifact, runner, verdict = tuned
    try:
        assert verdict.passed, verdict.failures
        assert min(o.cosine for o in verdict.outputs) > 0.99999
        assert artifact.model_path.name == "model.vmfb" and artifact.serving is None
        o = artifact.options
        assert o["threads"] == "2" and o["flags"] == "tuned" and o["targetCpu"] == "class"
        # A dynamic batch is fixed at the signature's opt: IREE's CPU tiling wants static shapes.
        assert o["exportedStatic"] == "input=[1, 3, 32, 32]"
        assert "--iree-global-opt-use-im2col-for-convs" in o["compileFlags"].split()
        assert o["compileFlags"].startswith("--iree-llvmcpu-target-cpu=")
        assert artifact.toolchain["iree-base-compiler"] == "3.13.0" and "onnx" in artifact.toolchain
        assert runner.output_names == ["output"]
        timed = runner.timed(feeds[0])
        assert isinstance(timed, SelfTimed) and timed.ns > 0
        with pytest.raises(
            BackendError, match=r"compiled at the static shapes \{'input': \[1, 3, 32, 32\]\}"
        ):
            runner.run({"input": np.zeros((2, 3, 32, 32), np.float32)})
    finally:
        runner.close()


def test_iree_default_flags_name_only_the_cpu(feeds: list[Feeds], tmp_path: Path) -> None:
    from models.small import small_cnn

    model = small_cnn()
    path = torchscript_onnx(model, feeds[0], tmp_path / "small.onnx", {"input": {0: "batch"}}, "output")
    artifact, runner, verdict = _build(
        path, model, [IMAGE], feeds[:2], tmp_path, flags="default", targetCpu="host"
    )
    runner.close()
    assert verdict.passed, verdict.failures
    assert artifact.options["compileFlags"] == "--iree-llvmcpu-target-cpu=host"


def test_an_op_iree_cannot_lower_is_named(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("LpPool", ["input"], ["output"], kernel_shape=[2, 2])
    graph = helper.make_graph(
        [node],
        "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 7, 7])],
    )
    path = tmp_path / "lppool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    spec = InputSpec.model_validate({"name": "input", "shape": [1, 1, 8, 8]})
    target = Target(name="cpu-iree", backend="iree", precision="fp32")
    feed = {"input": np.ones((1, 1, 8, 8), np.float32)}
    request = compile_request(target, onnx_path=path, out_dir=tmp_path, signature=[spec], feeds=[feed])
    with pytest.raises(
        BackendError, match="IREE has no lowering for the ONNX op LpPool; replace that construct in the model"
    ):
        get_backend("iree").compile(request)


def test_a_graph_named_otherwise_than_torchs_export_loads(tmp_path: Path) -> None:
    """IREE names the function after the ONNX graph, and the runtime called `main_graph`, the name
    torch's exporter gives: a model from another exporter (tf2onnx's "tf2onnx", older torch's
    "torch-jit-export") compiled, then failed to load ("Function 'main_graph' not found")."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["0"], ["1"])],
        "torch-jit-export",
        [helper.make_tensor_value_info("0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("1", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    spec = InputSpec.model_validate({"name": "0", "shape": [1, 4]})
    feed = {"0": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
    _, runner, verdict = _build(path, None, [spec], [feed], tmp_path)
    assert verdict.passed, verdict
    (out,) = runner.run(feed)
    np.testing.assert_array_equal(out, [[0.0, 2.0, 0.0, 4.0]])


def test_ops_of_another_runtime_are_named_not_their_consumers(tmp_path: Path) -> None:
    # Measured on MiniLM after ONNX Runtime's transformer optimizer: the importer typed each
    # com.microsoft node's output as none and iree-compile blamed the MatMul after it.
    request = contrib_attention_request(tmp_path, "iree")
    with pytest.raises(BackendError) as info:
        get_backend("iree").compile(request)
    message = str(info.value)
    assert "com.microsoft.Attention" in message and "MatMul" not in message, message
    assert "as exported, before" in message, message


def test_kompile_run_validates_and_times_an_iree_target(kompile_run: Any, write_manifest: Any) -> None:
    run_static_target(kompile_run, write_manifest, "iree", "fp32")


def test_every_isa_a_class_can_have_names_an_llvm_cpu() -> None:
    """A class the fleet or this machine can be (kompile.operator.fleet.NFD_ISA, hardware.cpu_isa)
    must not fail its iree target for want of a table entry."""
    from kompile.operator.fleet import NFD_ISA

    for isa in {value for _, value in NFD_ISA} | {"sse", "neon"}:
        assert target_flags(isa, "class")[0].startswith("--iree-llvmcpu-target-cpu="), isa


def test_flags_come_from_the_class_isa_and_refuse_file_flags() -> None:
    assert target_flags("avx512vnni", "class") == [
        "--iree-llvmcpu-target-cpu=x86-64-v4",
        "--iree-llvmcpu-target-cpu-features=+avx512vnni",
    ]
    assert target_flags("avx2", "class") == ["--iree-llvmcpu-target-cpu=x86-64-v3"]
    assert target_flags("amx", "class") == [
        "--iree-llvmcpu-target-cpu=x86-64-v4",
        "--iree-llvmcpu-target-cpu-features=+avx512vnni,+avx512bf16",
    ]
    assert target_flags("neon", "host") == ["--iree-llvmcpu-target-cpu=host"]
    with pytest.raises(BackendError, match="no LLVM CPU for ISA 'riscv'; set option targetCpu host"):
        target_flags("riscv", "class")
    assert extra_flags("--iree-opt-strip-assertions --iree-llvmcpu-enable-ukernels=all") == [
        "--iree-opt-strip-assertions",
        "--iree-llvmcpu-enable-ukernels=all",
    ]
    # A word of the flag's name says it touches files, not a part of one: "direct" is no "dir".
    assert extra_flags("--iree-codegen-llvmgpu-use-direct-convolution=true") == [
        "--iree-codegen-llvmgpu-use-direct-convolution=true"
    ]
    for bad in (
        "--iree-hal-dump-executable-binaries-to=/tmp",
        "--iree-codegen-tuning-spec-path=/x.mlir",
        "--iree-llvmcpu-embedded-linker-path=/bin/ld",
        "--iree-hal-executable-object-search-paths=/x",
        "-o=/x",
        "--mlir-print-ir-after-all",
    ):
        with pytest.raises(BackendError, match="option extraFlags"):
            extra_flags(bad)
    from kompile.api.catalog.iree import IreeOptions

    opts = IreeOptions.model_validate({"flags": "default", "extraFlags": "--iree-opt-level=O2"})
    assert compile_flags(opts, "avx2") == ["--iree-llvmcpu-target-cpu=x86-64-v3", "--iree-opt-level=O2"]


def test_the_cuda_target_is_the_newest_iree_knows_at_or_below_the_gpu() -> None:
    # IREE 3.13 has no sm_90 or sm_100 target: Hopper and datacenter Blackwell run sm_89's PTX.
    assert cuda_target((9, 0)) == "sm_89" and cuda_target((10, 0)) == "sm_89"
    assert cuda_target((12, 0)) == "sm_120" and cuda_target((8, 6)) == "sm_86"
    assert cuda_target((8, 0)) == "sm_80" and cuda_target((7, 5)) == "sm_75"
    with pytest.raises(BackendError, match=r"compute capability 6\.0 and newer, not 5\.2"):
        cuda_target((5, 2))
    from kompile.api.catalog.iree import IreeOptions

    opts = IreeOptions.model_validate({"extraFlags": "--iree-opt-level=O2"})
    assert cuda_flags(opts, "sm_89") == [
        "--iree-hal-target-device=cuda",
        "--iree-cuda-target=sm_89",
        "--iree-opt-level=O2",
    ]


def _cuda_request(feeds: list[Feeds], out: Path) -> Any:
    from models.small import small_cnn

    model = small_cnn()
    path = torchscript_onnx(model, feeds[0], out / "small.onnx", {"input": {0: "batch"}}, "output")
    target = Target(name="gpu-iree", backend="iree", precision="fp32")
    return compile_request(
        target, module=model, onnx_path=path, out_dir=out, signature=[IMAGE], feeds=feeds[:2], device="cuda"
    )


def test_a_cuda_vmfb_is_compiled_for_the_gpus_target(
    feeds: list[Feeds], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iree-compile needs no GPU to emit PTX.
    refused = "the IREE runtime has no cuda device here"
    artifact = compile_for_a_stood_in_gpu("iree", _cuda_request(feeds, tmp_path), monkeypatch, refused)
    o = artifact.options
    assert (o["halDevice"], o["computeCapability"], o["cudaTarget"]) == ("cuda", "9.0", "sm_89")
    assert o["compileFlags"] == "--iree-hal-target-device=cuda --iree-cuda-target=sm_89"
    assert o["flags"] == "default"  # the option's default, tuned, names CPU flags
    assert "isa" not in o and "targetCpu" not in o
    # The module holds PTX for sm_89, which the driver compiles for the GPU at load.
    assert b".target sm_89" in artifact.model_path.read_bytes()
