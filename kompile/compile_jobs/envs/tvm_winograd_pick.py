"""Which 3x3 convolutions run as Winograd, measured in the model (`winograd: auto`; the `tvm`
environment's steps, kompile.compile_jobs.envs.tvm): the model is built twice with the tuned
database, every eligible convolution direct in one and Winograd F(4x4, 3x3) in the other; the two
run in this process in interleaved rounds, each kernel call timed by the VM's instrument, and a
convolution shape runs as Winograd where its three kernels (input transform, batched matmul, output
transform) took less time in the model than its direct kernel.

Why measured, not decided by a rule: whether Winograd pays depends on the CPU, the shape and the
tuning. On a 2-core AVX-512 AMD EPYC (2026-11-28), tuned 1000 trials, a 64->64 3x3 on 56x56 took
0.50 ms as Winograd against 1.05 direct (30-minute database), 0.64 against 1.10 with the caches
emptied before each call; a 128->128 on 28x28 0.45 against 1.07. On an Intel Xeon with 160 trials
the 64->64 took 1.77 ms against 1.59 direct, its transforms untuned; on a 14x14 image the 36
transformed weight matrices (4x the direct ones) serve only 16 tiles and leave the matmul waiting on
memory. Timed in the model, each convolution's weights arrive from memory as they do in use.

Imports only the standard library and this environment's packages.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROUNDS = 10
"""Interleaved rounds after a warm-up call: each calls both builds once, in a rotated order."""
START = "winograd_data"
"""The name of a Winograd convolution's first kernel (its input transform), fused or not."""
PART = "winograd"
"""In the name of each of its kernels: the transform, the batched matmul, the output transform."""

ConvShape = tuple[int, ...]
"""A convolution that could run as Winograd, as kompile.compile_jobs.envs.tvm's block_convolutions
lists and is told them: input channels, output channels, image height and width, then its padding."""
Call = tuple[str, float, tuple[int, ...]]
"""One kernel call: its name, its seconds, the shape of its first tensor argument."""


@dataclass
class Pick:
    winograd: set[ConvShape] = field(default_factory=set)
    """The shapes that run as Winograd."""
    costs: dict[ConvShape, tuple[float, float]] = field(default_factory=dict)
    """Each shape's milliseconds a model call, its convolutions summed: direct, Winograd."""
    seconds: float = 0.0

    def record(self) -> dict[str, str]:
        measured = "; ".join(
            f"{describe(shape)} {'winograd' if shape in self.winograd else 'direct'} "
            f"({direct:.3f} direct, {winograd:.3f} winograd ms)"
            for shape, (direct, winograd) in self.costs.items()
        )
        return {"winogradMeasured": measured, "winogradPickSeconds": f"{self.seconds:.1f}"}


def describe(shape: ConvShape) -> str:
    """A shape as the record names it: `64->64 56x56`."""
    return f"{shape[0]}->{shape[1]} {shape[2]}x{shape[3]}"


def align(direct: list[str], transformed: list[str], count: int) -> list[tuple[int, list[int]]]:
    """The kernel calls of the two builds of one model, in call order, paired: for each of the `count`
    Winograd convolutions, the index of the direct kernel it replaced and the indices of its own
    kernels. Every other kernel is in both, one for one. ValueError where the two do not pair so."""
    pairs: list[tuple[int, list[int]]] = []
    i = j = 0
    while j < len(transformed):
        if START in transformed[j]:
            k = j + 1
            while k < len(transformed) and PART in transformed[k] and START not in transformed[k]:
                k += 1
            pairs.append((i, list(range(j, k))))
            j = k
        else:
            j += 1
        i += 1
    if i != len(direct) or len(pairs) != count or any("conv2d" not in direct[d] for d, _ in pairs):
        raise ValueError(
            f"the two builds' kernels do not pair: {len(direct)} direct, {len(transformed)} with "
            f"{len(pairs)} of {count} convolutions as Winograd"
        )
    return pairs


def costs(
    direct: list[list[Call]], transformed: list[list[Call]], shapes: list[ConvShape]
) -> dict[ConvShape, tuple[float, float]]:
    """Each shape's milliseconds a call in the two builds (median over the rounds of its convolutions'
    sum in a round); `direct[r]` and `transformed[r]` are round r's kernel calls, `shapes` the
    eligible convolutions' in the graph's order. ValueError where a pair's input is not its shape's."""
    pairs = align([c[0] for c in direct[0]], [c[0] for c in transformed[0]], len(shapes))
    for (d, group), shape in zip(pairs, shapes, strict=True):
        for calls, index in ((direct[0], d), (transformed[0], group[0])):
            seen = calls[index][2]
            if len(seen) == 5 and (seen[1] * seen[4], seen[2], seen[3]) != (shape[0], *shape[2:4]):
                raise ValueError(f"kernel {calls[index][0]} reads {seen}, not {describe(shape)}")
    out: dict[ConvShape, tuple[float, float]] = {}
    for shape in dict.fromkeys(shapes):
        mine = [p for p, s in zip(pairs, shapes, strict=True) if s == shape]
        spent_direct = [sum(calls[d][1] for d, _ in mine) for calls in direct]
        spent_winograd = [sum(calls[k][1] for _, group in mine for k in group) for calls in transformed]
        out[shape] = (statistics.median(spent_direct) * 1e3, statistics.median(spent_winograd) * 1e3)
    return out


def pick(
    direct: Any,
    transformed: Any,
    shapes: list[ConvShape],
    target: Any,
    cores: int,
    feeds: list[Any],
    finish: Callable[[Any], Any],
) -> Pick:
    """Which of `shapes` run as Winograd: `direct` and `transformed` are the model's module with none
    and all of them as Winograd, `finish(mod)` the build's own post-processing (the database
    applied), `feeds` the model's inputs (numpy arrays)."""
    import tvm
    from tvm import relax

    start = time.monotonic()
    os.environ["TVM_NUM_THREADS"] = str(cores)  # before the runtime's pool first starts
    device = tvm.cpu()
    machines = [
        relax.VirtualMachine(tvm.compile(finish(m), target=target), device) for m in (direct, transformed)
    ]
    args = [tvm.runtime.tensor(a, device) for a in feeds]
    rounds: list[list[list[Call]]] = [[], []]
    for r in range(ROUNDS + 1):
        for j in ((r + k) % 2 for k in range(2)):
            calls = _timed_call(machines[j], args)
            if r:  # the first round warms the caches and the runtime's pool
                rounds[j].append(calls)
    measured = costs(rounds[0], rounds[1], shapes)
    return Pick(
        winograd={s for s, (d, w) in measured.items() if w < d},
        costs=measured,
        seconds=time.monotonic() - start,
    )


def _timed_call(vm: Any, args: list[Any]) -> list[Call]:
    """One call of the model's `main`: each kernel call in order (the VM's builtins left out)."""
    calls: list[Call] = []
    began: list[float] = [0.0]

    def instrument(_func: Any, symbol: str, before: bool, _ret: Any, *tensors: Any) -> int:
        name = str(symbol)
        if name.startswith("vm.builtin"):
            return 0
        if before:
            began[0] = time.perf_counter()
        else:
            seconds = time.perf_counter() - began[0]
            first = next((tuple(int(d) for d in t.shape) for t in tensors if hasattr(t, "shape")), ())
            calls.append((name, seconds, first))
        return 0  # VMInstrumentReturnKind: no-op, go on

    vm.set_instrument(instrument)
    vm["main"](*args)
    return calls
