"""A running compile Job tells the store what it is doing, for the operator to show in the target's
status: "compile Job running" said nothing for the minutes (up to most of an hour, tuning) a Job
runs. The latest line is written at most every few seconds, and removed when the Job ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kompile.api.cache import progress_uri
from kompile.api.job_contract import ExitCode, JobProgress
from kompile.api.spec import Target
from kompile.artifact_store import StoreError, read_bytes
from kompile.compile_jobs import progress as progress_mod
from kompile.compile_jobs.pipeline import LogReporter
from kompile.compile_jobs.progress import StoreProgress
from tests.pipeline.conftest import EXAMPLES, run_compile_job, small_cnn_doc


def test_the_latest_line_reaches_the_store_at_most_once_per_interval(tmp_path: Path) -> None:
    uri = (tmp_path / "cache" / "ns" / "progress" / "k.json").as_uri()
    lines: list[str] = []
    writes: list[JobProgress] = []
    wrote = threading.Event()

    def write(at: str, data: bytes, endpoint: str | None) -> None:
        writes.append(JobProgress.loads(data))
        wrote.set()
        (tmp_path / "cache" / "ns" / "progress").mkdir(parents=True, exist_ok=True)
        Path(at.removeprefix("file://")).write_bytes(data)

    progress = StoreProgress(LogReporter(lines.append), uri, None, every=0.3, write=write)
    progress.stage(None, "loading source")
    assert wrote.wait(5)
    for i in range(20):  # a burst: one write for the lot, the last line
        progress.stage("cpu", f"step {i}")
    end = time.monotonic() + 10
    while len(writes) < 2 and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.7)  # two more intervals: nothing else is written
    assert len(lines) == 21, "every line still goes to the log"
    assert [w.line for w in writes] == ["[pipeline] loading source", "[cpu] step 19"], writes
    assert writes[-1].started == writes[0].started
    progress.close()
    assert read_bytes(uri) is None, "the note goes when the Job ends"


def test_a_store_that_refuses_the_note_costs_one_log_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(at: str, data: bytes, endpoint: str | None) -> None:
        raise StoreError(f"write of {at} failed: AccessDenied")

    progress = StoreProgress(
        LogReporter(print), (tmp_path / "p.json").as_uri(), None, every=0.05, write=refuse
    )
    for i in range(5):
        progress.stage(None, f"step {i}")
        time.sleep(0.1)
    progress.close()
    err = capsys.readouterr().err
    assert err.count("progress not shown in status") == 1 and "AccessDenied" in err, err


def test_a_compile_job_writes_its_progress_and_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[JobProgress] = []
    real = progress_mod.write_bytes

    def recording(uri: str, data: bytes, endpoint: str | None = None, credentials: Any = None) -> None:
        told.append(JobProgress.loads(data))
        real(uri, data, endpoint)

    monkeypatch.setattr(progress_mod, "write_bytes", recording)
    monkeypatch.setattr(progress_mod, "PROGRESS_EVERY_SECONDS", 0.05)
    code, status = run_compile_job(monkeypatch, small_cnn_doc(), Target(name="cpu-fp32"), tmp_path, EXAMPLES)
    assert code == ExitCode.VERDICT and status.phase == "Succeeded", status
    lines = [t.line for t in told]
    # Lines follow each other by milliseconds at first; a compile holds its line for seconds.
    assert any("] compiling with " in line for line in lines), lines
    assert all(t.started == told[0].started for t in told)
    prefix = (tmp_path / "store" / "cache" / "k").as_uri()
    assert read_bytes(progress_uri(prefix)) is None, "removed when the Job ended"


def test_a_job_whose_keys_the_store_refuses_stops_before_the_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: Any, s3_env: dict[str, str], capsys: Any
) -> None:
    """Its first write (the progress note) is refused: keys that may not write the store would
    fail the upload after the whole compile (tens of minutes, a tuning). The Job stops at once,
    not retried (exit code 2), the target Failed with StoreRefused and what to check."""
    s3_server.create_bucket("job-refused")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    code, status = run_compile_job(
        monkeypatch,
        small_cnn_doc(),
        Target(name="cpu-fp32"),
        tmp_path,
        EXAMPLES,
        prefix="s3://job-refused/cache/ns/k",
        s3_endpoint=s3_server.endpoint,
    )
    assert code == ExitCode.BAD_INPUT and status.phase == "Failed", status
    assert status.reason == "StoreRefused" and "AWS_SECRET_ACCESS_KEY" in (status.message or ""), status
    assert "compiling with" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [("AccessDenied", ExitCode.BAD_INPUT), ("ExpiredToken", ExitCode.STORE)],
)
def test_an_upload_the_store_refuses_after_the_compile_is_not_retried_unless_a_new_pod_can_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, exit_code: ExitCode
) -> None:
    """The note was written, then the artifact upload is refused (a bucket policy that lets the keys
    write progress/ but not the artifact's folder). A retried pod would compile again for the same no:
    the Job fails at once, StoreRefused, saying what to check. An expired session token is the
    exception: a new pod reads the Secret again, and a rotated token works."""
    from kompile.artifact_store import StoreDenied
    from kompile.compile_jobs import job

    def refuse(src: Path, uri: str, endpoint: str | None = None) -> None:
        raise StoreDenied(f"upload to {uri} failed: {code}", code)

    monkeypatch.setattr(job, "put_tree", refuse)
    doc = small_cnn_doc()
    exited, status = run_compile_job(monkeypatch, doc, Target(name="cpu-fp32"), tmp_path, EXAMPLES)
    assert exited == exit_code, (exited, status)
    if exit_code == ExitCode.BAD_INPUT:
        assert (status.phase, status.reason) == ("Failed", "StoreRefused"), status
        assert "may use this bucket" in (status.message or ""), status
