"""devtools/file_seconds.py: the per-file seconds table read from pytest's durations report, and the
heaviest-first order tests/conftest.py gives the xdist workers."""

from __future__ import annotations

from pathlib import Path

from devtools.file_seconds import file_seconds, heavy_first_key, main

REPORT = """\
============================= slowest durations =============================
440.10s call     tests/pipeline/test_tvm_backend.py::test_winograd_auto_times_both_forms
273.75s call     tests/integration/test_chaos.py::test_kills_at_the_worst_moments
177.95s setup    tests/integration/test_operator.py::test_argocd_health
60.00s call     tests/pipeline/test_tvm_backend.py::test_untuned[param-1]
1.50s teardown tests/integration/test_operator.py::test_argocd_health
0.01s call     tests/unit/test_cli.py::test_help
=========================== short test summary info ============================
"""


def test_the_report_sums_setup_call_and_teardown_per_file_heaviest_first() -> None:
    totals = file_seconds(REPORT)
    assert totals == {
        "tests/pipeline/test_tvm_backend.py": 500.1,
        "tests/integration/test_chaos.py": 273.8,
        "tests/integration/test_operator.py": 179.4,
        "tests/unit/test_cli.py": 0.0,
    }
    assert list(totals) == sorted(totals, key=lambda f: -totals[f])


def test_heavy_files_go_first_and_the_rest_keep_their_order() -> None:
    seconds = {"tests/a.py": 300.0, "tests/b.py": 900.0, "tests/c.py": 50.0}
    ids = [
        "tests/c.py::t1",
        "tests/new.py::t",
        "tests/a.py::t2",
        "tests/b.py::t1",
        "tests/a.py::t1",
        "tests/c.py::t2",
    ]
    key = heavy_first_key(seconds, 100.0)
    # b, then a (each file's tests in their given order), then c and the unknown file as they came
    assert sorted(ids, key=key) == [
        "tests/b.py::t1",
        "tests/a.py::t2",
        "tests/a.py::t1",
        "tests/c.py::t1",
        "tests/new.py::t",
        "tests/c.py::t2",
    ]


def test_a_log_without_a_report_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "test.log"
    log.write_text("1 passed in 0.1s\n")
    assert main([str(log)]) == 1
    assert "--durations=0" in capsys.readouterr().err
