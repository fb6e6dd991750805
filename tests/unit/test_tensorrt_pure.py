"""The TensorRT backend's pure parts: profiles, plan header, Triton config, version matching, the
timing-cache key, options, and the clear error where TensorRT is missing. No GPU, no TensorRT."""

from __future__ import annotations

import builtins
import importlib.util
import itertools
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kompile.api.spec import InputSpec
from kompile.compile_jobs import triton
from kompile.compile_jobs.backends.base import BackendUnavailable, get_backend
from kompile.compile_jobs.trt import cache, plan, profiles
from kompile.operator import tensorrt_match as tm
from kompile.operator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _image(lo: int, opt: int, hi: int) -> InputSpec:
    return InputSpec.model_validate(
        {
            "name": "input",
            "shape": [-1, 3, 224, 224],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": lo, "opt": opt, "max": hi}],
        }
    )


# --- profiles -------------------------------------------------------------------------------------


def test_one_profile_for_a_narrow_batch_range() -> None:
    (p,) = profiles.derive_profiles([_image(1, 8, 16)])
    assert p.shapes["input"] == ((1, 3, 224, 224), (8, 3, 224, 224), (16, 3, 224, 224))
    assert profiles.triton_max_batch([p], batched=True) == 16
    assert profiles.describe([p]) == "1:8:16"


def test_wide_batch_range_is_split_and_each_piece_tuned() -> None:
    derived = profiles.derive_profiles([_image(1, 8, 256)])
    ranges = [(p.shapes["input"][0][0], p.shapes["input"][1][0], p.shapes["input"][2][0]) for p in derived]
    assert ranges == [(1, 8, 15), (16, 64, 256)]
    # Contiguous, covering min..max, each piece spanning less than the split ratio.
    assert all(b[0] == a[2] + 1 for a, b in itertools.pairwise(ranges))
    assert all(hi <= lo * profiles.DEFAULT_SPLIT_RATIO for lo, _, hi in ranges)
    # Triton's max_batch_size is the largest batch any profile serves: what the pipeline derives
    # from the signature (axis-0 max), so the config never promises more than the plan takes.
    assert profiles.triton_max_batch(derived, batched=True) == 256
    assert profiles.derive_profiles([_image(1, 8, 256)], split_ratio=0) == [
        profiles.Profile({"input": ((1, 3, 224, 224), (8, 3, 224, 224), (256, 3, 224, 224))})
    ]


def test_static_and_multi_input_profiles() -> None:
    static = InputSpec.model_validate({"name": "x", "shape": [2, 4]})
    (p,) = profiles.derive_profiles([static])
    assert p.shapes == {"x": ((2, 4), (2, 4), (2, 4))}
    assert profiles.triton_max_batch([p], batched=False) == 0
    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": 4, "max": 64},
        {"axis": 1, "name": "seq", "min": 8, "opt": 128, "max": 512},
    ]
    ids, mask = (
        InputSpec.model_validate({"name": n, "dtype": "int64", "shape": [-1, -1], "dynamicDims": dims})
        for n in ("ids", "mask")
    )
    derived = profiles.derive_profiles([ids, mask])
    assert len(derived) == 2
    for p in derived:  # every input shares the batch piece; seq keeps its own range
        assert p.shapes["ids"] == p.shapes["mask"]
        assert [s[1] for s in p.shapes["ids"]] == [8, 128, 512]


# --- plan header ----------------------------------------------------------------------------------


def _fake_plan(version: tuple[int, int, int, int], magic: bytes = b"ftrt") -> bytes:
    # Documented layout: magic at 0..3, serialization tag and sizes, version bytes at 24..27.
    return magic + bytes(range(4, 24)) + bytes(version) + b"\x00" * 64


def test_plan_header_version(tmp_path: Path) -> None:
    assert plan.parse_header(_fake_plan((10, 13, 3, 9))).version == "10.13.3.9"
    path = tmp_path / "model.plan"
    path.write_bytes(_fake_plan((11, 0, 0, 12)))
    header = plan.read_header(path)
    assert (header.major, header.minor, header.patch, header.build) == (11, 0, 0, 12)


def test_plan_header_refuses_other_files() -> None:
    with pytest.raises(plan.PlanHeaderError, match="not a TensorRT plan"):
        plan.parse_header(b"\x08\x07\x12\x07pytorch" + b"\x00" * 40)  # the start of an ONNX file
    with pytest.raises(plan.PlanHeaderError, match="truncated"):
        plan.parse_header(b"ftrt" + b"\x00" * 10)


# --- Triton config --------------------------------------------------------------------------------

