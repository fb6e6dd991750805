"""`kompile operator` started with what it cannot work with says what to change, exit 2: run
outside a cluster without a kubeconfig it ended "kompile failed unexpectedly: ConfigException:
Invalid kube-config file", and a malformed setting (KOMPILE_WORKERS=abc) as a ValueError from
the module import; an artifact store of another scheme was taken and failed at the first Job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kompile.operator.settings import Settings, SettingsError


@pytest.mark.parametrize(
    ("env", "phrase"),
    [
        ({"KOMPILE_WORKERS": "abc"}, "KOMPILE_WORKERS: expected a whole number, got 'abc'"),
        ({"KOMPILE_RESYNC_SECONDS": "soon"}, "KOMPILE_RESYNC_SECONDS: expected a number, got 'soon'"),
        ({"KOMPILE_ARTIFACT_STORE": "ftp://host/x"}, "KOMPILE_ARTIFACT_STORE: 'ftp://host/x' is neither"),
    ],
)
def test_a_malformed_setting_is_named(env: dict[str, str], phrase: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert phrase in str(info.value), info.value


def _operator(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KOMPILE_", "KUBERNETES_"))}
    clean |= {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path), **env}
    kompile = Path(sys.executable).with_name("kompile")
    return subprocess.run(
        [str(kompile), "operator"], env=clean, capture_output=True, text=True, timeout=120, check=False
    )


def test_no_cluster_credentials_is_an_input_error(tmp_path: Path) -> None:
    res = _operator(tmp_path)
    assert res.returncode == 2, res.stderr
    assert "no Kubernetes credentials" in res.stderr and "KUBECONFIG" in res.stderr, res.stderr
    assert "unexpectedly" not in res.stderr and "Traceback" not in res.stderr


def test_a_malformed_setting_stops_the_operator_before_it_starts(tmp_path: Path) -> None:
    res = _operator(tmp_path, KOMPILE_WORKERS="abc")
    assert res.returncode == 2, res.stderr
    assert "KOMPILE_WORKERS: expected a whole number, got 'abc'" in res.stderr, res.stderr
    assert "unexpectedly" not in res.stderr
