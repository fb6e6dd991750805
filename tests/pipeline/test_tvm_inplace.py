"""Residual adds in place (kompile.compile_jobs.envs.tvm_inplace), in the tvm environment: which
kernel calls may write into an operand, on small Relax modules whose answers are known, each built
and run before and after the rewrite; and on a residual block built by the backend end to end."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kompile.compile_jobs.backends.base import Feeds
from tests.pipeline.conftest import cnn_feeds, require_environment, run_in_environment
from tests.pipeline.test_tvm_backend import _build_matching

CASES = """
import json
import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T
from kompile.compile_jobs.envs.tvm_inplace import residual_in_place, writes_into

F = R.Tensor((2, 8), "float32")


@I.ir_module
class Mod:
    @T.prim_func(s_tir=True)
    def double(x: T.Buffer((2, 8), "float32"), y: T.Buffer((2, 8), "float32")):
        for i, j in T.grid(2, 8):
            with T.sblock("double"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = x[vi, vj] * T.float32(2)

    @T.prim_func(s_tir=True)
    def add_relu(
        x: T.Buffer((2, 8), "float32"), r: T.Buffer((2, 8), "float32"), y: T.Buffer((2, 8), "float32")
    ):
        for i, j in T.grid(2, 8):
            with T.sblock("add_relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.max(x[vi, vj] - T.float32(1) + r[vi, vj], T.float32(0))

    @T.prim_func(s_tir=True)
    def shifted(
        x: T.Buffer((2, 8), "float32"), r: T.Buffer((2, 8), "float32"), y: T.Buffer((2, 8), "float32")
    ):
        # reads r one column over: in place, a column would read its neighbour's new value
        for i, j in T.grid(2, 8):
            with T.sblock("shifted"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = x[vi, vj] + r[vi, (vj + 1) % 8]

    @T.prim_func(s_tir=True)
    def sum_then_add(
        x: T.Buffer((2, 8), "float32"), r: T.Buffer((2, 8), "float32"), y: T.Buffer((2, 8), "float32")
    ):
        # the output is first written by a reduction that does not read r: r would be lost in place
        for i, j, k in T.grid(2, 8, 8):
            with T.sblock("sum"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    y[vi, vj] = T.float32(0)
                y[vi, vj] = y[vi, vj] + x[vi, vk]
        for i, j in T.grid(2, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = y[vi, vj] + r[vi, vj]

    @R.function
    def dead(x: F) -> F:
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.add_relu, (x, a), out_ty=F)
            R.output(c)
        return c

    @R.function
    def chain(x: F) -> F:
        # c written into a, then e into c: both into a's storage, each dead after its call
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.add_relu, (x, a), out_ty=F)
            e = R.call_tir(cls.add_relu, (x, c), out_ty=F)
            R.output(e)
        return e

    @R.function
    def either_operand(x: F) -> F:
        # the same kernel written into its second operand, then into its first
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.add_relu, (x, a), out_ty=F)
            b = R.call_tir(cls.double, (c,), out_ty=F)
            e = R.call_tir(cls.add_relu, (b, c), out_ty=F)
            R.output(e)
        return e

    @R.function
    def live(x: F) -> R.Tuple(F, F):
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.add_relu, (x, a), out_ty=F)
            out = (c, a)
            R.output(out)
        return out

    @R.function
    def inputs(x: F, y: F) -> F:
        cls = Mod
        with R.dataflow():
            c = R.call_tir(cls.add_relu, (x, y), out_ty=F)
            R.output(c)
        return c

    @R.function
    def viewed(x: F) -> R.Tuple(F, R.Tensor((16,), "float32")):
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            v = R.reshape(a, (16,))
            c = R.call_tir(cls.add_relu, (x, a), out_ty=F)
            out = (c, v)
            R.output(out)
        return out

    @R.function
    def neighbour(x: F) -> F:
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.shifted, (x, a), out_ty=F)
            R.output(c)
        return c

    @R.function
    def reduction_first(x: F) -> F:
        cls = Mod
        with R.dataflow():
            a = R.call_tir(cls.double, (x,), out_ty=F)
            c = R.call_tir(cls.sum_then_add, (x, a), out_ty=F)
            R.output(c)
        return c


