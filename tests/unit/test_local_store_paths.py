"""file:// URIs name folders percent-encoded (Path.as_uri writes a space as %20, a colon as %3A):
read back without decoding, the store wrote the latest pointers of a run whose work dir was
"my models" into a second folder, "my%20models", where nothing looks for them."""

from __future__ import annotations

from pathlib import Path

from kompile import artifact_store
from kompile.compile_jobs.sources import _local_path


def test_a_file_uri_of_a_folder_with_a_space_or_colon_is_that_folder(tmp_path: Path) -> None:
    root = tmp_path / "my models: v2"
    uri = root.as_uri()
    assert "%20" in uri and "%3A" in uri
    artifact_store.write_bytes(artifact_store.join(uri, "latest", "x.json"), b"{}")
    assert (root / "latest" / "x.json").read_bytes() == b"{}"
    assert artifact_store.read_bytes(artifact_store.join(uri, "latest", "x.json")) == b"{}"
    (tmp_path / "built").mkdir()
    (tmp_path / "built" / "model.onnx").write_bytes(b"m")
    artifact_store.put_tree(tmp_path / "built", artifact_store.join(uri, "small", "cpu"))
    assert (root / "small" / "cpu" / "model.onnx").read_bytes() == b"m"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "my models: v2"]


def test_a_source_file_uri_is_decoded_too(tmp_path: Path) -> None:
    model = tmp_path / "my models" / "m.onnx"
    assert _local_path(model.as_uri(), tmp_path) == model
