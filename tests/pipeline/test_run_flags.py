"""`kompile run` flags that name something wrong are input errors (exit 2) said before any work:
`--target` with a name the manifest does not have ran the whole source load and export, then
printed an empty table and "no target can run on this machine: " with nothing after it; an
unwritable `--work-dir` or `--artifacts` ended as "kompile failed unexpectedly: FileNotFoundError"."""

from __future__ import annotations

import pytest

from tests.pipeline.conftest import small_cnn_doc


def test_an_unknown_target_is_named_with_the_ones_there_are(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register", "--target", "gpu-fp16")
    assert res.code == 2
    assert "--target gpu-fp16: small has no such target; its targets: cpu-fp32" in res.stderr, res.stderr
    assert "loading source" not in res.stderr  # said before any work


def test_fleet_targets_are_listed_by_their_generated_names(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(targets=None, fleet={"enabled": True, "precisions": ["fp32", "int8"]})
    del doc["spec"]["targets"]
    res = kompile_run(write_manifest(doc), "--no-register", "--target", "cpu-fp32")
    assert res.code == 2
    assert "its targets: cpu-" in res.stderr and "-fp32, cpu-" in res.stderr, res.stderr


@pytest.mark.parametrize("flag", ["--work-dir", "--artifacts"])
def test_a_folder_that_cannot_be_made_is_an_input_error(kompile_run, write_manifest, flag: str) -> None:  # type: ignore[no-untyped-def]
    # Under /proc nothing can be created, even by root.
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register", flag, "/proc/kompile-here")
    assert res.code == 2, res.stderr
    assert "cannot create /proc/kompile-here" in res.stderr and "unexpectedly" not in res.stderr, res.stderr


def test_a_second_run_in_the_same_work_dir_waits_its_turn(kompile_run, write_manifest, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two runs in one work dir shared its build folders, export and reference file (fleet target
    names repeat across models): each would build into, and remove, the other's files."""
    import fcntl

    work = tmp_path / ".kompile"
    work.mkdir()
    with (work / ".lock").open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242")
        held.flush()
        res = kompile_run(write_manifest(small_cnn_doc()), "--no-register")
    assert res.code == 2
    assert f"another kompile run (pid 4242) is using {work}" in res.stderr, res.stderr
    assert "--work-dir" in res.stderr and "loading source" not in res.stderr
    # Released (the first run ended): the next run goes ahead.
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register")
    assert res.code == 0, res.stderr


def test_the_default_artifact_folder_names_its_flags(kompile_run, write_manifest, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With no store given, artifacts go to the work dir's `artifacts` folder: when that cannot be
    made, the error named spec.registry.artifactStore, a field the manifest does not have."""
    work = tmp_path / ".kompile"
    work.mkdir()
    (work / "artifacts").write_text("a file where the folder goes")
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register")
    assert res.code == 2, res.stderr
    assert f"cannot create {work / 'artifacts'}" in res.stderr, res.stderr
    assert "--artifacts" in res.stderr and "artifactStore" not in res.stderr, res.stderr
