"""Per-file test seconds from a pytest `--durations=0` report, for tests/file_seconds.json.

`make test` runs whole files on each xdist worker (`--dist loadfile`); tests/conftest.py sends the
heaviest files first so that no worker is left with a long file at the end while the other idles.
Regenerate the table from a full run's report:

    make test PYTEST_ARGS="--durations=0" 2>&1 | tee /tmp/test.log
    python -m devtools.file_seconds /tmp/test.log > tests/file_seconds.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

# "440.10s call     tests/pipeline/test_tvm_backend.py::test_winograd_auto_..."
_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(tests/\S+?\.py)::")


def file_seconds(report: str) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests), heaviest first."""
    totals: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        if m := _LINE.match(line):
            totals[m.group(2)] += float(m.group(1))
    return {f: round(s, 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1])}


def heavy_first_key(seconds: dict[str, float], heavy_s: float) -> Callable[[str], float]:
    """A sort key over test node ids: files of `heavy_s` seconds or more first, heaviest first;
    every other file (and one the table lacks) ties at 0, so a stable sort keeps its order."""

    def key(nodeid: str) -> float:
        s = float(seconds.get(nodeid.split("::", 1)[0], 0.0))
        return -s if s >= heavy_s else 0.0

    return key


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("report", type=Path, help="a pytest log with --durations=0's report")
    args = p.parse_args(argv)
    totals = file_seconds(args.report.read_text(errors="replace"))
    if not totals:
        print(f"no durations report in {args.report}: run pytest with --durations=0", file=sys.stderr)
        return 1
    print(json.dumps(totals, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
