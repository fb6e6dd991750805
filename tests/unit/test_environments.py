"""Finding a backend's own environment (kompile.compile_jobs.environments): the cached one keyed by
its pins, KOMPILE_ENV_<NAME>, what a missing one says, and its versions read without running it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kompile.compile_jobs import environments
from kompile.compile_jobs.env_protocol import env_var
from kompile.compile_jobs.environments import EnvironmentMissing, find_environment

PINS = environments.requirements_file("litert")


def _key() -> str:
    return hashlib.sha256(PINS.read_bytes()).hexdigest()[:16]


def _fake_env(path: Path, complete: bool = True, dists: dict[str, str] | None = None) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text("#!/bin/sh\n")
    if complete:
        (path / ".complete").touch()
    site = path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name, version in (dists or {}).items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def test_the_pins_file_is_the_setup_scripts() -> None:
    assert PINS.exists() and PINS.name == "env-litert.txt"
    assert env_var("litert") == "KOMPILE_ENV_LITERT"


def test_a_missing_environment_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentMissing, match=r"run scripts/setup-backend-env.sh litert") as err:
        find_environment("litert", {"KOMPILE_CACHE": str(tmp_path)})
    assert err.value.reason == "EnvironmentMissing"
    assert f"env-litert-{_key()} is not built" in str(err.value)


def test_a_half_built_or_stale_environment_is_not_used(tmp_path: Path) -> None:
    _fake_env(tmp_path / f"env-litert-{_key()}", complete=False)
    _fake_env(tmp_path / "env-litert-0000000000000000")
    with pytest.raises(
        EnvironmentMissing, match=r"env-litert-0000000000000000 in .* were built from other pins"
    ):
        find_environment("litert", {"KOMPILE_CACHE": str(tmp_path)})


def test_the_environment_of_the_pins_is_found(tmp_path: Path) -> None:
    path = _fake_env(tmp_path / f"env-litert-{_key()}")
    assert find_environment("litert", {"KOMPILE_CACHE": str(tmp_path)}) == path


def test_the_setting_names_an_environment_elsewhere(tmp_path: Path) -> None:
    path = _fake_env(tmp_path / "image-env")
    assert (
        find_environment("litert", {"KOMPILE_ENV_LITERT": str(path), "KOMPILE_CACHE": "/nonexistent"}) == path
    )
    with pytest.raises(EnvironmentMissing, match=r"KOMPILE_ENV_LITERT=/nowhere has no bin/python"):
        find_environment("litert", {"KOMPILE_ENV_LITERT": "/nowhere"})


def test_the_all_environments_image_finds_each_by_name(tmp_path: Path) -> None:
    """The compile-envs image keeps every environment at KOMPILE_ENVS_DIR/<name>."""
    shelf = tmp_path / "envs"
    litert = _fake_env(shelf / "litert")
    _fake_env(shelf / "xla")
    env = {environments.ENVS_DIR: str(shelf), "KOMPILE_CACHE": str(tmp_path / "empty")}
    assert find_environment("litert", env) == litert
    assert find_environment("xla", env) == shelf / "xla"
    with pytest.raises(EnvironmentMissing):  # not on the shelf, not in the cache
        find_environment("iree", env)


def test_without_the_pins_file_the_newest_complete_one_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environments, "requirements_file", lambda name: tmp_path / "absent.txt")
    cache = tmp_path / "cache"
    with pytest.raises(EnvironmentMissing, match=r"none is built in .*cache: run scripts/setup-backend-env"):
        find_environment("litert", {"KOMPILE_CACHE": str(cache)})
    _fake_env(cache / "env-litert-aaaa", complete=False)
    built = _fake_env(cache / "env-litert-bbbb")
    assert find_environment("litert", {"KOMPILE_CACHE": str(cache)}) == built


def test_versions_are_read_from_the_environments_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _fake_env(tmp_path / "env", dists={"litert-torch": "0.10.0", "torch": "2.14.1"})
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(path))
    assert environments.installed_versions("litert", ("litert-torch", "ai-edge-litert", "torch")) == {
        "litert-torch": "0.10.0",
        "torch": "2.14.1",
    }
    from kompile.compile_jobs.backends.base import get_backend

    assert (
        get_backend("litert").version()
        == "0.10.0+ai-edge-litert=unknown+ai-edge-quantizer=unknown+torch=2.14.1"
    )
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(tmp_path / "gone"))
    assert environments.installed_versions("litert", ("torch",)) == {}
