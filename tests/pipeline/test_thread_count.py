"""The pipeline sizes its runtimes' thread pools to the cores this process may run on.

Found by reading: run_pipeline took `os.cpu_count()` (every core of the host) where no
`spec.benchmark.threads` was given, while the runners' own default (`available_cores`) reads the
affinity mask. A compile Job pinned to 4 cores of a 64-core node (the kubelet's static CPU manager
sets such a cpuset) then ran ONNX Runtime, OpenVINO and torch with 64 threads on 4 cores: spinning
pools that time each other, and benchmark figures that say nothing about the class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kompile.api.resource import load_manifest
from kompile.compile_jobs import pipeline
from tests.pipeline.conftest import small_cnn_doc


class _Sized(Exception):
    """Stops the run where it has chosen its thread count: nothing after that is under test."""


def _threads_chosen(
    doc: dict[str, Any], tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch
) -> int:  # type: ignore[no-untyped-def]
    chosen: list[int | None] = []

    def record(n: int | None = None) -> int:
        chosen.append(n)
        raise _Sized

    monkeypatch.setattr(pipeline.bench, "set_threads", record)
    opts = pipeline.PipelineOptions(base_dir=tmp_path, work_dir=tmp_path / "w", artifact_root=tmp_path / "a")
    with pytest.raises(_Sized):
        pipeline.run_pipeline(load_manifest(write_manifest(doc)), opts, pipeline.LogReporter(print))
    (n,) = chosen
    assert n is not None
    return n


def test_default_threads_are_the_cores_this_process_may_use_not_the_hosts(
    tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)  # a 2-core cpuset
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # on a 64-core node
    assert _threads_chosen(small_cnn_doc(), tmp_path, write_manifest, monkeypatch) == 2


def test_spec_threads_win_over_the_cores(
    tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    doc = small_cnn_doc(benchmark={"threads": 1})
    assert _threads_chosen(doc, tmp_path, write_manifest, monkeypatch) == 1
