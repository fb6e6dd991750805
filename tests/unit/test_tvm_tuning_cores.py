"""How many cores a TVM tuning uses (CPU and cuda steps alike): the run's threads where the backend
sent them, else the cores this process may run on. The CPU step fell back to os.cpu_count(), and a
node's container sees the host's count (often 100+) while its cgroup grants a few: the builders
and runners must not be sized to the host."""

from __future__ import annotations

import os

import pytest

from kompile.compile_jobs.envs.tvm import tuning_cores


@pytest.fixture
def big_host_small_cpuset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 192)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)


def test_a_cpu_target_uses_its_num_cores(big_host_small_cpuset: None) -> None:
    assert tuning_cores({"cores": "2"}, {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2}) == 2


def test_a_cuda_target_uses_the_threads_the_backend_sent(big_host_small_cpuset: None) -> None:
    assert tuning_cores({"cores": "2", "device": "cuda"}, {"kind": "cuda", "arch": "sm_90"}) == 2


def test_without_a_count_the_cores_this_process_may_use(big_host_small_cpuset: None) -> None:
    assert tuning_cores({}, {"kind": "cuda", "arch": "sm_90"}) == 3
