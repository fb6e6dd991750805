"""Winograd F(4x4, 3x3) convolution on blocked activations (NCHW{lanes}c), for the `tvm`
environment's compile step (kompile.compile_jobs.envs.tvm): a 3x3 stride-1 convolution computes
each 4x4 output tile from a 6x6 input tile with 36 multiplications per channel pair instead of 144,
a quarter of the direct convolution's arithmetic on a full tile.

A convolution becomes three kernels, each an ordinary workload for MetaSchedule:
- the input transform (B^T d B per 6x6 tile and channel, as two 1-D passes): [36, tiles, CI];
- one batched matmul per transform point, [36, tiles, CI] x [36, CI, CO], its weights transformed
  once at build (G g G^T; folded into a constant, then prepacked like any kernel's);
- the output transform (A^T m A, two passes) written back in NCHW{lanes}c, where the bias and the
  activation after the convolution fuse.
The channels stay innermost throughout, so every pass vectorizes along them. The transform
matrices are small constant inputs, not TOPI's select-chain constants, which MetaSchedule's stock
Winograd rules must unroll to be fast and which left the transforms scalar in the blocked layout
(TOPI's NCHW Winograd compute read from NCHW16c: 3.8 ms for a 256-channel 14x14 convolution
against 1.9 ms direct, 128 trials each, on a loaded machine).

Which convolutions run so is measured (`winograd: auto`, the default; tvm_winograd_pick): whether it
pays depends on the CPU, the shape and the tuning. On a 2-core AVX-512 AMD EPYC, tuned, a 64->64 3x3
on 56x56 took 0.50 ms against 1.05 direct; on an Intel Xeon with its transforms barely tuned it lost,
and on a 14x14 image the 36 transformed weight matrices (4x the direct weights) serve only 16 tiles,
leaving the batched matmul waiting on memory.

fp32 error: the interpolation points (TOPI's, Barabasz et al., 0, -1, 1, 1/2, -2) give about 3e-7
relative error per convolution at F(4x4, 3x3); the compile step's validation judges the model.

Imports only this environment's packages and numpy.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

TILE = 4
"""Output tile edge m of F(m x m, 3x3): 4 is the largest whose fp32 error stays near 3e-7 (6 and 8
reach 9e-7 and 7e-6 per convolution)."""
KERNEL = 3
ALPHA = TILE + KERNEL - 1


def eligible(kernel: tuple[int, int], strides: tuple[int, ...], dilation: tuple[int, ...]) -> bool:
    """Whether a convolution has Winograd's shape: 3x3, stride 1, no dilation (the caller keeps
    grouped convolutions out: they are never blocked)."""
    return kernel == (KERNEL, KERNEL) and set(strides) == {1} and set(dilation) == {1}


@functools.cache
def matrices() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A (6x4), B (6x6) and G (6x3) of F(4x4, 3x3), float32, from TOPI's Cook-Toom construction;
    built once per process, not once per convolution."""
    from tvm.topi.nn import winograd_util

    points = winograd_util._interpolation_points(TILE + KERNEL - 2)
    a, b, g = winograd_util._cook_toom_convolution(points, TILE, KERNEL)
    return a.astype(np.float32), b.astype(np.float32), g.astype(np.float32)


class Tiling(NamedTuple):
    out_h: int
    out_w: int
    tiles_h: int
    """4x4 output tiles down the image (the last may reach past its edge)."""
    tiles_w: int
    pad_t: int
    pad_l: int


