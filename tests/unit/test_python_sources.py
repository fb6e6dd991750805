"""python://module:factory sources import the module from the manifest's folder, each time: a second
run in the same process (a notebook, a script calling the pipeline twice) with another folder, or
the same folder after its file was edited, gets that folder's code, never the module a previous run
left in sys.modules (whose file may be gone by then)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kompile.compile_jobs.sources import _load_python

FACTORY = """
import torch


def make():
    return torch.nn.Linear({n}, 1)
"""


def _project(root: Path, n: int) -> Path:
    (root / "userpkg").mkdir(parents=True)
    (root / "userpkg" / "__init__.py").write_text("")
    (root / "userpkg" / "nets.py").write_text(FACTORY.format(n=n))
    return root


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    saved = list(sys.path)
    yield
    sys.path[:] = saved
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_a_second_folder_gets_its_own_module_even_when_the_first_is_gone(tmp_path: Path) -> None:
    first = _project(tmp_path / "a", 3)
    model, digest_a = _load_python("python://userpkg.nets:make", first)
    assert model.in_features == 3
    shutil.rmtree(first)
    model, digest_b = _load_python("python://userpkg.nets:make", _project(tmp_path / "b", 5))
    assert model.in_features == 5 and digest_b != digest_a


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", 3)
    assert _load_python("python://userpkg.nets:make", root)[0].in_features == 3
    (root / "userpkg" / "nets.py").write_text(FACTORY.format(n=7))
    assert _load_python("python://userpkg.nets:make", root)[0].in_features == 7


def test_an_installed_module_is_imported_as_it_is(tmp_path: Path) -> None:
    import torch.nn as before

    model, _ = _load_python("python://torch.nn:Identity", tmp_path)
    assert isinstance(model, before.Identity) and sys.modules["torch.nn"] is before
