"""The hardware class's shared TVM tuning database kept in step between builds, machines and the
artifact store (file:// and the real S3-compatible server): merged as a union, never losing what a
build of the class tuned, even when two builds push at once. No TVM needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kompile.compile_jobs.tvm_database import Database, SharedDatabase


def _db(workloads: list[str], records: list[tuple[int, str]]) -> Database:
    return Database(
        [json.dumps([str(i), w]) for i, w in enumerate(workloads)],
        [json.dumps([i, [r]]) for i, r in records],
    )


def test_merge_is_the_union_with_records_reindexed() -> None:
    ours = _db(["conv", "pool"], [(0, "c1"), (1, "p1")])
    theirs = _db(["dense", "conv"], [(0, "d1"), (1, "c1"), (1, "c2")])
    merged = ours.merged(theirs)
    pairs = {(json.loads(merged.workloads[i])[1], r[0]) for i, r in (json.loads(x) for x in merged.records)}
    assert pairs == {("conv", "c1"), ("pool", "p1"), ("dense", "d1"), ("conv", "c2")}
    assert merged.workloads[:2] == ours.workloads  # the base's lines stay a prefix
    assert merged.merged(theirs) == merged and merged.merged(ours) == merged


def _sync_round_trip(remote: str, tmp_path: Path) -> None:
    """Two builds of one class on two machines: the first pushes, the second pulls it, both extend
    it, and the store keeps the union whatever the order of their pushes."""
    a = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-a", remote)
    b = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-b", remote)
    assert a.pull() == 0
    state_a = a.checkout(tmp_path / "build-a")
    _db(["conv"], [(0, "c1")]).write(state_a)
    assert a.checkin(state_a) == 1
    assert b.pull() == 1
    state_b = b.checkout(tmp_path / "build-b")
    assert len(Database.read(state_b).records) == 1
    _db(["conv", "dense"], [(0, "c1"), (1, "d1")]).write(state_b)
    # Meanwhile machine a tunes another kernel and pushes first.
    state_a2 = a.checkout(tmp_path / "build-a2")
    Database.read(state_a2).merged(_db(["pool"], [(0, "p1")])).write(state_a2)
    a.checkin(state_a2)
    b.checkin(state_b)
    fresh = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-c", remote)
    assert fresh.pull() == 3
    kept = {json.loads(r)[1][0] for r in Database.read(fresh.folder).records}
    assert kept == {"c1", "d1", "p1"}


def test_database_sync_through_a_file_store(tmp_path: Path) -> None:
    _sync_round_trip((tmp_path / "store" / "timing-caches").as_uri() + "/cpu-x/tvm-0.27/llvm", tmp_path)


def test_database_sync_through_the_s3_server(s3_server: Any, s3_env: Any, tmp_path: Path) -> None:
    s3_server.create_bucket("tvm-db")
    _sync_round_trip("s3://tvm-db/timing-caches/cpu-x/tvm-0.27/llvm", tmp_path)


def test_an_unreachable_store_only_costs_the_sharing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database is a speed-up: a store that cannot be read or written is reported, never fatal."""
    db = SharedDatabase(
        "cpu-x/tvm-0.27/llvm", tmp_path / "local", "s3://no-such-bucket/t", "http://127.0.0.1:9"
    )
    assert db.pull() == 0
    state = db.checkout(tmp_path / "build")
    _db(["conv"], [(0, "c1")]).write(state)
    assert db.checkin(state) == 1  # kept locally
    err = capsys.readouterr().err
    assert "tuning database not pulled" in err and "tuning database not pushed" in err


def _pairs(db: Database) -> set[tuple[str, str]]:
    """(workload name, record) of every record line, through the line's workload index."""
    return {(json.loads(db.workloads[i])[1], r[0]) for i, r in (json.loads(x) for x in db.records)}


