"""How the tvm environment spreads a MetaSchedule trial budget over a model's tasks (pure: the
allotment runs without TVM; the tuning itself is tested in tests/pipeline/test_tvm_backend.py)."""

from __future__ import annotations

import pytest

from kompile.compile_jobs.envs.tvm_target import mcpu_for, vector_lanes
from kompile.compile_jobs.envs.tvm_templates import Variant, registers, variants
from kompile.compile_jobs.envs.tvm_tuning import (
    Budget,
    allot_trials,
    budget_from,
    reallot,
    search_population,
    verify_reserve,
)
from kompile.compile_jobs.envs.tvm_verify import ranked


def test_trials_follow_the_flops_with_a_floor_for_light_tasks() -> None:
    # A ResNet-like spread: two heavy convolutions, one light one, two elementwise tasks.
    flops = [4e9, 2e9, 1e8, 1e6, 0.0]
    allotted = allot_trials(flops, 1000, 8)
    assert allotted[0] > allotted[1] > allotted[2] > allotted[3] >= 8
    assert allotted[4] == 8  # an op TVM cannot count still gets its floor
    assert sum(allotted) <= 1000
    assert allotted[0] == 8 + int((1000 - 40) * 4e9 / sum(flops))


def test_a_budget_below_the_floors_is_not_exceeded_per_task() -> None:
    assert allot_trials([1.0, 1.0, 1.0], 4, 8) == [4, 4, 4]
    assert allot_trials([], 100, 8) == []


def test_later_rounds_follow_each_task_time_in_the_model() -> None:
    # After the first round: a convolution at 3 ms a model call, a pool whose first 8 candidates
    # were poor (0.7 ms, though its FLOPs are few), an add at 0.01 ms.
    allotted = reallot([64, 8, 8], [3.0e-3, 0.7e-3, 0.01e-3], 1000, 8)
    assert allotted[0] == 64 + int(1000 * 3.0 / 3.71)
    assert allotted[1] == 8 + int(1000 * 0.7 / 3.71)  # the pool gets its next batches
    assert allotted[2] == 8  # a share under a useful batch (2 trials) is dropped
    assert reallot([8, 8], [3.0e-3, 0.0], 0, 8) == [8, 8]


def test_a_task_without_a_valid_record_counts_as_the_slowest() -> None:
    assert reallot([8, 8], [0.0, 1e-3], 100, 8) == [58, 58]


def test_a_budget_too_small_to_split_goes_to_the_slowest_task() -> None:
    # A refining compile (scope all) with 24 trials over a convolution and three cheap tasks that
    # have no record yet (each counts as the slowest): 6 each would all be dropped.
    assert reallot([0, 0, 0, 0], [4e-4, 0.0, 0.0, 0.0], 24, 8) == [24, 0, 0, 0]
    assert reallot([0, 0], [1e-4, 3e-4], 5, 8) == [0, 5]
    assert reallot([0, 0], [1e-4, 3e-4], 0, 8) == [0, 0]


def test_the_budget_and_its_scope_come_from_the_options() -> None:
    assert budget_from({}, 2) == Budget(trials=0, minutes=30.0, cores=2, scope="missing")
    budget = budget_from({"tuningTrials": "500", "tuningMinutes": "10", "tuningScope": "all"}, 4)
    assert (budget.trials, budget.minutes, budget.cores, budget.scope) == (500, 10.0, 4, "all")
    with pytest.raises(ValueError, match="tuningScope must be one of missing, all, not 'some'"):
        budget_from({"tuningScope": "some"}, 2)
    assert budget.verify == 8  # the default: each kernel's 8 best re-measured on the node
    assert budget_from({"tuningVerify": "0"}, 2).verify == 0
    assert budget.in_model == 0  # the default: the fastest alone, not compared in the model
    assert budget_from({"tuningInModel": "2"}, 2).in_model == 2


def test_the_re_measuring_is_paid_from_the_tuning_minutes_at_most_a_quarter() -> None:
    # ResNet-50: 30 tasks x 8 candidates x 0.75 s on 2 cores = 180 s of a 30-minute budget.
    assert verify_reserve(30, Budget(trials=2000, minutes=30, cores=2, verify=8), "llvm") == pytest.approx(
        180.0
    )
    assert verify_reserve(30, Budget(trials=2000, minutes=30, cores=4, verify=8), "llvm") == pytest.approx(
        90.0
    )
    assert verify_reserve(30, Budget(trials=2000, minutes=4, cores=2, verify=8), "llvm") == pytest.approx(
        60.0
    )
    assert verify_reserve(30, Budget(trials=2000, minutes=30, cores=2, verify=1), "llvm") == 0.0
    # Ranking the two fastest in the model adds two builds: 30 tasks x 2 x 0.25 s.
    assert verify_reserve(
        30, Budget(trials=2000, minutes=30, cores=2, verify=8, in_model=2), "llvm"
    ) == pytest.approx(195.0)
    # `winograd: auto` times two more builds (42 tasks with the Winograd kernels), re-measured or not.
    auto = Budget(trials=2000, minutes=30, cores=2, verify=8, pick_builds=2)
    assert verify_reserve(42, auto, "llvm") == pytest.approx(42 * 8 * 0.75 + 42 * 2 * 0.25)
    assert (
        verify_reserve(42, Budget(trials=2000, minutes=30, cores=2, verify=0, pick_builds=2), "llvm") == 21.0
    )
    # A GPU class applies its records as measured: its tuning keeps the whole budget.
    assert verify_reserve(30, Budget(trials=2000, minutes=30, cores=2, verify=8), "cuda") == 0.0


