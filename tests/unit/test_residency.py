"""Which validated artifacts stay loaded for the benchmark: the memory rule and the unloaded runner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kompile.compile_jobs.residency import (
    ROOM_FACTOR,
    MemoryLimitError,
    Residency,
    UnloadedRunner,
    parse_bytes,
)


def test_memory_limits_read_as_bytes_with_kubernetes_suffixes() -> None:
    assert parse_bytes("512") == 512
    assert parse_bytes("8G") == 8 * 10**9 and parse_bytes("8Gi") == 8 * 2**30
    assert parse_bytes("1.5Mi") == int(1.5 * 2**20)
    with pytest.raises(MemoryLimitError, match="KOMPILE_MEMORY_LIMIT"):
        parse_bytes("lots")


def test_an_artifact_stays_loaded_only_while_room_for_the_next_build_remains() -> None:
    gb = 10**9
    assert Residency(2 * gb, room=lambda: ROOM_FACTOR * 2 * gb).keep()
    small_room = Residency(2 * gb, room=lambda: 5 * gb)
    assert not small_room.keep() and "5.0 GB of memory left" in small_room.describe()
    assert Residency(2 * gb, room=lambda: None).keep()  # nothing readable: as before, all stay


class _Runner:
    input_names = ["x"]
    output_names = ["y"]
    loads = 0
    closed = 0

    def __init__(self) -> None:
        type(self).loads += 1

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
        return [next(iter(feeds.values())) * 2]

    def close(self) -> None:
        type(self).closed += 1


def test_an_unloaded_runner_loads_for_each_use_and_lets_go_after() -> None:
    class Counted(_Runner):  # its own counts, whatever other tests made of _Runner's
        loads = 0
        closed = 0

    first = Counted()
    unloaded = UnloadedRunner(first, Counted)
    assert (Counted.loads, Counted.closed) == (1, 1)  # the validated one was let go at once
    assert unloaded.output_names == ["y"]
    with unloaded.loaded() as runner:
        assert (Counted.loads, Counted.closed) == (2, 1)
        with unloaded.loaded() as again:  # nested: one load shared
            assert again is runner
        assert runner.run({"x": np.ones(2)})[0].tolist() == [2.0, 2.0]
    assert (Counted.loads, Counted.closed) == (2, 2)
    assert unloaded.run({"x": np.ones(1)})[0].tolist() == [2.0]
    assert (Counted.loads, Counted.closed) == (3, 3)


def test_the_container_limit_bounds_the_room(tmp_path: Any) -> None:
    from kompile.compile_jobs.residency import _cgroup_room

    (tmp_path / "memory.max").write_text("8589934592\n")
    (tmp_path / "memory.current").write_text("2147483648\n")
    assert _cgroup_room(tmp_path) == 6 * 2**30
    # The inactive page cache (artifacts written) is reclaimed before the limit bites.
    (tmp_path / "memory.stat").write_text("anon 1073741824\ninactive_file 1073741824\n")
    assert _cgroup_room(tmp_path) == 7 * 2**30
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_room(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("4294967296\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("1073741824\n")
    assert _cgroup_room(v1) == 3 * 2**30
    assert _cgroup_room(tmp_path / "none") is None


def test_an_artifact_that_will_not_load_again_is_left_untimed_and_the_run_goes_on() -> None:
    """Loaded once at validation, an unloaded artifact could still fail to load for its round (the
    memory it needed taken meanwhile): that round is skipped with the reason, nothing else lost."""
    from kompile.api.status import TargetStatus
    from kompile.compile_jobs.backends.base import BackendError
    from kompile.compile_jobs.timing import Timed, run_benchmark
    from tests.unit.test_operator_builders import cm

    def refuse() -> _Runner:
        raise BackendError("out of memory")

    model = cm(targets=[{"name": "cpu", "backend": "onnxruntime"}], benchmark={"iterations": 1, "warmup": 0})
    eager = _Runner()
    loaded = type("Loaded", (), {"module": None})()
    stays = Timed(
        "stays",
        _Runner(),
        TargetStatus(name="stays", backend="onnxruntime", precision="fp32", phase="Succeeded"),
    )
    gone = Timed(
        "gone",
        UnloadedRunner(_Runner(), refuse),
        TargetStatus(name="gone", backend="onnxruntime", precision="fp32", phase="Succeeded"),
    )
    said: list[str] = []
    reporter = type("R", (), {"stage": lambda self, t, m: said.append(f"{t}: {m}")})()
    run_benchmark(model, loaded, eager, [stays, gone], [1], reporter)  # type: ignore[arg-type]
    assert stays.status.latency and stays.status.speedup
    assert not gone.status.latency and gone.status.speedup is None
    assert "gone: not timed at batch 1: loading it again failed: out of memory" in said