def _race(remote: str, tmp_path: Path) -> None:
    """Two builds of a class push at once: b's whole push lands after a read the store and before a
    writes it. The store keeps both builds' records, each under its own workload."""
    rel = "cpu-x/tvm-0.27/llvm"
    first = SharedDatabase(rel, tmp_path / "machine-0", remote)
    state = first.checkout(tmp_path / "build-0")
    _db(["conv"], [(0, "c1")]).write(state)
    first.checkin(state)
    a = SharedDatabase(rel, tmp_path / "machine-a", remote)
    b = SharedDatabase(rel, tmp_path / "machine-b", remote)
    assert a.pull() == 1 and b.pull() == 1
    state_a, state_b = a.checkout(tmp_path / "build-a"), b.checkout(tmp_path / "build-b")
    Database.read(state_a).merged(_db(["pool"], [(0, "p1")])).write(state_a)
    Database.read(state_b).merged(_db(["dense"], [(0, "d1")])).write(state_b)
    read_store = a._remote_database
    raced: list[bool] = []

    def read_then_b_pushes(*args: Any, **kwargs: Any) -> Any:
        seen = read_store(*args, **kwargs)
        if not raced:
            raced.append(True)
            b.checkin(state_b)
        return seen

    a._remote_database = read_then_b_pushes  # type: ignore[method-assign]
    a.checkin(state_a)
    assert raced
    fresh = SharedDatabase(rel, tmp_path / "machine-c", remote)
    assert fresh.pull() == 3
    assert _pairs(Database.read(fresh.folder)) == {("conv", "c1"), ("pool", "p1"), ("dense", "d1")}


def test_two_builds_pushing_at_once_through_a_file_store_lose_nothing(tmp_path: Path) -> None:
    _race((tmp_path / "store" / "timing-caches").as_uri() + "/cpu-x/tvm-0.27/llvm", tmp_path)


def test_two_builds_pushing_at_once_through_the_s3_server_lose_nothing(
    s3_server: Any, s3_env: Any, tmp_path: Path
) -> None:
    s3_server.create_bucket("tvm-race")
    _race("s3://tvm-race/timing-caches/cpu-x/tvm-0.27/llvm", tmp_path)


def test_a_push_that_other_builds_keep_beating_gives_up_saying_so_and_keeps_its_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    remote = (tmp_path / "store").as_uri() + "/cpu-x/tvm-0.27/llvm"
    rel = "cpu-x/tvm-0.27/llvm"
    a = SharedDatabase(rel, tmp_path / "machine-a", remote)
    state = a.checkout(tmp_path / "build-a")
    _db(["pool"], [(0, "p1")]).write(state)
    read_store = a._remote_database
    others = iter(range(100))

    def another_build_writes_after_each_read(*args: Any, **kwargs: Any) -> Any:
        seen = read_store(*args, **kwargs)
        other = SharedDatabase(rel, tmp_path / "machine-b", remote)
        scratch = other.checkout(tmp_path / f"build-b{next(others)}")
        Database.read(scratch).merged(_db(["dense"], [(0, f"d{next(others)}")])).write(scratch)
        other.checkin(scratch)
        return seen

    a._remote_database = another_build_writes_after_each_read  # type: ignore[method-assign]
    assert a.checkin(state) == 1  # kept in the local folder
    assert "was written by other builds 8 times in a row" in capsys.readouterr().err
    assert _pairs(Database.read(a.folder)) == {("pool", "p1")}


def test_lines_cut_mid_write_are_left_out_of_the_shared_database(tmp_path: Path) -> None:
    """A tuning stopped mid-write (its step killed) leaves a cut last line in either file; the merge
    shares the complete ones, since MetaSchedule refuses to load a database with a line it cannot parse."""
    a = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-a")
    state = a.checkout(tmp_path / "build-a")
    whole = _db(["conv", "pool"], [(0, "c1"), (1, "p1")])
    workloads, records = whole.texts()
    (state / "database_workload.json").write_text(workloads + '["2", "den')
    (state / "database_tuning_record.json").write_text(records + '[2, ["d1"]]\n[2, ["d2"')
    assert a.checkin(state) == 2
    shared = Database.read(a.folder)
    assert _pairs(shared) == {("conv", "c1"), ("pool", "p1")}
    assert all(json.loads(line) for line in shared.workloads + shared.records)


def test_a_corrupt_store_copy_is_replaced_by_the_next_push_not_kept_forever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store copy that does not parse (cut by a full disk, written by hand) cannot be merged; left
    as it is, it would refuse every later push of the class. The next push replaces it, saying so."""
    remote = (tmp_path / "store").as_uri() + "/cpu-x/tvm-0.27/llvm"
    (tmp_path / "store" / "cpu-x" / "tvm-0.27" / "llvm").mkdir(parents=True)
    (tmp_path / "store" / "cpu-x" / "tvm-0.27" / "llvm" / "tuning-database.json").write_text('{"workl')
    a = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-a", remote)
    assert a.pull() == 0
    state = a.checkout(tmp_path / "build-a")
    _db(["conv"], [(0, "c1")]).write(state)
    assert a.checkin(state) == 1
    err = capsys.readouterr().err
    assert "not a tuning database" in err and "replaced" in err, err
    fresh = SharedDatabase("cpu-x/tvm-0.27/llvm", tmp_path / "machine-b", remote)
    assert fresh.pull() == 1
