"""The cost and outcome of candidate selection on this machine; prints JSON.

Runs the real pipeline (`kompile run`) on an example model with one target, backend auto (this CPU
class's default candidates: ONNX Runtime and AOTInductor), and reports the wall time of the whole
run, each candidate's compile time, validation and p50, the winner, and whether the winner is at
least as fast as the best single backend (same interleaved rounds, so by ratio):

    python benchmarks/selection_cost.py --model bert_base --out /tmp/selection.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

sys.path.insert(0, str(ROOT / "benchmarks"))
from cpu_artifacts import emit_json  # noqa: E402

from kompile.cli import app  # noqa: E402

EXAMPLES = {
    "bert_base": ROOT / "examples" / "bert-base.yaml",
    "resnet50": ROOT / "examples" / "resnet50.yaml",
}


def manifest(model: str, precision: str, iterations: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLES[model].read_text())
    doc["spec"]["targets"] = [{"name": f"cpu-{precision}", "backend": "auto", "precision": precision}]
    doc["spec"]["benchmark"] = {"batchSizes": [1], "warmup": 3, "iterations": iterations}
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", choices=sorted(EXAMPLES), default="bert_base")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    from typer.testing import CliRunner

    with tempfile.TemporaryDirectory(prefix="kompile-selection-") as tmp:
        path = Path(tmp) / "m.yaml"
        path.write_text(yaml.safe_dump(manifest(args.model, args.precision, args.iterations)))
        started = time.perf_counter()
        res = CliRunner().invoke(
            app, ["run", str(path), "--json", "--no-register", "--work-dir", str(Path(tmp) / ".kompile")]
        )
        wall = time.perf_counter() - started
    if res.exit_code not in (0, 1) or not res.stdout.strip().startswith("{"):
        print(res.stdout[-3000:], res.stderr[-3000:] if res.stderr else "", file=sys.stderr)
        return 2
    status = json.loads(res.stdout)
    (target,) = status["targets"]
    eager = status["baselines"][0]["latency"][0]["p50Ms"] if status["baselines"] else None
    cands = [
        {
            "name": c["name"],
            "phase": c["phase"],
            "reason": c.get("reason"),
            "compile_s": c.get("compileSeconds"),
            "p50_ms": c["latency"][0]["p50Ms"] if c.get("latency") else None,
            "speedup": c.get("speedup"),
            "min_cosine": c.get("minCosine"),
            "max_abs_error": c.get("maxAbsError"),
            "selected": c["selected"],
        }
        for c in target.get("candidates", [])
    ]
    timed = [c["p50_ms"] for c in cands if c["p50_ms"] is not None]
    winner = target.get("selection", {}).get("winner")
    winner_p50 = next((c["p50_ms"] for c in cands if c["name"] == winner), None)
    report = {
        "model": args.model,
        "precision": args.precision,
        "selection_wall_s": round(wall, 1),
        "eager_p50_ms": eager,
        "winner": winner,
        "winner_not_slower_than_best_single": winner_p50 is not None and winner_p50 <= min(timed),
        "selection_message": target.get("selection", {}).get("message"),
        "candidates": cands,
    }
    emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
