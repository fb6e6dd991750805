"""What an artifact of NudeNet's detector still finds, counted at one score threshold with the
gate's YOLO decoding (kompile.compile_jobs.detections): the test of NudeNet's int8
(tests/pipeline/test_detector_int8.py) and its benchmark (benchmarks/detector_int8.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.detections import decode, unmatched

Array = np.ndarray[Any, Any]


def nudenet_manifest(
    name: str,
    dataset: Path,
    target: dict[str, Any],
    iterations: int,
    warmup: int = 1,
    task: str = "auto",
    source: Path | None = None,
    head: str = "yolov8",
    sides: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A CompiledModel of NudeNet's detector (batch 1-4; `source`: a rewrite of it) validated on
    `dataset` as `task` (a detection head read as `head`), with one target. `sides`: height and
    width dynamic from the first to the second (opt 320), so the gate judges those sizes too."""
    from tests.support.pretrained_files import nudenet_detector

    dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}]
    if sides:
        low, high = sides
        dims += [
            {"axis": a, "name": n, "min": low, "opt": 320, "max": high}
            for a, n in ((2, "height"), (3, "width"))
        ]
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": name},
        "spec": {
            "source": {"uri": str(source or nudenet_detector())},
            "inputs": [
                {
                    "name": "images",
                    "shape": [-1, 3, -1, -1] if sides else [-1, 3, 320, 320],
                    "dynamicDims": dims,
                }
            ],
            "targets": [target],
            "validation": {"dataset": str(dataset), "task": task, "detectionHead": head},
            "benchmark": {"batchSizes": [1], "warmup": warmup, "iterations": iterations},
        },
    }


def nudenet_as_yolov5(out_dir: Path) -> Path:
    """NudeNet's detector (real weights) with its head laid out the YOLOv5 way, [batch, anchors,
    5 + classes]: objectness is each anchor's best class score and each class's probability its
    score over that, so read as a yolov5 head it makes NudeNet's own detections."""
    import onnx
    from onnx import helper, numpy_helper

    from tests.support.pretrained_files import nudenet_detector

    model = onnx.load(str(nudenet_detector()))
    graph = model.graph
    (head,) = graph.output
    consts = {"one": [1], "zero": [0], "four": [4], "end": [2**62]}
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items())
    graph.initializer.append(numpy_helper.from_array(np.array(1e-9, np.float32), "eps"))
    graph.node.extend(
        [
            helper.make_node("Slice", [head.name, "zero", "four", "one"], ["v5_box"]),
            helper.make_node("Slice", [head.name, "four", "end", "one"], ["v5_scores"]),
            helper.make_node("ReduceMax", ["v5_scores"], ["v5_objectness"], axes=[1], keepdims=1),
            helper.make_node("Max", ["v5_objectness", "eps"], ["v5_divisor"]),
            helper.make_node("Div", ["v5_scores", "v5_divisor"], ["v5_probabilities"]),
            helper.make_node("Concat", ["v5_box", "v5_objectness", "v5_probabilities"], ["v5_head"], axis=1),
            helper.make_node("Transpose", ["v5_head"], ["detections"], perm=[0, 2, 1]),
        ]
    )
    graph.output.remove(head)
    columns = head.type.tensor_type.shape.dim[1].dim_value + 1
    shape = ["batch", "anchors", columns]
    graph.output.append(helper.make_tensor_value_info("detections", onnx.TensorProto.FLOAT, shape))
    path = out_dir / "nudenet-yolov5.onnx"
    onnx.save(model, str(path))
    return path


def matched(source: Array, artifact: Array, threshold: float = 0.25) -> tuple[int, int, int]:
    """Over a batch of outputs [images, 4 + classes, anchors], at one score threshold (no borderline
    band, as a deployment reads them): how many objects the source finds, how many of those the
    artifact finds too (same class, IoU at least 0.5), and how many more it finds."""
    total = kept = extra = 0
    for ref_out, got_out in zip(source, artifact, strict=True):
        ref, got = decode(ref_out, threshold), decode(got_out, threshold)
        count, missed = unmatched(ref, got, threshold)
        total, kept, extra = total + count, kept + count - missed, extra + unmatched(got, ref, threshold)[1]
    return total, kept, extra


def outputs(model: Path, photos: Array, options: dict[str, str] | None = None) -> Array:
    """A detector's output on each photo, [photos, 4 + classes, anchors]: an ONNX file by ONNX
    Runtime, an OpenVINO IR (.xml) by OpenVINO with the runtime properties the artifact's
    `options` record (`runtime.INFERENCE_PRECISION_HINT`: without it, OpenVINO runs bf16 on a CPU
    with AVX-512 BF16, not what was validated)."""
    if model.suffix == ".xml":
        import openvino as ov

        recorded = (options or {}).items()
        runtime = {k.removeprefix("runtime."): v for k, v in recorded if k.startswith("runtime.")}
        compiled = ov.Core().compile_model(str(model), "CPU", runtime)
        return np.concatenate([np.asarray(compiled(p[None])[0]) for p in photos])
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"images": p[None]})[0] for p in photos])
