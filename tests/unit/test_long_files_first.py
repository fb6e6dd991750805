"""The suite's own scheduling (tests/conftest.py): the files that take minutes go to the workers
first, and the list names files that exist (a renamed file would silently drop back into the
random order)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from tests import conftest

ROOT = Path(__file__).resolve().parents[2]


def test_every_long_file_exists() -> None:
    missing = [name for name in conftest.LONG_FILES if not (ROOT / name).is_file()]
    assert not missing, f"tests/conftest.py LONG_FILES names files that do not exist: {missing}"


def test_long_files_go_first_heaviest_first_and_the_rest_keep_their_order() -> None:
    heaviest, second = conftest.LONG_FILES[:2]
    ids = [
        "tests/unit/test_b.py::test_1",
        f"{second}::test_x",
        "tests/unit/test_a.py::test_2",
        f"{heaviest}::test_z",
        f"{heaviest}::test_y",
        "tests/unit/test_b.py::test_3",
    ]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(cast(Any, items))
    assert [i.nodeid for i in items] == [ids[3], ids[4], ids[1], ids[0], ids[2], ids[5]]