KERNELS = ("double", "add_relu", "shifted", "sum_then_add")


def run(mod, feeds):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(f) for f in feeds]
    calls = []
    for _ in range(2):  # twice: the second call must not see what the first one wrote
        y = vm["main"](*args)
        calls.append([t.numpy() for t in (y if not hasattr(y, "numpy") else [y])])
    return calls, all(np.array_equal(a.numpy(), f) for a, f in zip(args, feeds))


rng = np.random.default_rng(0)
report = {}
for case in ("dead", "chain", "either_operand", "live", "inputs", "viewed", "neighbour", "reduction_first"):
    mod = tvm.IRModule({gv: f for gv, f in Mod.functions.items() if gv.name_hint in KERNELS})
    mod["main"] = Mod[case].with_attr("global_symbol", "main")
    feeds = [rng.standard_normal((2, 8)).astype("float32") for _ in Mod[case].params]
    expected, _ = run(mod, feeds)
    rewritten, count = residual_in_place(mod)
    got, intact = run(rewritten, feeds)
    same = all(np.array_equal(a, b) for e, g in zip(expected, got) for a, b in zip(e, g))
    in_place = sorted(gv.name_hint for gv in rewritten.functions if "_inplace" in gv.name_hint)
    report[case] = {"count": count, "same": same, "inputs_intact": intact, "in_place": in_place}
print(json.dumps(report))
"""


def test_only_kernels_that_read_each_element_before_writing_it_and_dead_operands_go_in_place(
    tmp_path: Path,
) -> None:
    require_environment("tvm")
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    report = json.loads(run_in_environment("tvm", [str(script)], tmp_path).strip().splitlines()[-1])
    counts = {case: r["count"] for case, r in report.items()}
    assert counts == {
        "dead": 1,  # the residual a, dead after the add
        "chain": 2,  # c into a, e into c (a's storage)
        "either_operand": 2,  # c into a (its second operand), e into b (its first)
        "live": 0,  # a is returned
        "inputs": 0,  # the caller's tensors are never written
        "viewed": 0,  # a reshape shares a's storage and is returned
        "neighbour": 0,  # reads r one column over
        "reduction_first": 0,  # the output is written before r is read
    }
    assert report["dead"]["in_place"] == ["add_relu_inplace1"]
    assert report["either_operand"]["in_place"] == ["add_relu_inplace0", "add_relu_inplace1"]
    for case, r in report.items():
        assert r["same"] and r["inputs_intact"], case


class Bottleneck(torch.nn.Module):
    """A ResNet block: relu(conv(relu(conv(y))) + y), all convolutions blocked (16 channels)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.reduce = torch.nn.Conv2d(16, 16, 1)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        y = torch.relu(self.conv(torch.relu(self.reduce(y))) + y)
        return self.head(y.mean(dim=(2, 3)))


def test_a_tuned_residual_block_writes_into_its_residual_and_matches_eager(tmp_path: Path) -> None:
    require_environment("tvm")
    feeds: list[Feeds] = cnn_feeds(2)
    torch.manual_seed(3)
    model = Bottleneck().eval()
    artifact, _ = _build_matching(
        model,
        feeds,
        tmp_path / "tuned",
        tmp_path / "db",
        tuningTrials="16",
        tuningMinutes="5",
        tuningVerify="0",
    )
    # The last convolution's kernel adds y, which the first one read before: it writes into y.
    assert artifact.options["residualInPlace"] == "1"
    # Untuned, the add is its own block beside the convolution's: left as it was.
    untuned, _ = _build_matching(model, feeds, tmp_path / "untuned", tmp_path / "empty", tuningTrials="0")
    assert untuned.options["residualInPlace"] == "0"
