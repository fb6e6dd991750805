"""Peak memory of a large model's run, every artifact loaded vs memory-bounded; prints JSON.

Builds an MLP of `--width` x `--width` layers (8192 x 8 layers: 2.15 GB of fp32 weights, the size
where a 24 GB machine starts to matter), then runs `kompile run` on it in fleet mode (fp32: ONNX
Runtime, OpenVINO, AOTInductor) twice, each in a fresh process: as it comes, and with
KOMPILE_MEMORY_LIMIT set (kompile.compile_jobs.residency unloads each validated artifact that
would leave under 3x the weights free and times it in a round of its own). The process tree's
peak RSS (and its anonymous part: the page cache of mapped files is reclaimable) is sampled
every 0.2 s:

    python benchmarks/memory_bound.py --limit 8G --out /tmp/memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from cpu_artifacts import emit_json  # noqa: E402

from kompile.compile_jobs.hardware import cpu_description  # noqa: E402

MODEL = """
import torch


class Wide(torch.nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(depth)]
        self.layers = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.layers(x))


def wide():
    torch.manual_seed(0)
    model = Wide(WIDTH, DEPTH).eval()
    with torch.no_grad():  # small weights: activations stay finite through the depth
        for p in model.parameters():
            p.mul_(0.05)
    return model
"""


def manifest(width: int, iterations: int, backends: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "wide"},
        "spec": {
            "source": {"uri": "python://wide:wide"},
            "inputs": [
                {
                    "name": "x",
                    "shape": [-1, width],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}],
                }
            ],
            "fleet": {"enabled": True, "precisions": ["fp32"]},
            "benchmark": {"batchSizes": [1], "warmup": 2, "iterations": iterations},
        },
    }
    if backends:  # named candidates instead of the class's auto set
        candidates = [{"name": b, "backend": b, "precision": "fp32"} for b in backends]
        doc["spec"].pop("fleet")
        doc["spec"]["targets"] = [{"name": "cpu-fp32", "candidates": candidates}]
    return doc


def _tree_memory(proc: psutil.Process) -> tuple[int, int]:
    """(RSS, anonymous RSS) of the process and its children, in bytes."""
    rss = anon = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        anon += info.rss - getattr(info, "shared", 0)
    return rss, anon


def run(folder: Path, mode: str, limit: str | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    env.pop("KOMPILE_MEMORY_LIMIT", None)
    if limit:
        env["KOMPILE_MEMORY_LIMIT"] = limit
    cmd = [sys.executable, "-m", "kompile.cli", "run", "m.yaml", "--json", "--no-register"]
    cmd += ["--work-dir", str(folder / f".kompile-{mode}")]
    started = time.perf_counter()
    with (folder / f"{mode}.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        watched = psutil.Process(proc.pid)
        peak_rss = peak_anon = 0
        while proc.poll() is None:
            rss, anon = _tree_memory(watched)
            peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
            time.sleep(0.2)
        stdout = proc.stdout.read() if proc.stdout else ""
    wall = time.perf_counter() - started
    progress = (folder / f"{mode}.log").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"kompile run ({mode}) exited {proc.returncode}: {progress[-2000:]}")
    (target,) = json.loads(stdout)["targets"]
    return {
        "mode": mode,
        "memoryLimit": limit,
        "peakRssGB": round(peak_rss / 1e9, 2),
        "peakAnonGB": round(peak_anon / 1e9, 2),
        "wallSeconds": round(wall, 1),
        "unloaded": progress.count("unloaded until its benchmark round"),
        "winner": target["selection"]["winner"],
        "candidates": {
            c["name"]: {"p50Ms": c["latency"][0]["p50Ms"], "speedup": c.get("speedup")}
            for c in target["candidates"]
            if c.get("latency")
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--limit", default="8G", help="KOMPILE_MEMORY_LIMIT of the bounded run")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--backends", default="", help="comma-separated candidates (default: fleet auto)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kompile-memory-") as tmp:
        folder = Path(tmp)
        (folder / "wide.py").write_text(
            MODEL.replace("WIDTH", str(args.width)).replace("DEPTH", str(args.depth))
        )
        (folder / "m.yaml").write_text(
            yaml.safe_dump(manifest(args.width, args.iterations, [b for b in args.backends.split(",") if b]))
        )
        weights = 4 * (args.depth * (args.width * args.width + args.width) + 10 * args.width + 10)
        runs = [run(folder, "all-loaded", None), run(folder, "bounded", args.limit)]
    emit_json(
        {
            "benchmark": "memory_bound",
            "cpu": cpu_description(),
            "machineMemoryGB": round(psutil.virtual_memory().total / 1e9, 1),
            "model": f"MLP {args.depth} x Linear({args.width}, {args.width}), fp32",
            "weightsGB": round(weights / 1e9, 2),
            "runs": runs,
            "peakRatio": round(runs[1]["peakRssGB"] / runs[0]["peakRssGB"], 2),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
