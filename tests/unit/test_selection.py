"""Candidate expansion, naming, the selection policies and the compact result with candidates."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kompile.api.candidates import backends_of, candidate_targets, is_multi, target_device
from kompile.api.job_contract import TERMINATION_LIMIT, compact_result, parse_compact
from kompile.api.spec import Selection, Target
from kompile.api.status import CandidateStatus, LatencyStats, SelectionStatus, TargetStatus
from kompile.compile_jobs.build import _auto_device_only, device_only_notes
from kompile.compile_jobs.selection import select


def lat(batch: int, p50: float, p90: float | None = None) -> LatencyStats:
    p90 = p90 if p90 is not None else p50 * 1.1
    return LatencyStats(
        batch_size=batch, p50_ms=p50, p90_ms=p90, p99_ms=p90 * 1.2, throughput=batch * 1000 / p50
    )


def test_auto_expands_to_the_class_defaults_and_explicit_backends_stay_single() -> None:
    auto = Target(name="t", precision="bf16")
    assert is_multi(auto) and target_device(auto) == "cpu"
    assert [c.name for c in candidate_targets(auto, "cpu", "amd64")] == [
        "onnxruntime-bf16",
        "openvino-bf16",
        "inductor-bf16",
    ]
    # arm64 classes add ExecuTorch; an unknown arch (an unpinned target's cache key) may be either.
    arm = [c.name for c in candidate_targets(auto, "cpu", "arm64")]
    assert "executorch-bf16" in arm and arm == [c.name for c in candidate_targets(auto, "cpu")]
    assert [c.backend for c in candidate_targets(auto, "cuda")] == ["tensorrt", "inductor"]
    single = Target(name="t", backend="tensorrt")
    assert not is_multi(single) and target_device(single) == "cuda"
    assert target_device(Target(name="t", backend="inductor", options={"device": "cuda"})) == "cuda"
    assert target_device(auto, gpu_class=True) == "cuda"


def test_candidates_inherit_precision_and_tolerances_and_get_unique_names() -> None:
    t = Target.model_validate(
        {
            "name": "t",
            "precision": "int8",
            "tolerances": {"minCosine": 0.9},
            "candidates": [
                {"backend": "onnxruntime", "quantization": "static"},
                {"backend": "onnxruntime", "quantization": "dynamic"},
                {"name": "onnxruntime-int8-2", "backend": "tensorrt"},
            ],
        }
    )
    built = candidate_targets(t, "cpu")
    assert [c.name for c in built] == ["onnxruntime-int8", "onnxruntime-int8-3", "onnxruntime-int8-2"]
    assert all(c.precision == "int8" and c.tolerances == t.tolerances for c in built)
    assert [c.quantization for c in built] == ["static", "dynamic", None]
    assert backends_of(t, "cpu") == ["onnxruntime", "tensorrt"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"backend": "onnxruntime", "candidates": [{"backend": "inductor"}]}, "set backend to auto"),
        (
            {"candidates": [{"name": "a", "backend": "inductor"}, {"name": "a", "backend": "onnxruntime"}]},
            "unique",
        ),
        ({"selection": {"policy": "maxThroughput"}}, "latencyBudgetMs"),
        ({"candidates": [{"backend": "onnxruntime", "precision": "fp32", "quantization": "static"}]}, "int8"),
    ],
)
def test_candidate_and_selection_mistakes_are_refused(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Target.model_validate({"name": "t", **doc})


def test_min_latency_picks_the_lowest_p50_at_the_decision_batch() -> None:
    timed = {"a": [lat(1, 5.0), lat(8, 20.0)], "b": [lat(1, 6.0), lat(8, 15.0)]}
    first = select(None, [1, 8], timed)
    assert first.winner == "a" and first.batch_size == 1 and "b 6.000 ms (1.20x)" in first.message
    at8 = select(Selection(batch_size=8), [1, 8], timed)
    assert at8.winner == "b" and at8.batch_size == 8
    assert select(None, [1], {}).winner is None


def test_ties_go_to_the_earlier_candidate() -> None:
    assert select(None, [1], {"first": [lat(1, 5.0)], "second": [lat(1, 5.0)]}).winner == "first"


def test_max_throughput_respects_the_budget_and_falls_back_to_latency() -> None:
    timed = {
        # a is faster per call, b batches better but its batch 32 misses a 40 ms budget
        "a": [lat(1, 2.0, 2.5), lat(32, 30.0, 35.0)],
        "b": [lat(1, 3.0, 3.5), lat(32, 25.0, 45.0)],
    }
    sel = Selection(policy="maxThroughput", latency_budget_ms=40.0)
    out = select(sel, [1, 32], timed)
    assert out.winner == "a" and out.batch_size == 32 and out.latency_budget_ms == 40.0
    assert select(Selection(policy="maxThroughput", latency_budget_ms=50.0), [1, 32], timed).winner == "b"
    none_fit = select(Selection(policy="maxThroughput", latency_budget_ms=1.0), [1, 32], timed)
    assert none_fit.winner == "a" and none_fit.message.startswith("no candidate kept p90 within 1 ms")


def test_compact_result_keeps_eight_chatty_candidates_under_the_limit() -> None:
    cands = [
        CandidateStatus(
            name=f"candidate-{i}",
            backend="onnxruntime",
            precision="int8",
            phase="Failed",
            reason="ValidationFailed",
            message="x" * 3000,
            options={f"opt{j}": "v" * 40 for j in range(10)},
            latency=[lat(b, 3.0) for b in (1, 2, 4, 8)],
            speedup=2.0,
            max_abs_error=0.1,
            min_cosine=0.99,
        )
        for i in range(8)
    ]
    ts = TargetStatus(
        name="t",
        backend="onnxruntime",
        precision="int8",
        phase="Succeeded",
        latency=[lat(1, 3.0)],
        candidates=cands,
        selection=SelectionStatus(policy="minLatency", winner="candidate-0", message="m" * 2000),
    )
    text = compact_result(ts, "sha256:" + "a" * 64, "1.31.1")
    assert len(text.encode()) <= TERMINATION_LIMIT
    back, _, _ = parse_compact(text)
    assert [c.name for c in back.candidates] == [c.name for c in cands]
    assert all(c.latency and c.latency[0].batch_size == 1 for c in back.candidates)
    assert back.selection is not None and back.selection.winner == "candidate-0"
    assert json.loads(text)["target"]["latency"][0]["p50Ms"] == 3.0


def test_compact_result_holds_a_precision_ladder_with_remedies() -> None:
    """precision auto with int8 remedies: sixteen candidates with long names still fit; each keeps
    its name and verdict."""
    cands = [
        CandidateStatus(
            name=f"openvino-int8-accuracy-control-mixed-bf16-{i}",
            backend="openvino",
            precision="int8",
            phase="Failed",
            reason="ValidationFailed",
            message="output 'last_hidden_state': cosine 0.812345 < limit 0.990000; " * 4,
            latency=[lat(1, 3.0)],
            min_cosine=0.81,
            max_abs_error=1.5,
            accuracy=91.0,
            accuracy_drop=2.5,
            artifact_digest="sha256:" + "b" * 64,
        )
        for i in range(16)
    ]
    ts = TargetStatus(
        name="cpu-amd64-avx512vnni-auto",
        backend="openvino",
        precision="bf16",
        phase="Succeeded",
        candidates=cands,
        not_offered=["inductor bf16: " + "y" * 200] * 16,
    )
    text = compact_result(ts, "sha256:" + "a" * 64, "2026.4.1")
    assert len(text.encode()) <= TERMINATION_LIMIT
    back, _, _ = parse_compact(text)
    assert [(c.name, c.reason) for c in back.candidates] == [(c.name, c.reason) for c in cands]


def test_compact_result_is_bounded_whatever_the_status_holds() -> None:
    """The kubelet keeps only the tail of a longer message and the JSON would break silently: the
    most a status can hold (24 candidates with 63-character names, long messages, every field
    filled) still fits, with the verdict intact."""
    long = "n" * 63
    cands = [
        CandidateStatus(
            name=f"{i:02d}{long}"[:63],
            backend="openvino",
            precision="int8",
            phase="Failed",
            reason="ValidationFailed" * 4,
            message="m" * 5000,
            options={f"o{j}": "v" * 1024 for j in range(32)},
            latency=[lat(b, 3.0) for b in range(1, 9)],
        )
        for i in range(24)
    ]
    ts = TargetStatus(
        name=long,
        backend="openvino",
        precision="int8",
        phase="Succeeded",
        reason="Validated",
        candidates=cands,
        not_offered=["x" * 2000] * 16,
        message="y" * 10000,
    )
    text = compact_result(ts, "sha256:" + "a" * 64, "2026.4.1")
    assert len(text.encode()) <= TERMINATION_LIMIT
    back, digest, _ = parse_compact(text)
    assert (back.name, back.phase, back.backend) == (long, "Succeeded", "openvino") and digest


def test_a_served_class_leaves_device_only_backends_out_of_auto() -> None:
    """On an arm64 class KServe serves, an ExecuTorch winner would leave nothing to roll out: auto
    leaves it out and says why; listed candidates are built as written; unserved classes keep it."""
    auto = Target(name="t", precision="int8")
    notes = device_only_notes(auto, "cpu", "arm64", served=True)
    assert [n.split(":")[0] for n in notes] == ["executorch", "litert"]
    assert notes[0].startswith("executorch: its artifacts run on devices, not KServe")
    assert device_only_notes(auto, "cpu", "arm64", served=False) == []
    assert device_only_notes(auto, "cpu", "amd64", served=True) == []  # not offered there anyway
    assert _auto_device_only(auto, "executorch") and not _auto_device_only(auto, "onnxruntime")
    listed = Target.model_validate({"name": "t", "candidates": [{"backend": "executorch"}]})
    assert not _auto_device_only(listed, "executorch")


def test_candidates_timed_in_rounds_of_their_own_compare_by_their_ratio_to_eager() -> None:
    """Unloaded to bound memory, each candidate is timed beside its own eager: a round on a busier
    machine slows both. A 10 ms candidate beside a 20 ms eager (2x) beats an 8 ms one beside a
    10 ms eager (1.25x); in one shared round nothing is scaled."""
    from kompile.compile_jobs.built import _on_one_eager

    def stats(p50: float) -> LatencyStats:
        return LatencyStats(batch_size=1, p50_ms=p50, p90_ms=p50, p99_ms=p50, throughput=1000 / p50)

    def cand(name: str, p50: float, eager: float) -> TargetStatus:
        return TargetStatus(
            name=name,
            backend="null",
            precision="fp32",
            phase="Succeeded",
            latency=[stats(p50)],
            eager_latency=[stats(eager)],
        )

    apart = _on_one_eager([cand("a", 10, 20), cand("b", 8, 10)])
    assert select(None, [1], apart).winner == "a"
    assert apart["b"][0].p50_ms == pytest.approx(16.0) and apart["a"][0].p50_ms == 10
    shared = _on_one_eager([cand("a", 10, 20), cand("b", 8, 20)])
    assert select(None, [1], shared).winner == "b" and shared["b"][0].p50_ms == 8
