"""What the wheel ships, as pyproject.toml's package discovery decides it: kompile with its py.typed
marker, and none of the repository's development code (devtools/, tests/, benchmarks/)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_only_the_kompile_package_ships() -> None:
    # pyproject-based setuptools discovers namespace packages too (kompile.compile_jobs.backends is one).
    packages = find_namespace_packages(where=str(ROOT), include=SETUPTOOLS["packages"]["find"]["include"])
    assert "kompile" in packages and "kompile.compile_jobs.backends" in packages
    assert {p.split(".")[0] for p in packages} == {"kompile"}, packages
    assert (ROOT / "devtools" / "devcluster.py").is_file()  # it exists, and is left out above


def test_the_type_marker_ships() -> None:
    assert (ROOT / "kompile" / "py.typed").is_file()
    assert "py.typed" in SETUPTOOLS["package-data"]["kompile"]
