"""Where a TVM MetaSchedule tuning database lives, and how builds share it: one per (hardware class,
TVM version, target string), the way TensorRT timing caches are shared (kompile.compile_jobs.trt.cache).

A database is MetaSchedule's JSON pair: `database_workload.json` (one `[hash, workload]` line per
tuned kernel) and `database_tuning_record.json` (one `[workload line index, record]` line per
measured schedule). A build works on a private copy (the compile request's `state`) and extends it;
afterwards the copy is merged into the local shared folder (under a lock: two local runs may finish
together) and, in a Job, into the store's copy: one object holding both files, read, merged and
written only if no other build of the class wrote it in between (S3 conditional writes; a file lock
on a local store), else read and merged again, so that two builds pushing at once both keep what
they tuned. The merge is the union of workloads and of records, records re-indexed to the merged
workload lines.

Locally (`kompile run`) the shared folder is ${KOMPILE_CACHE:-~/.cache/kompile}/tuning-databases,
shared by every run on this machine; a Job uses <store>/timing-caches (KOMPILE_TIMING_CACHE_URI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from kompile.artifact_store import StoreError, locked

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
FILES = (WORKLOADS, RECORDS)
STORE_OBJECT = "tuning-database.json"
"""The store's copy: both files' lines in one object, so that one conditional write replaces both
(two writes let another build's workloads land between them, filing records under its kernels)."""
PUSH_ATTEMPTS = 8
"""Merges a push tries while other builds of the class keep writing the store's copy first."""
ROOT_ENV = "KOMPILE_TUNING_DB_DIR"
"""The local shared folder of tuning databases, over the cache's."""


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", part).strip("-") or "unknown"


def relpath(hw_class: str, tvm_version: str, target: str) -> str:
    """`<class>/tvm-<version>/<target>`, e.g.
    cpu-amd64-avx512bf16/tvm-0.27.0.post1/llvm--mcpu=cooperlake--num-cores=2."""
    return f"{_safe(hw_class)}/tvm-{_safe(tvm_version)}/{_safe(target)}"


def local_root() -> Path:
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    cache = os.environ.get("KOMPILE_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "kompile") / "tuning-databases"


@dataclass
class Database:
    """A database's lines: workloads and records (record lines index into `workloads`)."""

    workloads: list[str]
    records: list[str]

    @classmethod
    def parse(cls, workloads: str, records: str) -> Database:
        return cls(_lines(workloads), _lines(records))

    @classmethod
    def read(cls, folder: Path) -> Database:
        texts = [(folder / f).read_text() if (folder / f).is_file() else "" for f in FILES]
        return cls.parse(*texts)

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, lines in zip(FILES, self.texts(), strict=True):
            tmp = folder / f".{name}.tmp"
            tmp.write_text(lines)
            tmp.replace(folder / name)

    def texts(self) -> tuple[str, str]:
        return "".join(w + "\n" for w in self.workloads), "".join(r + "\n" for r in self.records)

    def encode(self) -> bytes:
        return json.dumps({"workloads": self.workloads, "records": self.records}).encode()

    @classmethod
    def decode(cls, data: bytes, uri: str) -> Database:
        try:
            doc = json.loads(data)
            return cls([str(w) for w in doc["workloads"]], [str(r) for r in doc["records"]])
        except (ValueError, TypeError, KeyError) as err:
            raise StoreError(f"{uri} is not a tuning database ({type(err).__name__})") from None

    def merged(self, other: Database) -> Database:
        """The union of both: workloads by their line, records by (workload, record) once each."""
        workloads = list(self.workloads)
        index = {w: i for i, w in enumerate(workloads)}
        records = list(self.records)
        seen = {_record_key(self.workloads, r) for r in records}
        for line in other.records:
            key = _record_key(other.workloads, line)
            if key is None or key in seen:
                continue
            workload, payload = key
            if workload not in index:
                if not _parses(workload):
                    continue
                index[workload] = len(workloads)
                workloads.append(workload)
            records.append(json.dumps([index[workload], json.loads(payload)], separators=(",", ":")))
            seen.add(key)
        for w in other.workloads:  # workloads without records too (MetaSchedule commits them first)
            if w not in index and _parses(w):  # not a line cut mid-write: MetaSchedule would refuse it
                index[w] = len(workloads)
                workloads.append(w)
        return Database(workloads, records)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _record_key(workloads: list[str], line: str) -> tuple[str, str] | None:
    """(workload line, the record's JSON) of a record line; None for one that does not parse."""
    try:
        index, record = json.loads(line)
        return workloads[int(index)], json.dumps(record, separators=(",", ":"))
    except (ValueError, TypeError, IndexError):
        return None


@dataclass
class SharedDatabase:
    """One class's database: the local shared folder, and the store's copy where a Job has one."""

    rel: str
    root: Path
    remote: str | None = None
    """`<store>/timing-caches/<rel>`; None: local only."""
    endpoint: str | None = None

    @property
    def folder(self) -> Path:
        return self.root / self.rel

    def pull(self) -> int:
        """Merge the store's copy into the local folder; how many records the store had."""
        if self.remote is None:
            return 0
        try:
            theirs = self._remote_database()[0]
        except StoreError as err:  # a database is only a speed-up: tune without the store's
            print(f"kompile: tuning database not pulled from {self.remote}: {err}", file=sys.stderr)
            return 0
        if theirs is None:
            return 0
        with locked(self.folder / ".lock"):
            Database.read(self.folder).merged(theirs).write(self.folder)
        return len(theirs.records)

    def checkout(self, scratch: Path) -> Path:
        """A private copy for one build (its `state`)."""
        scratch.mkdir(parents=True, exist_ok=True)
        with locked(self.folder / ".lock"):
            for name in FILES:
                if (self.folder / name).is_file():
                    shutil.copyfile(self.folder / name, scratch / name)
        return scratch

    def checkin(self, scratch: Path) -> int:
        """Merge a build's copy back into the local folder (and the store's); records added locally."""
        mine = Database.read(scratch)
        with locked(self.folder / ".lock"):
            before = Database.read(self.folder)
            after = before.merged(mine)
            if after != before:
                after.write(self.folder)
        if self.remote is not None:
            try:
                self._push(after)
            except StoreError as err:  # a database is only a speed-up: the build stands without it
                print(f"kompile: tuning database not pushed to {self.remote}: {err}", file=sys.stderr)
        return len(after.records) - len(before.records)

    @property
    def _object(self) -> str:
        assert self.remote is not None
        return f"{self.remote}/{STORE_OBJECT}"

    def _remote_database(self, replace_corrupt: bool = False) -> tuple[Database | None, str | None]:
        """The store's copy (None where there is none yet) and its version, for the write. A copy
        that does not parse raises StoreError, or with `replace_corrupt` counts as empty: merged
        into nothing, it would refuse every later push of the class."""
        from kompile.artifact_store import read_versioned

        data, version = read_versioned(self._object, self.endpoint)
        if data is None:
            return None, version
        try:
            return Database.decode(data, self._object), version
        except StoreError as err:
            if not replace_corrupt:
                raise
            print(f"kompile: {err}: replaced by this build's", file=sys.stderr)
            return Database([], []), version

    def _push(self, local: Database) -> bool:
        """Write the union of the store's copy and `local` when it adds anything, only over the copy
        it merged: where another build wrote in between, merge with what that build left."""
        from kompile.artifact_store import write_if_unchanged

        for _ in range(PUSH_ATTEMPTS):
            theirs, version = self._remote_database(replace_corrupt=True)
            base = theirs or Database([], [])
            merged = base.merged(local)
            if merged == base:
                return False
            if write_if_unchanged(self._object, merged.encode(), version, self.endpoint):
                return True
        raise StoreError(f"{self._object} was written by other builds {PUSH_ATTEMPTS} times in a row")


def shared_database(hw_class: str, tvm_version: str, target: str) -> SharedDatabase:
    """This build's database: KOMPILE_TIMING_CACHE_URI (set by the operator on compile Jobs) names
    the store's folder, KOMPILE_S3_ENDPOINT its endpoint."""
    from kompile.api.job_contract import JobEnv

    rel = relpath(hw_class, tvm_version, target)
    uri = os.environ.get(JobEnv.TIMING_CACHE_URI)
    remote = f"{uri.rstrip('/')}/{rel}" if uri else None
    return SharedDatabase(rel, local_root(), remote, os.environ.get(JobEnv.S3_ENDPOINT) or None)