IN = [triton.TensorSpec("input", "float32", (-1, 3, 224, 224))]
OUT = [triton.TensorSpec("logits", "float32", (-1, 1000))]


def test_triton_config_unchanged_without_new_arguments() -> None:
    text = triton.config_pbtxt("resnet", "tensorrt_plan", IN, OUT, 32, "KIND_GPU")
    assert "cc_model_filenames" not in text and "optimization" not in text
    assert 'platform: "tensorrt_plan"\nmax_batch_size: 32\n' in text
    assert "dims: [ 3, 224, 224 ]" in text and "kind: KIND_GPU" in text


def test_triton_config_with_plans_per_compute_capability_and_cuda_graphs() -> None:
    ccs = {cc: triton.cc_plan_filename(cc) for cc in ("8.6", "8.0", "9.0")}
    text = triton.config_pbtxt(
        "resnet", "tensorrt_plan", IN, OUT, 32, "KIND_GPU", cc_model_filenames=ccs, cuda_graphs=True
    )
    block = text[text.index("cc_model_filenames [") : text.index("input [")]
    keys = re.findall(r'key: "([\d.]+)"\n    value: "([\w.]+)"', block)
    assert keys == [("8.0", "model_sm80.plan"), ("8.6", "model_sm86.plan"), ("9.0", "model_sm90.plan")]
    assert text.endswith("optimization {\n  cuda {\n    graphs: true\n  }\n}\n")
    with pytest.raises(ValueError, match=r"major\.minor"):
        triton.config_pbtxt("m", "tensorrt_plan", IN, OUT, 1, cc_model_filenames={"sm86": "a.plan"})
    with pytest.raises(ValueError, match=r"major\.minor"):
        triton.cc_plan_filename("86")


# --- version matching -----------------------------------------------------------------------------


def test_parse_and_compare_versions() -> None:
    v = tm.parse_trt_version("10.13.3.9")
    assert (v.major, v.minor, v.patch, v.build) == (10, 13, 3, 9) and str(v) == "10.13.3.9"
    assert v.same_release(tm.parse_trt_version("10.13.3"))  # build unknown on one side
    assert not v.same_release(tm.parse_trt_version("10.13.3.10"))
    assert not v.same_release(tm.parse_trt_version("10.13.2.9"))
    assert not tm.parse_trt_version("10.13").same_release(v)  # no patch: cannot vouch for a plan
    with pytest.raises(ValueError, match=r"major\.minor\.patch"):
        tm.parse_trt_version("ten")


def test_refusal_messages() -> None:
    image = "ghcr.io/kompile/compile-gpu:0.1.0"
    assert tm.refusal(None, "10.13.3.9", image) is None  # serving follows the compile image
    assert tm.refusal("10.13.3", "10.13.3.9", image) is None
    mismatch = tm.refusal("10.7.0.23", "10.13.3.9", image)
    assert mismatch is not None
    assert "TensorRT 10.7.0.23" in mismatch and "TensorRT 10.13.3.9" in mismatch and image in mismatch
    assert "spec.rollout.tensorrtVersion" in mismatch and "KOMPILE_GPU_IMAGE" in mismatch
    unknown = tm.refusal("10.7.0.23", None, image)
    assert unknown is not None and "KOMPILE_GPU_TENSORRT_VERSION" in unknown
    vague = tm.refusal("10.7", "10.7.0.23", image)
    assert vague is not None and "patch" in vague
    bad = tm.refusal("latest", "10.7.0.23", image)
    assert bad is not None and "spec.rollout.tensorrtVersion" in bad


def test_triton_runtime_version() -> None:
    assert tm.triton_runtime_version("8.5.1") == "22.11-py3"
    assert tm.triton_runtime_version("8.4.2.4") == "22.08-py3"
    assert tm.triton_runtime_version("8.4.2.5") is None  # another build of that patch: not vouched for
    assert tm.triton_runtime_version("10.13.3.9") is None  # no confirmed row: runtime default
    assert tm.triton_runtime_version("10.13.3.9", override="25.10-py3") == "25.10-py3"
    for row in tm.TRITON_RELEASES:  # every row parses
        tm.parse_trt_version(row)


def test_settings_read_tensorrt_fields() -> None:
    s = Settings.from_env(
        {
            "KOMPILE_GPU_TENSORRT_VERSION": "10.13.3.9",
            "KOMPILE_SERVING_TENSORRT_VERSION": "10.13.3",
            "KOMPILE_TRITON_RUNTIME_VERSION": "25.10-py3",
        }
    )
    assert (s.gpu_tensorrt_version, s.serving_tensorrt_version, s.triton_runtime_version) == (
        "10.13.3.9",
        "10.13.3",
        "25.10-py3",
    )
    assert Settings.from_env({}).gpu_tensorrt_version is None


