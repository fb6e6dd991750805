"""The compiler stacks' GPU targets on a machine without a GPU: each refuses to compile with
BackendUnavailable, saying where to run it (the fleet sends GPU-class Jobs to GPU nodes; locally the
target cannot validate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompile.api.spec import Target
from kompile.compile_jobs.backends.base import BackendUnavailable, get_backend
from kompile.compile_jobs.build import compile_request
from tests.pipeline.conftest import IMAGE, cnn_feeds, torchscript_onnx


@pytest.mark.parametrize("name", ["iree", "tvm", "xla"])
def test_a_gpu_target_without_a_gpu_says_where_to_run_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from models.small import small_cnn

    model, feeds = small_cnn(), cnn_feeds(1)
    path = torchscript_onnx(model, feeds[0], tmp_path / "m.onnx", {"input": {0: "batch"}}, "output")
    monkeypatch.setattr(
        importlib.import_module(f"kompile.compile_jobs.backends.{name}"),
        "local_cuda_capability",
        lambda: None,
    )
    request = compile_request(
        Target(name=f"gpu-{name}", backend=name, precision="fp32"),
        module=model,
        onnx_path=path,
        out_dir=tmp_path,
        signature=[IMAGE],
        feeds=feeds,
        device="cuda",
    )
    with pytest.raises(BackendUnavailable, match=rf"^{name} for cuda .+ run this target on a GPU node$"):
        get_backend(name).compile(request)
