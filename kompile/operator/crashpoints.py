"""Test-only crash points. With KOMPILE_CRASH_AT set to a point's name, the operator exits at once
(as a SIGKILL would: no cleanup, no status written) the first time it reaches that point. The
chaos test uses them to kill it exactly where a crash would do the most harm; unset, they cost a
dictionary lookup."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("kompile.operator")

POINTS = ("after-job-create", "after-registration", "before-status-patch")
EXIT_CODE = 137  # what a SIGKILLed process reports


def crash_point(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("KOMPILE_CRASH_AT") == name:
        log.error("KOMPILE_CRASH_AT=%s: exiting now, as a crash would", name)
        logging.shutdown()
        os._exit(EXIT_CODE)
