"""A local run leaves its artifacts, not a second copy of each: every packaged build folder and the
ONNX export are removed when the run ends (for a 2.25 GB model, `kompile run` left 4.8 GB of
build and export files beside the 2.4 GB artifact); a build that failed keeps its folder and log
for a look, and a build starts in an empty folder, so nothing an earlier run left there can reach
an artifact."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.pipeline.conftest import small_cnn_doc


def _files(repo: Path) -> dict[str, str]:
    """The artifact's model files (the saved outputs beside them carry the run's time)."""
    version = repo / "small" / "1"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(version.iterdir())}


def test_a_run_keeps_its_artifacts_and_drops_its_build_copies(
    tmp_path: Path, kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    targets = [
        {"name": "ort", "backend": "onnxruntime", "precision": "fp32"},
        {
            "name": "multi",
            "backend": "auto",
            "precision": "fp32",
            "candidates": [{"backend": "onnxruntime"}, {"backend": "openvino"}],
        },
        # Refused by AOTInductor's option check at build time: its folder stays for a look.
        {"name": "broken", "backend": "inductor", "precision": "fp32", "options": {"cudaGraphs": "true"}},
    ]
    manifest = write_manifest(small_cnn_doc(targets=targets))
    work = tmp_path / ".kompile"
    stale = work / "build" / "ort" / "left-by-an-earlier-run.bin"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    res = kompile_run(manifest, "--no-register")
    assert res.stdout, res.stderr
    status = {t["name"]: t for t in res.status["targets"]}
    assert status["ort"]["phase"] == status["multi"]["phase"] == "Succeeded", res.stderr
    assert status["broken"]["phase"] == "Failed"
    left = sorted(str(p.relative_to(work / "build")) for p in (work / "build").rglob("*") if p.is_file())
    assert all(name.startswith("broken/") for name in left), left
    assert not (work / "export").exists()
    repos = {n: Path(status[n]["artifact"]["uri"].removeprefix("file://")) for n in ("ort", "multi")}
    before = {n: _files(r) for n, r in repos.items()}
    assert all(files for files in before.values()), before
    # A second run of the same model rebuilds the same artifacts: the first run's stay intact.
    res = kompile_run(manifest, "--no-register")
    assert {n: _files(r) for n, r in repos.items()} == before
