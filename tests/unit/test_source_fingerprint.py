"""The source's part of the operator's cache key, for sources the compile image carries: a
python:// factory's code and a model at a path in the image (a file or a Hugging Face model folder)
change with the image, so a new image under the same URI is a new source, not a cache hit."""

from __future__ import annotations

import pytest

from kompile.api import parse_manifest
from kompile.operator.store_access import source_fingerprint


def _cm(uri: str, digest: str | None = None):  # type: ignore[no-untyped-def]
    source = {"uri": uri} | ({"digest": digest} if digest else {})
    return parse_manifest(
        {
            "apiVersion": "kompile.dev/v1alpha1",
            "kind": "CompiledModel",
            "metadata": {"name": "m"},
            "spec": {
                "source": source,
                "inputs": [{"name": "x", "shape": [1, 4]}],
                "targets": [{"name": "cpu", "backend": "onnxruntime"}],
            },
        }
    )


@pytest.mark.parametrize(
    "uri", ["python://models.cnn:resnet50", "/models/minilm", "models/r50.onnx", "file:///m.pt2"]
)
def test_a_source_in_the_image_changes_with_the_image(uri: str) -> None:
    cm = _cm(uri)
    assert source_fingerprint(cm, None, "kompile/compile-cpu:1") != source_fingerprint(
        cm, None, "kompile/compile-cpu:2"
    )
    assert source_fingerprint(cm, None, "img:1") == source_fingerprint(cm, None, "img:1")


def test_a_pinned_digest_is_the_source_whatever_the_image() -> None:
    digest = "sha256:" + "a" * 64
    cm = _cm("/models/minilm", digest)
    assert source_fingerprint(cm, None, "img:1") == source_fingerprint(cm, None, "img:2") == digest