def tiles(height: int, width: int, padding: Any) -> Tiling:
    """The output's size and its 4x4 tiles for an input image of height x width."""
    from tvm.topi.nn.utils import get_pad_tuple

    pad_t, pad_l, pad_b, pad_r = (int(p) for p in get_pad_tuple(padding, (KERNEL, KERNEL)))
    out_h, out_w = height + pad_t + pad_b - KERNEL + 1, width + pad_l + pad_r - KERNEL + 1
    return Tiling(out_h, out_w, -(-out_h // TILE), -(-out_w // TILE), pad_t, pad_l)


def weight_transform(kernel: Any, g: Any) -> Any:
    """The OIHW 3x3 kernel as [36, CI, CO] (G k G^T per channel pair): a function of the constant
    weights only, so the build folds it."""
    from tvm import te

    co, ci, kh, kw = (int(d) for d in kernel.shape)
    r_kh = te.reduce_axis((0, kh), name="r_kh")
    r_kw = te.reduce_axis((0, kw), name="r_kw")
    return te.compute(
        (ALPHA * ALPHA, ci, co),
        lambda k, c, o: te.sum(
            g[k // ALPHA, r_kh] * kernel[o, c, r_kh, r_kw] * g[k % ALPHA, r_kw], axis=[r_kh, r_kw]
        ),
        name="winograd_weight",
    )


def data_transform(data: Any, b: Any, padding: Any) -> Any:
    """NCHW{c}c data as [36, tiles, CI]: each 6x6 input tile (overlapping by 2) as B^T d B."""
    from tvm import te, topi

    n, _, height, width, lanes = (int(d) for d in data.shape)
    _, _, tiles_h, tiles_w, pad_t, pad_l = tiles(height, width, padding)
    # Padded so that the last tile's 6x6 window stays inside: an image whose edge is not a
    # multiple of 4 reads zeros past it, never past the buffer.
    data_pad = topi.nn.pad(
        data,
        (0, 0, pad_t, pad_l, 0),
        (0, 0, tiles_h * TILE + KERNEL - 1 - height - pad_t, tiles_w * TILE + KERNEL - 1 - width - pad_l, 0),
        name="winograd_pad",
    )
    per_image, channels = tiles_h * tiles_w, int(data.shape[1]) * lanes

    def row_of(p: Any) -> Any:  # the first input row of tile p
        return p // tiles_w % tiles_h * TILE

    def col_of(p: Any) -> Any:
        return p % tiles_w * TILE

    r = te.reduce_axis((0, ALPHA), "r")
    rows = te.compute(
        (ALPHA, ALPHA, n * per_image, channels),
        lambda eps, col, p, c: te.sum(
            b[r, eps] * data_pad[p // per_image, c // lanes, row_of(p) + r, col_of(p) + col, c % lanes],
            axis=r,
        ),
        name="winograd_rows",
    )
    s = te.reduce_axis((0, ALPHA), "s")
    return te.compute(
        (ALPHA * ALPHA, n * per_image, channels),
        lambda k, p, c: te.sum(rows[k // ALPHA, s, p, c] * b[s, k % ALPHA], axis=s),
        name="winograd_data",
    )


def output_transform(m: Any, a: Any, image: tuple[int, int, int], padding: Any, lanes: int) -> Any:
    """The batched matmul's [36, tiles, CO] as the convolution's output (A^T m A per tile), in
    NCHW{lanes}c; `image` is the input's (batch, height, width)."""
    from tvm import te

    n, height, width = image
    out_h, out_w, tiles_h, tiles_w, _, _ = tiles(height, width, padding)
    per_image, channels = tiles_h * tiles_w, int(m.shape[2])
    s = te.reduce_axis((0, ALPHA), "s")
    cols = te.compute(
        (ALPHA, TILE, n * per_image, channels),
        lambda row, vw, p, co: te.sum(m[row * ALPHA + s, p, co] * a[s, vw], axis=s),
        name="winograd_cols",
    )
    r = te.reduce_axis((0, ALPHA), "r")
    out = te.compute(
        (TILE, TILE, n * per_image, channels),
        lambda vh, vw, p, co: te.sum(a[r, vh] * cols[r, vw, p, co], axis=r),
        name="winograd_out",
    )
    return te.compute(
        (n, channels // lanes, out_h, out_w, lanes),
        lambda i, cb, h, w, cl: out[
            h % TILE, w % TILE, i * per_image + h // TILE * tiles_w + w // TILE, cb * lanes + cl
        ],
        name="conv2d_winograd",
    )


def emit(bb: Any, call: Any, lanes: int) -> Any:
    """The Relax calls that replace one NCHW{c}c convolution with an OIHW 3x3 kernel."""
    from tvm import relax, topi

    a, b, g = (relax.const(x) for x in matrices())
    data, kernel = call.args
    n, _, height, width, _ = (int(d) for d in data.ty.shape)
    padding = call.attrs.padding
    weights = bb.emit(bb.call_te(weight_transform, kernel, g, primfunc_name_hint="winograd_weight"))
    packed = bb.emit(bb.call_te(data_transform, data, b, padding, primfunc_name_hint="winograd_data"))
    product = bb.emit(
        bb.call_te(
            topi.nn.batch_matmul, packed, weights, transpose_b=False, primfunc_name_hint="winograd_matmul"
        )
    )
    return bb.call_te(
        output_transform, product, a, (n, height, width), padding, lanes, primfunc_name_hint="conv2d_winograd"
    )
