"""How `winograd: auto` pairs the two builds' kernel calls and picks a shape's faster form (pure: the
kernel calls are given; the builds and their timing run in tests/pipeline/test_tvm_backend.py)."""

from __future__ import annotations

import pytest

from kompile.compile_jobs.envs.tvm_winograd_pick import Call, Pick, align, costs

SMALL = (64, 64, 56, 56, 1, 1, 1, 1)
WIDE = (128, 128, 28, 28, 1, 1, 1, 1)
DIRECT = ["te_layout_transform", "fused_conv2d_NCHWc_add_relu", "fused_conv2d_NCHWc1_add_relu1", "max_pool2d"]
TRANSFORMED = [
    "te_layout_transform",
    "winograd_data",
    "winograd_matmul",
    "fused_conv2d_winograd_add_relu",
    "winograd_data1",
    "winograd_matmul1",
    "fused_conv2d_winograd1_add_relu1",
    "max_pool2d",
]


def test_each_winograd_convolution_pairs_with_the_direct_kernel_it_replaced() -> None:
    # Two Winograd convolutions back to back: each starts at its input transform.
    assert align(DIRECT, TRANSFORMED, 2) == [(1, [1, 2, 3]), (2, [4, 5, 6])]


@pytest.mark.parametrize(
    ("direct", "transformed", "count"),
    [
        (DIRECT, TRANSFORMED, 3),  # fewer Winograd convolutions than the graph's eligible ones
        (DIRECT[:-1], TRANSFORMED, 2),  # a kernel in one build only
        (["te_layout_transform", "max_pool2d", "conv2d_NCHWc", "conv2d_NCHWc1"], TRANSFORMED, 2),
    ],
)
def test_builds_that_do_not_pair_are_refused(direct: list[str], transformed: list[str], count: int) -> None:
    with pytest.raises(ValueError, match="do not pair"):
        align(direct, transformed, count)


def _round(names: list[str], ms: list[float], inputs: dict[int, tuple[int, ...]]) -> list[Call]:
    return [(n, t / 1e3, inputs.get(i, ())) for i, (n, t) in enumerate(zip(names, ms, strict=True))]


def test_a_shape_costs_its_convolutions_summed_and_runs_as_winograd_where_that_is_less() -> None:
    # The first convolution 64->64 on 56x56, the second 128->128 on 28x28; blocked inputs (NCHW16c).
    direct_in = {1: (1, 4, 56, 56, 16), 2: (1, 8, 28, 28, 16)}
    transformed_in = {1: (1, 4, 56, 56, 16), 4: (1, 8, 28, 28, 16)}
    direct = [
        _round(DIRECT, [0.1, 1.0, 1.1, 0.2], direct_in),
        _round(DIRECT, [0.1, 1.2, 1.0, 0.2], direct_in),
        _round(DIRECT, [0.1, 1.1, 0.9, 0.2], direct_in),
    ]
    transformed = [
        _round(TRANSFORMED, [0.1, 0.1, 0.3, 0.1, 0.3, 0.6, 0.3, 0.2], transformed_in),
        _round(TRANSFORMED, [0.1, 0.1, 0.4, 0.1, 0.3, 0.7, 0.3, 0.2], transformed_in),
        _round(TRANSFORMED, [0.1, 0.1, 0.2, 0.1, 0.3, 0.5, 0.3, 0.2], transformed_in),
    ]
    measured = costs(direct, transformed, [SMALL, WIDE])
    assert measured[SMALL] == pytest.approx((1.1, 0.5))  # medians of the rounds' sums
    assert measured[WIDE] == pytest.approx((1.0, 1.2))
    picked = Pick(winograd={s for s, (d, w) in measured.items() if w < d}, costs=measured, seconds=1.25)
    assert picked.winograd == {SMALL}
    assert picked.record() == {
        "winogradMeasured": "64->64 56x56 winograd (1.100 direct, 0.500 winograd ms); "
        "128->128 28x28 direct (1.000 direct, 1.200 winograd ms)",
        "winogradPickSeconds": "1.2",
    }


def test_convolutions_of_one_shape_are_summed_and_a_pair_reading_another_shape_is_refused() -> None:
    direct_in = {1: (1, 4, 56, 56, 16), 2: (1, 4, 56, 56, 16)}
    transformed_in = {1: (1, 4, 56, 56, 16), 4: (1, 4, 56, 56, 16)}
    direct = [_round(DIRECT, [0.1, 1.0, 1.0, 0.2], direct_in)]
    transformed = [_round(TRANSFORMED, [0.1, 0.1, 0.3, 0.1, 0.1, 0.3, 0.1, 0.2], transformed_in)]
    assert costs(direct, transformed, [SMALL, SMALL]) == {SMALL: pytest.approx((2.0, 1.0))}
    # The graph's second eligible convolution said to be 128 channels on 28x28: the order is off.
    with pytest.raises(ValueError, match="not 128->128 28x28"):
        costs(direct, transformed, [SMALL, WIDE])
