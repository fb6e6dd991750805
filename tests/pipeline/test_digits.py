"""A CNN trained here on scikit-learn's digits (real 8x8 handwritten digits, shipped with
scikit-learn) and validated against the held-out labels: task accuracy of the source and of every
artifact, and the drop gated per precision (spec.validation.labelsKey, tolerances.maxAccuracyDrop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kompile.compile_jobs.validate import default_thresholds

sklearn_datasets = pytest.importorskip("sklearn.datasets")


class DigitsCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).flatten(1))  # type: ignore[no-any-return]


def train_digits(tmp_path: Path) -> tuple[Path, Path, float]:
    """Train on 1,437 digits, save the model (.pt2) and the 360 held-out ones with their labels."""
    digits = sklearn_datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    train, held = order[:1437], order[1437:]
    torch.manual_seed(0)
    model = DigitsCnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(images[train]), torch.from_numpy(labels[train])
    for _ in range(12):
        for i in range(0, len(x), 64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(images[held])).argmax(1).numpy() == labels[held]).mean())
    source = tmp_path / "digits.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(
        torch.export.export(model, (torch.from_numpy(images[:2]),), dynamic_shapes={"image": {0: batch}}),
        source,
    )
    dataset = tmp_path / "digits-test.npz"
    np.savez(dataset, image=images[held], label=labels[held])
    return source, dataset, accuracy


def _doc(source: Path, dataset: Path, **validation: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "digits"},
        "spec": {
            "source": {"uri": str(source)},
            "inputs": [
                {
                    "name": "image",
                    "shape": [-1, 1, 8, 8],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 64}],
                }
            ],
            "targets": [
                {
                    "name": "cpu",
                    "candidates": [
                        {"backend": "onnxruntime", "precision": "fp32"},
                        {"backend": "onnxruntime", "precision": "int8", "quantization": "static"},
                        {"backend": "openvino", "precision": "int8"},
                    ],
                }
            ],
            "validation": {"dataset": str(dataset), "labelsKey": "label", **validation},
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 6},
        },
    }


def test_digits_cnn_is_gated_on_task_accuracy(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, dataset, trained_accuracy = train_digits(tmp_path)
    assert trained_accuracy > 0.9  # a real classifier, not noise
    res = kompile_run(write_manifest(_doc(source, dataset)), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    acc = t["validation"]["taskAccuracy"]
    assert acc["labelled"] == 360 and acc["output"]
    assert acc["reference"] == pytest.approx(trained_accuracy * 100)
    cands = {c["name"]: c for c in t["candidates"]}
    for c in cands.values():
        # Every candidate that ran reports its accuracy and its drop against the source's.
        assert c["accuracy"] is not None and c["accuracyDrop"] == pytest.approx(
            acc["reference"] - c["accuracy"]
        )
        limit = default_thresholds(c["precision"]).max_accuracy_drop
        assert (c["phase"] == "Succeeded") <= (c["accuracyDrop"] <= limit)
    fp32 = cands["onnxruntime-fp32"]
    assert fp32["phase"] == "Succeeded" and fp32["accuracyDrop"] <= 0.1
    assert t["validation"]["thresholds"]["maxAccuracyDrop"] is not None


def test_no_drop_allowed_refuses_an_int8_that_loses_a_digit(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """With maxAccuracyDrop set below what int8 loses, the gate refuses it and says by how much;
    the wrong labelsKey is refused before anything builds."""
    source, dataset, _ = train_digits(tmp_path)
    # Cosine and top-k let through: only the accuracy drop judges here.
    doc = _doc(source, dataset, tolerances={"maxAccuracyDrop": 0, "minCosine": 0, "minTopKAgreement": 0})
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    for c in t["candidates"]:
        drop = c["accuracyDrop"]
        assert (c["phase"] == "Succeeded") == (drop <= 0), c
        if drop > 0:
            assert f"a drop of {drop:.2f} points > limit 0" in c["message"]
    missing = kompile_run(
        write_manifest(_doc(source, dataset, labelsKey="labels"), "bad.yaml"), "--no-register"
    )
    assert missing.code == 2
    assert "labelsKey is 'labels' and the dataset has no such array" in missing.stderr