# --- timing cache, options, missing TensorRT ------------------------------------------------------


def test_timing_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = cache.timing_cache_relpath("gpu-NVIDIA-A100-SXM4-80GB-sm80", "10.13.3.9")
    assert rel == "gpu-NVIDIA-A100-SXM4-80GB-sm80/tensorrt-10.13.3.9.cache"
    assert cache.timing_cache_relpath("a b/../c", "1") == "a-b-..-c/tensorrt-1.cache"
    monkeypatch.delenv(cache.ENV_DIR, raising=False)
    assert cache.timing_cache_root() is None
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    assert cache.timing_cache_root() == tmp_path
    assert cache.timing_cache_root("/elsewhere") == Path("/elsewhere")


def test_options_parse_with_clear_errors() -> None:
    from kompile.api.catalog import CATALOG, OptionsError
    from kompile.api.catalog.tensorrt import TensorRTOptions

    parse = CATALOG["tensorrt"].parse_options
    opts = parse({"workspaceMiB": "1024", "optLevel": "5", "excludeOps": "Softmax,LayerNormalization"})
    assert isinstance(opts, TensorRTOptions)
    assert opts.workspace_mi_b == 1024 and opts.high_precision == "fp16"
    assert opts.exclude_ops == "Softmax,LayerNormalization"  # case kept: op types are case-sensitive
    assert opts.record()["workspaceMiB"] == "1024"
    with pytest.raises(OptionsError, match="unknown tensorrt option"):
        parse({"fp16": "true"})
    with pytest.raises(OptionsError, match=r"optLevel='7': use one of"):
        parse({"optLevel": "7"})
    with pytest.raises(OptionsError, match="non-negative integer"):
        parse({"workspaceMiB": "lots"})
    with pytest.raises(OptionsError, match="workspaceMiB='0'"):
        parse({"workspaceMiB": "0"})


def test_backend_imports_without_tensorrt_and_says_where_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("tensorrt")
    assert backend.name == "tensorrt" and backend.entry.devices == ("cuda",)
    assert backend.precisions == frozenset({"fp32", "fp16", "bf16", "int8"})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt" else real_find_spec(name, *a)
    )
    reason = backend.unavailable_reason()
    assert reason is not None and "compile-gpu image" in reason and "pip install tensorrt" in reason
    real_import = builtins.__import__

    def no_tensorrt(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tensorrt":
            raise ImportError("No module named 'tensorrt'", name="tensorrt")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorrt)
    from kompile.compile_jobs.trt import engine

    with pytest.raises(BackendUnavailable, match="compile-gpu image"):
        engine.import_tensorrt()
    assert backend.version().startswith("unknown+nvidia-modelopt=")  # no TensorRT here


def test_modelopt_pins_match_the_extra() -> None:
    """requirements/modelopt.txt (the venv, --no-deps) and the tensorrt extra (images) pin the same."""
    pins = {
        line.split("==")[0].lower(): line.split("==")[1]
        for line in (ROOT / "requirements" / "modelopt.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "tensorrt"
    ]
    extra_pins = {r.split("==")[0].lower(): r.split("==")[1] for r in extra if "==" in r}
    assert extra_pins == pins
    assert "nvidia-modelopt" in pins and not any("onnxruntime" in p for p in pins)


def test_timing_cache_travels_through_the_store(tmp_path: Path) -> None:
    """A GPU Job pulls its class's timing cache before the build and pushes it back when it grew,
    so the next build of that class (on any node) starts from it."""
    from kompile.compile_jobs.trt.cache import store_sync

    store = (tmp_path / "store" / "timing-caches").as_uri()
    first = store_sync(store, tmp_path / "job1", "gpu-nvidia-l4-sm89", "10.13.3.9", None)
    assert not first.pull() and not first.push()  # nothing stored, nothing built
    first.local.parent.mkdir(parents=True)
    first.local.write_bytes(b"tactics v1")
    assert first.push()
    assert not first.push()  # unchanged since: no write
    second = store_sync(store, tmp_path / "job2", "gpu-nvidia-l4-sm89", "10.13.3.9", None)
    assert second.pull() and second.local.read_bytes() == b"tactics v1"
    assert second.remote.endswith("/gpu-nvidia-l4-sm89/tensorrt-10.13.3.9.cache")
    other = store_sync(store, tmp_path / "job3", "gpu-nvidia-h100-sm90", "10.13.3.9", None)
    assert not other.pull()  # another class's timings never apply
