"""An ONNX model whose weights live outside the protobuf (external data: every model over 2 GB, and
what many exporters write for smaller ones too) compiles like any other: the weight files travel with
the graph into the export, each artifact is whole without the source folder, and the source's digest
covers the weights, so a changed weight file is a changed source."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from tests.pipeline.conftest import torchscript_onnx

FEED = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def split_onnx(d: Path, one_file: bool = True) -> Path:
    """The small CNN saved with every weight in external data: one file beside the graph, or one
    file per tensor in a subfolder."""
    from models.small import small_cnn  # type: ignore[import-not-found]

    full = torchscript_onnx(small_cnn().eval(), FEED, d / "full.onnx", {"input": {0: "batch"}}, "logits")
    model = onnx.load(str(full))
    full.unlink()
    (d / "weights").mkdir(exist_ok=True)
    path = d / "split.onnx"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=one_file,
        location="split.onnx.data" if one_file else None,
        size_threshold=0,
    )
    if not one_file:  # per-tensor files named after the tensors: move them under weights/
        edited = onnx.load(str(path), load_external_data=False)
        for tensor in edited.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    (d / entry.value).rename(d / "weights" / entry.value)
                    entry.value = f"weights/{entry.value}"
        onnx.save_model(edited, str(path))
    return path


def _manifest(source: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "split"},
        "spec": {
            "source": {"uri": source.name},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [
                {"name": "cpu-fp32", "backend": "onnxruntime", "precision": "fp32"},
                {"name": "cpu-int8", "backend": "onnxruntime", "precision": "int8"},
                {"name": "cpu-openvino", "backend": "openvino", "precision": "fp32"},
            ],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
        },
    }


def test_external_data_onnx_compiles_validates_and_ships_whole(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    source = split_onnx(tmp_path, one_file=False)
    assert len(list((tmp_path / "weights").iterdir())) > 2
    res = kompile_run(write_manifest(_manifest(source)))
    assert res.code == 0, res.stderr
    status = json.loads(res.stdout)
    phases = {t["name"]: (t["phase"], t.get("message")) for t in status["targets"]}
    assert all(p == "Succeeded" for p, _ in phases.values()), phases
    # The ONNX Runtime artifact runs from a copy of its own folder, the source folder gone.
    fp32 = next(t for t in status["targets"] if t["name"] == "cpu-fp32")
    repo = Path(fp32["artifact"]["uri"].removeprefix("file://"))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(repo, elsewhere)
    shutil.rmtree(tmp_path / "weights")
    assert not (tmp_path / ".kompile" / "export").exists()  # the run's working copy is gone too
    version = elsewhere / "split" / "1"
    assert sorted(p.name for p in version.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert fp32["artifact"]["sizeBytes"] == sum(p.stat().st_size for p in version.iterdir())
    out = ort.InferenceSession(str(version / "model.onnx")).run(None, FEED)[0]
    assert out.shape == (1, 10) and np.isfinite(out).all()


def test_the_digest_covers_the_external_weights(tmp_path: Path) -> None:
    from kompile.api.spec import Source
    from kompile.compile_jobs.sources import load_source

    source = split_onnx(tmp_path)
    first = load_source(Source(uri=source.name), tmp_path, tmp_path / "cache").digest
    data = tmp_path / "split.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[:4] = b"\x00\x00\x80\x3f"  # the first weight becomes 1.0: the graph file is unchanged
    data.write_bytes(bytes(raw))
    second = load_source(Source(uri=source.name), tmp_path, tmp_path / "cache").digest
    assert first != second


def test_an_s3_source_brings_its_external_data_and_names_a_missing_file(
    kompile_run: Callable[..., Any],
    write_manifest: Callable[..., Path],
    tmp_path: Path,
    s3_server: Any,
    s3_env: Any,
) -> None:
    bucket = "external"
    s3_server.create_bucket(bucket)
    source = split_onnx(tmp_path)
    client = s3_server.client()
    for f in (source, tmp_path / "split.onnx.data"):
        client.upload_file(str(f), bucket, f"models/{f.name}")
    doc = _manifest(source)
    doc["spec"]["source"] = {"uri": f"s3://{bucket}/models/split.onnx"}
    doc["spec"]["targets"] = doc["spec"]["targets"][:1]
    doc["spec"]["registry"] = {"s3Endpoint": s3_server.endpoint}
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["targets"][0]["phase"] == "Succeeded"
    # Without the weights beside the graph in the bucket: a clear error naming the file and where.
    client.delete_object(Bucket=bucket, Key="models/split.onnx.data")
    (tmp_path / ".kompile").rename(tmp_path / "first-run")
    res = kompile_run(write_manifest(doc, "again.yaml"), "--no-register")
    assert res.code == 2, res.stderr
    for phrase in ("split.onnx.data", f"s3://{bucket}/models/split.onnx.data", "upload it there"):
        assert phrase in res.stderr
    assert "Traceback" not in res.stderr


def test_weights_too_small_to_stay_outside_ship_inside_the_graph(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    """torch.onnx.export (dynamo) writes a data file for any model, a small one too; ONNX Runtime
    keeps weights under 1 KB in the graph it saves, so no model.onnx.data was written, and the
    run ended "kompile failed unexpectedly: FileNotFoundError ... model.onnx.data"."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    source = tmp_path / "tiny.onnx"
    onnx.save_model(
        model, str(source), save_as_external_data=True, location="tiny.onnx.data", size_threshold=0
    )
    doc = _manifest(source)
    doc["spec"]["inputs"] = [{"name": "input", "shape": [1, 16]}]
    doc["spec"]["targets"] = doc["spec"]["targets"][:2]
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    targets = json.loads(res.stdout)["targets"]
    assert [t["phase"] for t in targets] == ["Succeeded", "Succeeded"], targets
    for target in targets:
        version = Path(target["artifact"]["uri"].removeprefix("file://")) / "split" / "1"
        assert sorted(p.name for p in version.iterdir()) == ["model.onnx"], target
