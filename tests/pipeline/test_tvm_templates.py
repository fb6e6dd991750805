"""Register-blocked convolution schedules (kompile.compile_jobs.envs.tvm_templates), in the tvm
environment: every tile offered for a convolution, including those whose last tile along a row or
across the channel blocks is narrower, built and run against the unscheduled kernel on the same
inputs (bias, residual add and ReLU fused in, padding, stride 2)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pipeline.conftest import require_environment, run_in_environment

CASES = """
import json
import numpy as np
import tvm
from tvm import te, topi
from kompile.compile_jobs.envs.tvm_templates import Variant, conv_extents, registers, schedule, variants


def kernel(channels, outputs, size, k, stride, residual):
    # as kompile's blocked layout legalizes a convolution: NCHW8c x OIHW8o, then its epilogue
    data = te.placeholder((1, channels // 8, size, size, 8), name="data")
    weight = te.placeholder((outputs // 8, channels, k, k, 8), name="weight")
    bias = te.placeholder((1, outputs // 8, 1, 1, 8), name="bias")
    conv = topi.nn.conv2d_NCHWc_OIHWo(data, weight, stride, k // 2, 1, "NCHW8c", "NCHW8c")
    out = topi.add(conv, bias)
    args = [data, weight, bias]
    if residual:
        skip = te.placeholder([int(d) for d in out.shape], name="skip")
        out = topi.add(out, skip)
        args.append(skip)
    out = topi.nn.relu(out)
    shapes = [[int(d) for d in t.shape] for t in (*args, out)]
    return te.create_prim_func([*args, out]), shapes


def run(mod, feeds):
    lib = tvm.compile(mod, target="llvm")  # correctness only: the host's generic ISA
    args = [tvm.runtime.tensor(f) for f in feeds]
    lib(*args)
    return args[-1].numpy()


report = {}
rng = np.random.default_rng(0)
for name, shape in {
    "1x1 7x7 residual": (64, 32, 7, 1, 1, True),
    "1x1 14x14": (32, 24, 14, 1, 1, False),
    "3x3 7x7 padded": (16, 32, 7, 3, 1, False),
    "1x1 stride 2 14x14": (32, 32, 14, 1, 2, False),
}.items():
    func, shapes = kernel(*shape)
    extents = conv_extents(tvm.IRModule({"main": func}))
    offered = variants(extents, registers(8, "x86_64"))
    # the narrower last tiles, whether or not they are among the offered ones
    tried = {*offered, Variant(3, 4, 8), Variant(4, 3, 8), Variant(5, 2, 8)}
    feeds = [rng.standard_normal(s).astype("float32") for s in shapes[:-1]]
    feeds.append(np.zeros(shapes[-1], "float32"))
    expected = run(tvm.IRModule({"main": func}), [f.copy() for f in feeds])
    errors = {}
    for v in sorted(tried, key=lambda v: (v.pixels, v.vectors)):
        got = run(schedule(tvm.IRModule({"main": func}), v).mod, [f.copy() for f in feeds])
        errors[f"{v.pixels}x{v.vectors}"] = float(np.abs(got - expected).max())
    report[name] = {
        "extents": extents,
        "offered": [f"{v.pixels}x{v.vectors}" for v in offered],
        "errors": errors,
        "scale": float(np.abs(expected).max()),
    }
print(json.dumps(report))
"""


def test_every_tile_including_narrower_last_ones_computes_the_convolution(tmp_path: Path) -> None:
    require_environment("tvm")
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    report = json.loads(run_in_environment("tvm", [str(script)], tmp_path).strip().splitlines()[-1])
    assert set(report) == {"1x1 7x7 residual", "1x1 14x14", "3x3 7x7 padded", "1x1 stride 2 14x14"}
    # A 7-wide row of 4 channel blocks: the 3x4 tile's row ends in a 1-pixel tile, the 4x3 tile's
    # channels in a 1-block one; both are offered (AVX2: up to 12 accumulators), fullest first.
    seven = report["1x1 7x7 residual"]
    assert seven["extents"] == [1, 4, 7, 7, 8, 64, 1, 1]
    assert seven["offered"][:3] == ["3x4", "4x3", "6x2"]
    assert report["1x1 stride 2 14x14"]["extents"][2:4] == [7, 7]
    for name, case in report.items():
        assert case["scale"] > 1, name  # the convolution's output is not all zeros after the ReLU
        assert len(case["errors"]) >= 3, name
        for tile, error in case["errors"].items():
            assert error <= 1e-4 * case["scale"], (name, tile, error)
