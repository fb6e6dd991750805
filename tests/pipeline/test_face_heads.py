"""A pretrained net with several heads, judged on labelled real data: MTCNN's ONet (facenet-pytorch's
weights, requirements/pretrained.txt) returns box offsets [N, 4], landmarks [N, 10] and face
probabilities [N, 2]; on scikit-image's LFW faces and non-faces the labels are answered by the last
head, and the task accuracy is read from it, not from the first output with a row per label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from kompile.api.resource import CompiledModel
from kompile.api.status import CompiledModelStatus
from kompile.compile_jobs.validate import default_thresholds
from kompile.local_run import summary_table
from tests.pipeline.conftest import small_cnn_doc
from tests.support.pretrained_files import lfw_faces

pytest.importorskip("facenet_pytorch")


def test_onet_accuracy_is_read_from_its_face_probabilities(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    images, labels = lfw_faces(48)
    int8 = {"backend": "onnxruntime", "precision": "int8", "quantization": "static"}
    dataset = tmp_path / "lfw.npz"
    np.savez(dataset, x=images, label=labels)
    batch = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 16}]
    doc = small_cnn_doc(
        source={"uri": "python://facenet_pytorch.models.mtcnn:ONet"},
        inputs=[{"name": "x", "shape": [-1, 3, 48, 48], "dynamicDims": batch}],
        targets=[{"name": "cpu", "candidates": [{"backend": "onnxruntime", "precision": "fp32"}, int8]}],
        validation={"dataset": str(dataset), "labelsKey": "label"},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    acc = t["validation"]["taskAccuracy"]
    # The face probabilities tell LFW's faces from its other patches every time; the box offsets'
    # argmax, read before, met the labels on 11% of them.
    assert (acc["output"], acc["labelled"], acc["reference"]) == ("output_2", 200, 100.0), acc
    # The summary a person reads names the output the labels were read from.
    console = Console(width=300, record=True)
    console.print(
        summary_table(CompiledModel.model_validate(doc), CompiledModelStatus.model_validate(res.status))
    )
    assert "(source 100.00% on 200 labels, read from output 'output_2')" in console.export_text()
    for c in t["candidates"]:
        assert c["accuracyDrop"] == pytest.approx(acc["reference"] - c["accuracy"]), c
        assert (c["phase"] == "Succeeded") <= (
            c["accuracyDrop"] <= default_thresholds(c["precision"]).max_accuracy_drop
        )
    fp32 = next(c for c in t["candidates"] if c["precision"] == "fp32")
    assert fp32["phase"] == "Succeeded" and fp32["accuracyDrop"] == 0, fp32
