"""TVM's MetaSchedule tuning on an NVIDIA GPU: each model compiled for the GPU class untuned (TVM's
DLight defaults) and tuned into one shared tuning database, a second model tuned against what the
first left there, every library validated against eager fp32 and timed beside eager PyTorch and
torch.compile on the same GPU; prints JSON.

Two steps, so that the programs can be exported where kompile's main environment is and tuned where
the GPU is (MetaSchedule measures every candidate on the GPU):

    # where kompile's environments are (no GPU needed): each model's fp32 ONNX export, fixed at its
    # static shape and folded as the tvm backend folds it, with its feed and eager reference
    python benchmarks/tvm_gpu_tuning.py export --out /tmp/tvm-gpu --models resnet50,resnet18 --levels 16

    # on the GPU node, with the tvm environment's packages (--site: its site folder; --python: its
    # Python): each compile is the environment's own compile step in its own process (`python -m
    # kompile.compile_jobs.env_runner tvm`, the contract a compile Job uses) with the GPU class's
    # options and the database folder as its state, as the tvm backend sends them
    python benchmarks/tvm_gpu_tuning.py tune --dir /tmp/tvm-gpu --site /opt/tvm-site --minutes 3,1 \
        --out benchmarks/results/tvm-gpu-tuning-<date>-<gpu>.json

Per model: `untuned` (tuningTrials 0, no database), `tuned` (the shared database, the model's
--minutes budget); the first model is also rebuilt from the database alone (`from-database`,
tuningTrials 0: what a class's next compile of the same model takes). `--database DIR` starts from a
database tuned before (with --trials 0: build from it and time, nothing tuned). The report is
rewritten after every step, so a run cut short keeps what it measured.

A bare GPU node (NVIDIA's CUDA 13 runtime and NVRTC, torch, numpy) needs the tvm environment's
packages with TVM's compiler library (MetaSchedule builds there), xgboost-cpu and
nvidia-cuda-cccl as --site, and pydantic for kompile's validation gate, checked before any compile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import compiler_stacks_gpu as stacks  # noqa: E402

from kompile.compile_jobs.envs import write_arrays  # noqa: E402
from kompile.compile_jobs.hardware import cpu_description  # noqa: E402


def export(out: Path, models: list[str]) -> dict[str, Any]:
    """Each model's program as the tvm backend hands it to its environment (kompile's fp32 ONNX
    export, inputs fixed at the static shape, ONNX Runtime's basic folding)."""
    import shutil

    import torch

    from kompile.compile_jobs.backends.tvm import folded_program
    from kompile.compile_jobs.export import export_onnx
    from kompile.compile_jobs.sources import LoadedSource

    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for model in models:
        module, signature, feed = stacks.model_case(model)
        assert signature is not None
        with torch.no_grad():
            reference = module(torch.from_numpy(feed[0])).numpy()
        write_arrays(str(out / f"{model}-feed.npz"), feed)
        write_arrays(str(out / f"{model}-reference.npz"), [reference])
        scratch = out / "scratch"
        source = LoadedSource(uri=model, format="torch", digest="", module=module)
        onnx_path, _ = export_onnx(source, signature, {"input": feed[0]}, scratch / f"{model}.onnx")
        folded = folded_program(onnx_path, [tuple(feed[0].shape)], scratch, threads=2)
        shutil.move(str(folded), out / f"{model}.onnx")
        shutil.rmtree(scratch)
        entries.append({"model": model, "program": f"{model}.onnx"})
        print(f"exported {model}", file=sys.stderr)
    manifest = {"random_weight_levels": stacks.LEVELS[0] if stacks.LEVELS else None, "models": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


def compile_step(
    folder: Path,
    model: str,
    label: str,
    options: dict[str, str],
    state: Path | None,
    where: tuple[str, str | None],
) -> dict[str, Any]:
    """One compile by the tvm environment's own step, in its own process; what it recorded."""
    out = folder / f"{model}-{label}.so"
    request: dict[str, Any] = {
        "op": "compile",
        "program": str(folder / f"{model}.onnx"),
        "example": str(folder / f"{model}-feed.npz"),
        "calibration": [],
        "precision": "fp32",
        "quantization": "",
        "out": str(out),
        "options": options,
    }
    if state is not None:
        request["state"] = str(state)
    started = time.perf_counter()
    with (folder / f"{model}-{label}.log").open("w", encoding="utf-8") as log:
        env = stacks.Environment("tvm", *where, log)
        try:
            reply = env.ask(request)
        finally:
            env.close()
    entry: dict[str, Any] = {"model": model, "backend": "tvm", "label": f"tvm-{label}"}
    entry["compile_seconds"] = round(time.perf_counter() - started, 1)
    if not reply.get("ok"):
        return entry | {"error": reply.get("error")}
    return entry | {"file": out.name, "bytes": out.stat().st_size, "options": {**reply["record"], **options}}


def gpu_capability() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run the tune step on the GPU node")
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def tune(
    folder: Path,
    where: tuple[str, str | None],
    minutes: list[float],
    trials: int,
    report_to: Path | None,
    models: list[str] | None = None,
) -> dict[str, Any]:
    stacks.require_gate()
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    models = models or [m["model"] for m in manifest["models"]]
    gpu = {"device": "cuda", "computeCapability": gpu_capability(), "tvmDevice": "cuda"}
    database = folder / "database"
    report: dict[str, Any] = {
        "gpu": stacks.gpu_name(),
        "host_cpu": cpu_description(),
        "timed": "call to outputs on the host, inputs already on the device, batch 1",
        "peers": "torch eager and torch.compile (default mode) in full fp32 (TF32 off)",
        "random_weight_levels": manifest.get("random_weight_levels"),
        "versions": stacks.versions(*where, stacks.PACKAGES["tvm"] + ["xgboost-cpu"]),
        "compiles": [],
        "results": [],
    }

    def save() -> None:
        if report_to:
            report_to.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    steps: list[tuple[str, str, dict[str, str], Path | None]] = []
    for i, model in enumerate(models):
        budget = {"tuningTrials": str(trials), "tuningMinutes": str(minutes[min(i, len(minutes) - 1)])}
        steps.append((model, "untuned", {**gpu, "tuningTrials": "0"}, None))
        steps.append((model, "tuned", {**gpu, **budget}, database))
        if i == 0 and trials > 0:
            # Trials 0: the database's schedules alone, no task tuned (a class's next compile).
            steps.append((model, "from-database", {**gpu, **budget, "tuningTrials": "0"}, database))
    built = []
    for model, label, options, state in steps:
        entry = compile_step(folder, model, label, options, state, where)
        shown = {k: v for k, v in entry.get("options", {}).items() if k.startswith(("tuning", "pipeline"))}
        print(
            json.dumps({k: entry[k] for k in ("label", "compile_seconds")} | shown),
            file=sys.stderr,
            flush=True,
        )
        report["compiles"].append({k: v for k, v in entry.items() if k != "file"})
        save()
        if "error" not in entry:
            built.append(entry)
    with (folder / "measure.log").open("w", encoding="utf-8") as log:
        for entry in built:
            row = stacks.measure_artifact(entry, folder, where, 200, 20, log)
            row["built_in_seconds"] = entry["compile_seconds"]
            print(json.dumps(row), file=sys.stderr, flush=True)
            report["results"].append(row)
            save()
    for model in models:
        report["results"].extend(stacks.run_peers(model, 200, 20, sys.stderr))
    stacks.add_speedups(report["results"])
    save()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    e = steps.add_parser("export", help="export each model's program (no GPU needed)")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--models", default="resnet50,resnet18")
    e.add_argument(
        "--levels", type=int, default=0, help="snap random weights to N values (compiler_stacks_gpu)"
    )
    t = steps.add_parser("tune", help="compile untuned and tuned on this machine's GPU, validate and time")
    t.add_argument("--dir", type=Path, required=True)
    t.add_argument("--site", help="the tvm environment's packages, first on its process's PYTHONPATH")
    t.add_argument("--python", default=sys.executable, help="the tvm environment's Python")
    t.add_argument(
        "--minutes", default="3,1", help="each model's tuning budget in minutes (the last repeats)"
    )
    t.add_argument("--trials", type=int, default=2000)
    t.add_argument("--models", help="a subset of the exported models, in this order")
    t.add_argument("--database", type=Path, help="a tuning database folder to start from (copied)")
    t.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.step == "export":
        stacks.LEVELS[:] = [args.levels] if args.levels else []
        print(json.dumps(export(args.out, args.models.split(",")), indent=2))
        return
    try:
        minutes = [float(m) for m in args.minutes.split(",")]
    except ValueError:
        raise SystemExit(f"--minutes {args.minutes!r}: give minutes per model, e.g. 3,1") from None
    if not (args.dir / "manifest.json").is_file():
        raise SystemExit(f"no manifest.json in {args.dir}: run the export step first")
    if args.database:
        import shutil

        shutil.copytree(args.database, args.dir / "database", dirs_exist_ok=True)
    models = args.models.split(",") if args.models else None
    report = tune(args.dir, (args.python, args.site), minutes, args.trials, args.out, models)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
