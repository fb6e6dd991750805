"""benchmarks/tvm_layers.py end to end on a small residual CNN (its tvm build untuned, on a database of
its own): each ONNX Runtime convolution paired with TVM's kernel of the same shapes at each thread
count, whatever order the two run a block's branches in; and the pairing itself on made-up profiles."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kompile.compile_jobs.tvm_database import ROOT_ENV
from tests.pipeline.conftest import require_environment, run_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "tvm_layers.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import tvm_layers  # noqa: E402


def test_small_residual_cnn_every_convolution_paired_at_each_thread_count(tmp_path: Path) -> None:
    require_environment("tvm")
    argv = [
        "--models",
        "small_residual",
        "--threads",
        "1,2",
        "--rounds",
        "1",
        "--calls",
        "3",
        "--warmup",
        "1",
    ]
    report = run_benchmark(SCRIPT, *argv, **{ROOT_ENV: str(tmp_path / "db")})
    assert report["machine"]["isa"]  # the figures' ISA travels with them
    (model,) = report["models"]
    assert model["tvm_build"]["options"]["tuningTrialsRun"] == "0"
    for threads in ("1", "2"):
        entry = model["by_threads"][threads]
        assert "unpaired" not in entry, entry.get("unpaired")
        convs = [layer["convolution"] for layer in entry["layers"]]
        # stem, the bottleneck's three, the shortcut
        assert sorted(convs) == sorted(
            [
                "3@32x32 -> 16@32x32",
                "16@32x32 -> 16@32x32",
                "16@32x32 -> 16@32x32",
                "16@32x32 -> 32@32x32",
                "16@32x32 -> 32@32x32",
            ]
        )
        for layer in entry["layers"]:
            assert layer["ort_ms"] > 0 and layer["tvm_ms"] > 0
            assert "conv2d" in layer["tvm_kernel"]
            # The ratio of the unrounded medians; the ms are rounded to the microsecond.
            assert layer["ratio"] == pytest.approx(layer["tvm_ms"] / layer["ort_ms"], rel=0.05)
        assert entry["tvm_whole_ms"] > 0 and entry["ort_whole_ms"] > 0
    assert model["by_threads"]["scaling_median"]["from_to"] == [1, 2]


def _profile(*kernels: tuple[str, str, float]) -> list[list[Any]]:
    return [list(k) for k in kernels]


def test_pairing_follows_shapes_not_order_and_takes_the_median_over_rounds() -> None:
    # ONNX Runtime runs the shortcut first, TVM the main path first: same shapes, other order.
    ort_rounds = [
        _profile(("64@56x56 -> 256@56x56", "shortcut", 1.0), ("64@56x56 -> 64@56x56", "main", 2.0)),
        _profile(("64@56x56 -> 256@56x56", "shortcut", 3.0), ("64@56x56 -> 64@56x56", "main", 4.0)),
        _profile(("64@56x56 -> 256@56x56", "shortcut", 2.0), ("64@56x56 -> 64@56x56", "main", 3.0)),
    ]
    tvm_rounds = [
        _profile(("64@56x56 -> 64@56x56", "k_main", 4.0), ("64@56x56 -> 256@56x56", "k_short", 2.0)),
        _profile(("64@56x56 -> 64@56x56", "k_main", 6.0), ("64@56x56 -> 256@56x56", "k_short", 1.0)),
        _profile(("64@56x56 -> 64@56x56", "k_main", 5.0), ("64@56x56 -> 256@56x56", "k_short", 3.0)),
    ]
    layers = tvm_layers._paired(ort_rounds, tvm_rounds)
    assert isinstance(layers, list)
    assert [(lay["shapes"], lay["tvm_kernel"]) for lay in layers] == [
        ("shortcut", "k_short"),
        ("main", "k_main"),
    ]
    assert [(lay["ort_ms"], lay["tvm_ms"], lay["ratio"]) for lay in layers] == [
        (2.0, 2.0, 1.0),
        (3.0, 5.0, 1.67),
    ]


def test_repeated_shapes_pair_in_order_and_a_missing_kernel_is_reported() -> None:
    ort = [_profile(("8@4x4 -> 8@4x4", "first", 1.0), ("8@4x4 -> 8@4x4", "second", 2.0))]
    tvm = [_profile(("8@4x4 -> 8@4x4", "k1", 3.0), ("8@4x4 -> 8@4x4", "k2", 8.0))]
    layers = tvm_layers._paired(ort, tvm)
    assert isinstance(layers, list)
    assert [(lay["shapes"], lay["tvm_kernel"], lay["ratio"]) for lay in layers] == [
        ("first", "k1", 3.0),
        ("second", "k2", 4.0),
    ]
    why = tvm_layers._paired(ort, [_profile(("8@4x4 -> 8@4x4", "k1", 3.0))])
    assert why == "ONNX Runtime ran 2 convolutions, TVM 1, not of the same shapes"


def test_convolution_keys_read_blocked_and_plain_shapes_alike() -> None:
    assert tvm_layers._conv_key([1, 4, 56, 56, 16], [1, 16, 56, 56, 16]) == "64@56x56 -> 256@56x56"
    assert tvm_layers._conv_key([1, 64, 56, 56], [1, 256, 56, 56]) == "64@56x56 -> 256@56x56"
    assert tvm_layers._conv_key([1, 1, 224, 224, 3], [1, 4, 112, 112, 16]) == "3@224x224 -> 64@112x112"


def test_a_kernel_written_into_its_residual_is_keyed_by_the_residuals_shape() -> None:
    data, weight, bias, residual = [1, 4, 56, 56, 16], [16, 32, 2, 2, 16], [8, 2, 16], [1, 16, 56, 56, 16]
    out = "64@56x56 -> 256@56x56"
    assert (
        tvm_layers.kernel_key(
            "fused_conv2d_NCHWc1_add2_add3_relu21_prepacked_inplace3", [data, weight, bias, residual]
        )
        == out
    )
    assert tvm_layers.kernel_key("fused_conv2d_NCHWc1_add21_prepacked", [data, weight, bias, residual]) == out
    # Written into argument 1: that argument, not the last, has the output's shape.
    assert tvm_layers.kernel_key("k_inplace1", [data, residual, bias]) == out
