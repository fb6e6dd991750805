"""The cores this process may run on: shared by the pipeline and the backends' own environments
(standard library only, so an environment imports it without the rest of kompile)."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (the cgroup/affinity view, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
