"""The inductor backend on real small models: export, AOT-compile for the CPU, load the package back,
compare with eager. Each AOT compile of the small CNN takes about half a minute on two cores."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kompile.api.catalog import CATALOG, OptionsError  # noqa: E402
from kompile.api.spec import InputSpec, Precision, Target  # noqa: E402
from kompile.compile_jobs.backends.base import (  # noqa: E402
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    get_backend,
)
from kompile.compile_jobs.backends.inductor import (  # noqa: E402
    InductorBackend,
    dynamic_shapes,
    example_feed,
    example_sizes,
)
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402

Array = np.ndarray[Any, Any]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:  # the example factories live in examples/models
    sys.path.insert(0, str(EXAMPLES))

IMAGE = InputSpec.model_validate(
    {
        "name": "input",
        "shape": [-1, 3, 32, 32],
        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 16}],
    }
)


@pytest.fixture(scope="module")
def backend() -> InductorBackend:
    b = get_backend("inductor")
    assert isinstance(b, InductorBackend)
    if b.unavailable_reason():
        pytest.skip(b.unavailable_reason() or "")
    return b


def _feeds(batch: int, count: int, seed: int = 0) -> list[Feeds]:
    rng = np.random.default_rng(seed)
    return [{"input": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)} for _ in range(count)]


def _request(
    out: Path, module: Any, precision: Precision = "fp32", device: str = "cpu", **options: str
) -> CompileRequest:
    target = Target(name=f"t-{precision}", backend="inductor", precision=precision, options=options or None)
    feeds = _feeds(1, 2) if module is not None else []
    return compile_request(
        target, out_dir=out, signature=[IMAGE], feeds=feeds, module=module, threads=2, device=device
    )


def _eager(model: Any, feeds: list[Feeds]) -> list[list[Array]]:
    with torch.no_grad():
        return [[model(torch.from_numpy(f["input"])).numpy()] for f in feeds]


@pytest.fixture(scope="module")
def cnn() -> Any:
    from models.small import small_cnn

    return small_cnn()


@pytest.fixture(scope="module")
def cnn_fp32(
    backend: InductorBackend, cnn: Any, tmp_path_factory: pytest.TempPathFactory
) -> CompiledArtifact:
    return backend.compile(_request(tmp_path_factory.mktemp("fp32"), cnn))


def test_fp32_package_matches_eager_at_two_batch_sizes(
    backend: InductorBackend, cnn: Any, cnn_fp32: CompiledArtifact
) -> None:
    runner = backend.load(cnn_fp32, threads=2)
    assert runner.input_names == ["input"] and runner.output_names == ["output"]
    for batch in (1, 7):  # the example was traced at 2: both sizes exercise the dynamic batch dim
        feeds = _feeds(batch, 2, seed=batch)
        cand = [runner.run(f) for f in feeds]
        assert cand[0][0].shape == (batch, 10) and cand[0][0].dtype == np.float32
        err = max(float(np.abs(c[0] - r[0]).max()) for c, r in zip(cand, _eager(cnn, feeds), strict=True))
        assert err < 1e-4


def test_fp32_artifact_records_options_and_serving_layout(cnn_fp32: CompiledArtifact) -> None:
    assert cnn_fp32.model_path.name == "model.pt2" and cnn_fp32.model_path.is_file()
    serving = cnn_fp32.serving
    assert serving is not None
    assert (serving.kserve_format, serving.triton_platform, serving.files) == (
        "pytorch",
        "torch_aoti",
        ("model.pt2",),
    )
    opts = cnn_fp32.options
    assert opts["precision"] == "fp32" and opts["device"] == "cpu"
    assert opts["freezing"] == "true" and opts["maxAutotune"] == "false"
    assert opts["intraOpThreads"] == "2" and opts["inputOrder"] == "input"
    assert opts["exampleSizes"] == "batch=2"
    assert cnn_fp32.toolchain["torch"] == torch.__version__
    assert cnn_fp32.toolchain["cxx"] and "cuda" not in cnn_fp32.toolchain


def test_a_package_refuses_inputs_outside_its_names(
    backend: InductorBackend, cnn_fp32: CompiledArtifact
) -> None:
    runner = backend.load(cnn_fp32, threads=2)
    with pytest.raises(BackendError, match=r"inputs \['input'\] missing"):
        runner.run({"image": np.zeros((1, 3, 32, 32), np.float32)})


def test_bf16_builds_and_stays_close(backend: InductorBackend, cnn: Any, tmp_path: Path) -> None:
    artifact = backend.compile(_request(tmp_path, cnn, "bf16"))
    assert artifact.options["precision"] == "bf16"
    runner = backend.load(artifact, threads=2)
    feeds = _feeds(4, 2, seed=3)
    cand = [runner.run(f) for f in feeds]
    assert cand[0][0].dtype == np.float32  # cast back for validation against fp32 eager
    result = compare(_eager(cnn, feeds), cand, runner.output_names, resolve_thresholds("bf16"))
    assert result.passed, result.failures
    assert (result.outputs[0].cosine or 0) > 0.995


def test_export_failure_names_the_construct_and_line(
    backend: InductorBackend, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from models.small import data_dependent

    with pytest.raises(BackendError) as info:
        backend.compile(_request(tmp_path, data_dependent()))
    # torch.export prints the graph it traced so far (pages of it for a real model): into the build
    # folder's log, not amid kompile's progress.
    printed = "".join(capfd.readouterr())
    assert "def forward" not in printed and "torch.ops.aten" not in printed, printed[:2000]
    assert "def forward" in (tmp_path / "compile.log").read_text()
    message = str(info.value)
    assert "small.py:49" in message and "if x.sum().item() > 0:" in message
    assert "data-dependent" in message and "torch.where" in message
    assert "Graph breaks are not allowed in an ahead-of-time package" in message
    assert "DataDependentModel" in message
    assert not (tmp_path / "model.pt2").exists()


def test_onnx_source_is_refused(backend: InductorBackend, tmp_path: Path) -> None:
    with pytest.raises(
        BackendError, match=r"compiles from a PyTorch source.*is ONNX.*onnxruntime or tensorrt"
    ):
        backend.compile(_request(tmp_path, None))


def test_bad_options_say_what_is_accepted(backend: InductorBackend, cnn: Any, tmp_path: Path) -> None:
    parse = CATALOG["inductor"].parse_options
    with pytest.raises(OptionsError, match=r"unknown inductor option\(s\) \['maxAutoTune'\]; accepted"):
        parse({"maxAutoTune": "true"})
    with pytest.raises(OptionsError, match=r"option freezing='maybe': use true or false"):
        parse({"freezing": "maybe"})
    with pytest.raises(OptionsError, match="non-negative integer"):
        parse({"intraOpThreads": "-1"})
    assert parse({"maxAutotune": "TRUE"}).record()["maxAutotune"] == "true"
    # Refused when the target is written, long before a compile.
    with pytest.raises(ValueError, match=r"unknown inductor option\(s\) \['maxAutoTune'\]"):
        Target(name="t", backend="inductor", options={"maxAutoTune": "true"})
    # What depends on the build's device is refused by the compile.
    with pytest.raises(BackendError, match="cudaGraphs=true applies to cuda builds only"):
        backend.compile(_request(tmp_path, cnn, cudaGraphs="true"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu_is_unavailable(backend: InductorBackend, cnn: Any, tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="needs an NVIDIA GPU with CUDA"):
        backend.compile(_request(tmp_path, cnn, device="cuda"))


def test_example_sizes_avoid_specialized_and_equal_sizes() -> None:
    tokens = [
        InputSpec.model_validate(
            {
                "name": name,
                "dtype": "int64",
                "shape": [-1, -1],
                "dynamicDims": [
                    {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8},
                    {"axis": 1, "name": "seq", "min": 1, "opt": 2, "max": 128},
                ],
            }
        )
        for name in ("input_ids", "attention_mask")
    ]
    assert example_sizes(tokens) == {"batch": 2, "seq": 3}
    shapes = dynamic_shapes(tokens)
    assert shapes is not None and shapes[0] is not None and shapes[1] is not None
    assert shapes[0][0] is shapes[1][0]  # inputs sharing a dim name share the Dim
    feed = example_feed(tokens, [{"input_ids": np.array([[5]]), "attention_mask": np.array([[1]])}])
    assert feed["input_ids"].shape == (2, 3) and (feed["input_ids"] == 5).all()
    with pytest.raises(BackendError, match="lack model input 'attention_mask'"):
        example_feed(tokens, [{"input_ids": np.array([[5]])}])