def test_candidates_rank_by_their_median_here_and_the_database_order_breaks_ties() -> None:
    # Seconds per round of each candidate, the database's best first: the second is faster here.
    assert ranked([[1.81e-3, 1.80e-3, 2.1e-3], [1.36e-3, 1.37e-3, 1.9e-3], [1.5e-3]]) == [1, 2, 0]
    assert ranked([[1e-3, 1e-3], [1e-3, 1e-3]]) == [0, 1]
    # A candidate that never ran here is out of the ranking; none ran: empty (the record as stored).
    assert ranked([[], [2e-3], [3e-3]]) == [1, 2]
    assert ranked([[], []]) == []


def test_the_llvm_cpu_comes_from_the_class_isa() -> None:
    assert mcpu_for("amd64", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}) == "cooperlake"
    assert mcpu_for("amd64", {"avx2"}) == "haswell"
    assert mcpu_for("arm64", {"asimddp"}) == "neoverse-n1"


def test_the_blocked_layout_is_one_vector_register_of_fp32_wide() -> None:
    assert vector_lanes({"cpuFeatures": "avx2,avx512f,avx512_vnni"}) == 16
    assert vector_lanes({"cpuFeatures": "avx2"}) == 8
    assert vector_lanes({"cpuFeatures": ""}) == 4
    assert vector_lanes({"arch": "arm64", "cpuFeatures": "asimddp"}) == 4


def test_each_batch_search_is_sized_to_its_batch() -> None:
    # The search costs seconds per batch whatever its size: batches of 64 by default, and a
    # population of 4x the batch between 64 and 256 (MetaSchedule's default 512 took most of a batch).
    assert Budget(trials=100, minutes=1.0, cores=2).per_batch == 64
    assert search_population(64) == 256
    assert search_population(8) == 64
    assert search_population(20) == 80


def test_register_tiles_fit_the_isas_registers_fullest_first() -> None:
    # ResNet-50's layer-2 1x1 128->512 convolution in NCHW8c (AVX2: 16 vector registers): loops n,
    # output-channel blocks, rows, columns, lanes, input channels, kernel rows and columns.
    avx2 = variants([1, 64, 28, 28, 8, 128, 1, 1], registers(8, "x86_64-linux-gnu"))
    # 12 accumulators + weights + input, fewer pixels (broadcast loads) first; then 10, 9, 8.
    assert [(v.pixels, v.vectors) for v in avx2] == [
        (3, 4),
        (4, 3),
        (6, 2),
        (5, 2),
        (3, 3),
        (2, 4),
        (4, 2),
        (8, 1),
    ]
    assert {v.reduce for v in avx2} == {8} and len(avx2) == 8
    # A 56-wide row: only tiles that divide it, or leave at most 10 tiles to unroll (6 pixels).
    wide = variants([1, 8, 56, 56, 8, 64, 1, 1], 16)
    assert all(56 % v.pixels == 0 or -(-56 // v.pixels) <= 10 for v in wide)
    assert 3 not in {v.pixels for v in wide} and wide[0] == Variant(4, 3, 8)
    # AVX-512 (32 registers, 16 lanes) fills more of them; a stem reduces over its 3 channels whole.
    assert variants([1, 32, 28, 28, 16, 128, 1, 1], registers(16, ""))[0] == Variant(7, 4, 16)
    assert {v.reduce for v in variants([1, 8, 112, 112, 8, 3, 7, 7], 16)} == {3}
    assert registers(4, "aarch64-linux-gnu") == 32 and registers(4, "x86_64") == 16
    # Too few channel blocks or pixels for 4 accumulators: nothing to offer.
    assert variants([1, 1, 1, 1, 8, 8, 1, 1], 16) == []


def test_templates_are_on_unless_the_options_say_none() -> None:
    assert budget_from({}, 2).templates is True
    assert budget_from({"tuningTemplates": "none"}, 2).templates is False
