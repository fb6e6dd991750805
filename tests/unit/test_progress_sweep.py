"""The operator's sweep of progress notes no compile Job writes any more (a Job killed outright whose
CompiledModel was deleted before the operator saw it end): on a file:// store, with notes aged by
their modification time and the sweep's clock a stand-in."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kompile.api.cache import artifact_prefix, progress_folder, progress_uri
from kompile.operator.progress_sweep import ProgressSweep
from kompile.operator.store_access import StoreAccess

DAY = 86400.0


def _note(folder: Path, name: str, age: float) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"line": "[cpu] compiling"}')
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_notes_untouched_past_the_bound_go_and_the_rest_stay(tmp_path: Path) -> None:
    root = (tmp_path / "store").as_uri()
    folder = Path(progress_folder(root, "team-a").removeprefix("file://"))
    # The folder is where progress_uri puts a Job's note.
    assert progress_uri(artifact_prefix(root, "team-a", "k1")) == f"{progress_folder(root, 'team-a')}/k1.json"
    stale = _note(folder, "gone.json", 3 * DAY)
    running = _note(folder, "running.json", 60.0)
    entry = tmp_path / "store" / "cache" / "team-a" / "k1" / "result.json"  # a cache entry beside it
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    os.utime(entry, (time.time() - 9 * DAY,) * 2)
    now = [0.0]
    sweep = ProgressSweep(clock=lambda: now[0])
    store = StoreAccess(endpoint=None, credentials=None)

    assert sweep(progress_folder(root, "team-a"), store, stale_after=2 * 3600, every=3600) == ["gone.json"]
    assert not stale.exists() and running.exists() and entry.exists()
    # Within the interval the folder is not listed again; after it, it is.
    again = _note(folder, "gone-too.json", 3 * DAY)
    assert sweep(progress_folder(root, "team-a"), store, stale_after=2 * 3600, every=3600) == []
    now[0] = 3600.0
    assert sweep(progress_folder(root, "team-a"), store, stale_after=2 * 3600, every=3600) == [
        "gone-too.json"
    ]
    assert not again.exists() and running.exists()


def test_a_store_the_operator_may_not_use_is_not_touched(tmp_path: Path) -> None:
    root = (tmp_path / "store").as_uri()
    folder = Path(progress_folder(root, "team-b").removeprefix("file://"))
    stale = _note(folder, "gone.json", 3 * DAY)
    refused = StoreAccess(endpoint=None, credentials=None, refused="Secret s3-creds not found")
    assert ProgressSweep()(progress_folder(root, "team-b"), refused, stale_after=7200, every=3600) == []
    assert stale.exists()
    # A folder nobody wrote yet is nothing to sweep, not an error.
    store = StoreAccess(endpoint=None, credentials=None)
    assert ProgressSweep()(progress_folder(root, "team-c"), store, stale_after=7200, every=3600) == []
