"""An error kompile did not expect reaches the user as one line that says it is kompile's bug, with
exit code 70 and the traceback in a file to report, never as a raw traceback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kompile import cli


def test_an_unexpected_error_is_one_line_and_a_traceback_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def broken() -> None:
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : something deep\nsecond line")

    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.setattr(sys, "argv", ["kompile", "run", "m.yaml"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("KOMPILE_DEBUG", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == cli.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "kompile failed unexpectedly: RuntimeError: [ONNXRuntimeError] : 1 : FAIL : something deep" in err
    assert "Traceback" not in err and "second line" not in err
    found = re.search(r"report it with (\S+)", err.replace("\n", " "))
    assert found, err
    saved = Path(found.group(1)).read_text()
    assert saved.startswith("kompile run m.yaml") and "Traceback" in saved and "second line" in saved
    assert Path(found.group(1)).parent == tmp_path

    monkeypatch.setenv("KOMPILE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something deep"):
        cli.main()


def test_the_report_file_and_line_keep_keys_in_urls_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The traceback file is meant for a bug report: a --tracking-uri with user:password@ (in the
    command line and in MLflow's error, which quotes the URL) must not be in it nor on the screen."""
    uri = "https://kompile:s3cret@mlflow.internal"

    def broken() -> None:
        raise RuntimeError(f"API request to {uri}/api/2.0/mlflow/runs/create failed")

    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.setattr(sys, "argv", ["kompile", "run", "m.yaml", "--tracking-uri", uri])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("KOMPILE_DEBUG", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(SystemExit):
        cli.main()
    err = capsys.readouterr().err
    (saved,) = tmp_path.glob("kompile-error-*.txt")
    for text in (err, saved.read_text()):
        assert "mlflow.internal" in text and "s3cret" not in text, text


def test_a_full_disk_says_where_and_what_to_do_not_that_kompile_has_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import errno

    def full() -> None:
        try:
            dst = str(tmp_path / "x.onnx")
            raise OSError(errno.ENOSPC, "No space left on device", "model.onnx", None, dst)
        except OSError as err:  # as shutil and the exporters raise it: wrapped in their own errors
            raise RuntimeError("export failed") from err

    monkeypatch.setattr(cli, "app", full)
    monkeypatch.delenv("KOMPILE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == cli.EXIT_TARGET_FAILED
    err = capsys.readouterr().err.replace("\n", " ")
    assert f"no space left on the disk holding {tmp_path / 'x.onnx'}" in err and "MiB free" in err, err
    assert "--work-dir" in err and "bug" not in err and "Traceback" not in err, err


def test_an_interrupted_run_says_so_and_exits_130(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM, which the run turns into one) ended `kompile run` with exit code 130
    and not a word: the live progress just stopped. It says what the interruption left."""
    from typer.testing import CliRunner

    from kompile import local_run

    def interrupted(*_: object) -> tuple[int, str | None]:
        raise KeyboardInterrupt

    monkeypatch.setattr(local_run, "execute", interrupted)
    manifest = Path(__file__).parents[2] / "examples" / "small-cnn.yaml"
    res = CliRunner().invoke(cli.app, ["run", str(manifest), "--work-dir", str(tmp_path / "w")])
    said = " ".join(res.stderr.split())
    assert res.exit_code == 130, said
    assert "interrupted" in said and "nothing was registered" in said, said
