"""The compiler stacks (IREE, Apache TVM, XLA) on an NVIDIA GPU, beside eager PyTorch and
torch.compile on the same GPU; prints JSON.

Two steps, so that the artifacts can be built where the environments are and run where the GPU is:

    # where kompile's environments are (no GPU needed): each model compiled by iree, tvm and xla for
    # device cuda, the node's GPU probe stood in by --capability where this machine has no GPU
    python benchmarks/compiler_stacks_gpu.py build --out /tmp/stacks --capability 9.0

    # on the GPU node: each artifact loaded by its environment's steps in its own process
    # (`python -m kompile.compile_jobs.env_runner NAME`, the contract a compile Job uses), validated
    # against the eager fp32 outputs saved at build with kompile's fp32 gate, and timed; the peers
    # timed in their own process on the same GPU
    python benchmarks/compiler_stacks_gpu.py measure --dir /tmp/stacks --site tvm=/opt/tvm-site \
        --out benchmarks/results/compiler-stacks-gpu-<date>-<gpu>.json

`--python NAME=PATH` runs backend NAME's process with that Python (its environment's, e.g.
~/.cache/kompile/env-tvm-<key>/bin/python; default: the running one); `--site NAME=PATH` puts PATH
first on that process's PYTHONPATH (its packages where they are not in that Python). A run is
timed from the call to its outputs on the host, with the inputs already on the device, as each
environment's `run` step times it; the peers likewise (input on the GPU, outputs copied to the
host).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from kompile.compile_jobs.env_protocol import RUNNER_MODULE, decode, encode  # noqa: E402
from kompile.compile_jobs.envs import read_arrays, write_arrays  # noqa: E402
from kompile.compile_jobs.hardware import cpu_description  # noqa: E402

BACKENDS = ("iree", "tvm", "xla")
MODELS = ("small-cnn", "mobilenet-v2", "resnet50")
Array = np.ndarray[Any, Any]


# --- the models -----------------------------------------------------------------------------------


def model_case(name: str, pretrained: bool = True) -> tuple[Any, list[Any] | None, list[Array]]:
    """The module (eval), its input signature (None for the peers: pydantic, which kompile's spec
    needs, is not on a bare GPU node) and one feed. mobilenet-v2 carries torchvision's
    ImageNet weights where their package is installed (build: the outputs validated against);
    the peers' timing does not depend on the weights' values."""
    import torch

    rng = np.random.default_rng(0)
    torch.manual_seed(0)  # the random-weight models the same in every build
    if name == "small-cnn":
        from models.small import small_cnn

        module, shape = small_cnn(), [8, 3, 32, 32]
    elif name == "mobilenet-v2":
        import torchvision

        if pretrained:
            from models.pretrained import mobilenet_v2_imagenet

            module = mobilenet_v2_imagenet()
        else:
            module = torchvision.models.mobilenet_v2(weights=None).eval()
        shape = [1, 3, 224, 224]
    elif name in ("resnet50", "resnet18"):
        import torchvision

        module, shape = getattr(torchvision.models, name)(weights=None).eval(), [1, 3, 224, 224]
        if LEVELS:
            snap_weights(module, LEVELS[0])
    else:
        raise SystemExit(f"unknown model {name!r}; use one of {', '.join(MODELS)} or resnet18")
    signature = None
    if pretrained:  # the build's; the peers need none
        from kompile.api.spec import InputSpec

        signature = [InputSpec.model_validate({"name": "input", "shape": shape})]
    feed = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        module(torch.from_numpy(feed))
    return module.eval(), signature, [feed]


LEVELS: list[int] = []
"""--levels N: random-weight models' weights snapped to N values per tensor (empty: as initialized)."""


def snap_weights(module: Any, levels: int) -> None:
    """Each parameter snapped to `levels` evenly spaced values of its own range: still fp32 and
    computed as such (the speed does not depend on the values), but the artifacts, whose weights are
    baked in, compress about 8x for carrying to a GPU node that takes a limited upload."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            lo, hi = float(p.min()), float(p.max())
            if hi > lo:
                step = (hi - lo) / (levels - 1)
                p.copy_(torch.round((p - lo) / step) * step + lo)


# --- build ----------------------------------------------------------------------------------------


def build(out: Path, models: list[str], capability: tuple[int, int] | None) -> dict[str, Any]:
    import importlib
    import shutil

    import torch

    from kompile.api.spec import Target
    from kompile.compile_jobs.backends.base import BackendError, get_backend
    from kompile.compile_jobs.build import compile_request
    from kompile.compile_jobs.export import export_onnx
    from kompile.compile_jobs.sources import LoadedSource

    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for model in models:
        module, signature, feed = model_case(model)
        assert signature is not None
        with torch.no_grad():
            reference = module(torch.from_numpy(feed[0])).numpy()
        write_arrays(str(out / f"{model}-feed.npz"), feed)
        write_arrays(str(out / f"{model}-reference.npz"), [reference])
        # The pipeline's own fp32 ONNX export, which iree and tvm compile (xla takes torch.export).
        source = LoadedSource(uri=model, format="torch", digest="", module=module)
        onnx_path, _ = export_onnx(source, signature, {"input": feed[0]}, out / "export" / f"{model}.onnx")
        for name in BACKENDS:
            if capability is not None:
                # Stand-in for the node's GPU probe: this build machine has no GPU; the compile
                # steps need none (the class's compute capability is all they read).
                backend_module = importlib.import_module(f"kompile.compile_jobs.backends.{name}")
                backend_module.local_cuda_capability = lambda: capability  # type: ignore[attr-defined]
            # tvm as TVM's DLight defaults: built on a GPU node it would otherwise tune (for up to
            # its 30-minute default; benchmarks/tvm_gpu_tuning.py measures the tuning).
            options = {"tuningTrials": "0"} if name == "tvm" else {}
            target = Target(name=f"gpu-{name}", backend=name, precision="fp32", options=options)
            started = time.perf_counter()
            entry: dict[str, Any] = {"model": model, "backend": name}
            with tempfile.TemporaryDirectory(prefix=f"{model}-{name}-") as tmp:
                request = compile_request(
                    target,
                    out_dir=Path(tmp),
                    signature=signature,
                    feeds=[{"input": feed[0]}],
                    module=module,
                    onnx_path=onnx_path,
                    device="cuda",
                )
                try:
                    artifact = get_backend(name).compile(request)
                except BackendError as err:
                    entry["error"] = str(err)
                else:
                    kept = out / f"{model}-{name}{artifact.model_path.suffix}"
                    shutil.copyfile(artifact.model_path, kept)
                    entry |= {"file": kept.name, "bytes": kept.stat().st_size, "options": artifact.options}
            entry["compile_seconds"] = round(time.perf_counter() - started, 1)
            print(f"built {model} with {name}: {entry.get('error') or entry['file']}", file=sys.stderr)
            entries.append(entry)
    shutil.rmtree(out / "export")
    manifest = {
        "built_on": platform.node(),
        "capability": capability,
        "random_weight_levels": LEVELS[0] if LEVELS else None,
        "artifacts": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


# --- measure --------------------------------------------------------------------------------------


class Environment:
    """One backend's environment process, spoken to as a compile Job's pipeline does."""

    def __init__(self, name: str, python: str, site: str | None, log: IO[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [python, "-m", RUNNER_MODULE, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(encode(request))
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the environment process exited ({self.proc.wait()}); see its log")
        return decode(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def spread(ns: list[int]) -> dict[str, float]:
    ms = sorted(n / 1e6 for n in ns)
    return {
        "p50_ms": round(statistics.median(ms), 4),
        "p10_ms": round(ms[len(ms) // 10], 4),
        "p90_ms": round(ms[(9 * len(ms)) // 10], 4),
        "runs": len(ms),
    }


def require_gate() -> None:
    """Stop before any compile or load where kompile's fp32 gate cannot run: it reads kompile's spec,
    which needs pydantic, and a bare GPU node has none (a tuning run there once lost its
    measurements to that at the end)."""
    try:
        import kompile.compile_jobs.validate  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f"kompile's validation gate cannot be imported here ({err}): install or carry pydantic "
            "(pydantic, pydantic-core, annotated-types, typing-inspection wheels) first"
        ) from err


def gate(reference: Array, got: Array) -> dict[str, Any]:
    """kompile's fp32 validation of one output against the eager reference."""
    from kompile.compile_jobs.validate import compare, resolve_thresholds

    result = compare([[reference]], [[got]], ["output"], resolve_thresholds("fp32"))
    check = result.outputs[0]
    return {
        "passed": result.passed,
        "cosine": check.cosine,
        "max_abs_error": check.max_abs_error,
        "failures": result.failures,
    }


def measure_artifact(
    entry: dict[str, Any],
    folder: Path,
    where: tuple[str, str | None],
    iterations: int,
    warmup: int,
    log: IO[str],
) -> dict[str, Any]:
    result: dict[str, Any] = {"model": entry["model"], "runtime": entry.get("label", entry["backend"])}
    env = Environment(entry["backend"], *where, log)
    try:
        started = time.perf_counter()
        device = {"iree": "halDevice", "tvm": "tvmDevice", "xla": "xlaDevice"}[entry["backend"]]
        model = str(folder / entry["file"])
        reply = env.ask({"op": "load", "model": model, "threads": 1, "device": entry["options"][device]})
        result["load_seconds"] = round(time.perf_counter() - started, 2)
        if not reply.get("ok"):
            return result | {"error": reply.get("error")}
        feeds, out = str(folder / f"{entry['model']}-feed.npz"), str(folder / "out.npz")
        reply = env.ask({"op": "run", "feeds": feeds, "out": out})
        if not reply.get("ok"):
            return result | {"error": reply.get("error")}
        reference = read_arrays(str(folder / f"{entry['model']}-reference.npz"))
        result["validation"] = gate(reference[0], read_arrays(out)[0])
        for _ in range(warmup):
            env.ask({"op": "run", "feeds": feeds, "out": ""})
        timed = [env.ask({"op": "run", "feeds": feeds, "out": ""}) for _ in range(iterations)]
        result |= spread([int(t["ns"]) for t in timed])
    except (RuntimeError, KeyError, OSError) as err:
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        env.close()
    return result


def peer_worker(model: str, iterations: int, warmup: int) -> None:
    """Eager PyTorch and torch.compile (default mode) of `model` on the GPU: JSON lines on stdout."""
    import torch

    # Full fp32, as the artifacts are gated: torch's default runs cuDNN convolutions in TF32.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    module, _, feed = model_case(model, pretrained=False)
    module = module.cuda()
    x = torch.from_numpy(feed[0]).cuda()
    runners: list[tuple[str, Callable[[Any], Any]]] = [("torch-eager", module)]
    runners.append(("torch-compile", torch.compile(module)))
    for name, fn in runners:
        started = time.perf_counter()
        with torch.no_grad():
            fn(x).cpu()
            first = time.perf_counter() - started
            for _ in range(warmup):
                fn(x).cpu()
            ns = []
            for _ in range(iterations):
                t0 = time.perf_counter_ns()
                fn(x).cpu()
                ns.append(time.perf_counter_ns() - t0)
        row = {"model": model, "runtime": name, "first_call_seconds": round(first, 2), **spread(ns)}
        print(json.dumps(row), flush=True)


def run_peers(model: str, iterations: int, warmup: int, log: IO[str]) -> list[dict[str, Any]]:
    """The peers' rows for `model`, timed in their own process (peer_worker)."""
    done = subprocess.run(
        [sys.executable, __file__, "peers", model, str(iterations), str(warmup)],
        capture_output=True,
        text=True,
    )
    log.write(done.stderr)
    got = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    return got or [{"model": model, "runtime": "torch", "error": done.stderr[-400:]}]


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Each timed row's speed-up over eager PyTorch on the same model."""
    for row in rows:
        eager = next((r for r in rows if r["model"] == row["model"] and r["runtime"] == "torch-eager"), None)
        if eager and "p50_ms" in row:
            row["speedup_vs_eager"] = round(eager["p50_ms"] / row["p50_ms"], 3)


def gpu_name() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions(python: str, site: str | None, names: list[str]) -> dict[str, str]:
    """The versions of `names` as a backend's process sees them (its site first)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return 'absent'\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, env=env)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-300:]}


PACKAGES = {
    "iree": ["iree-base-runtime"],
    "tvm": ["apache-tvm", "apache-tvm-ffi", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-cuda-cccl"],
    "xla": ["jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin"],
}


def measure(
    folder: Path, pythons: dict[str, str], sites: dict[str, str], iterations: int, warmup: int, peers: bool
) -> dict[str, Any]:
    def where(name: str) -> tuple[str, str | None]:
        return pythons.get(name, sys.executable), sites.get(name)

    require_gate()
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SystemExit(f"no readable manifest.json in {folder} ({err}); run the build step first") from err
    rows: list[dict[str, Any]] = []
    with (folder / "environments.log").open("w", encoding="utf-8") as log:
        for entry in manifest["artifacts"]:
            if "error" in entry:
                rows.append({"model": entry["model"], "runtime": entry["backend"], "error": entry["error"]})
                continue
            row = measure_artifact(entry, folder, where(entry["backend"]), iterations, warmup, log)
            row |= {"artifact_bytes": entry["bytes"], "built_in_seconds": entry["compile_seconds"]}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
        if peers:
            for model in sorted({e["model"] for e in manifest["artifacts"]}):
                rows.extend(run_peers(model, iterations, warmup, log))
    add_speedups(rows)
    return {
        "gpu": gpu_name(),
        "host_cpu": cpu_description(),
        "iterations": iterations,
        "warmup": warmup,
        "timed": "call to outputs on the host, inputs already on the device, batch as built",
        "peers": "torch eager and torch.compile (default mode) in full fp32 (TF32 off)",
        "built": {k: manifest.get(k) for k in ("built_on", "capability", "random_weight_levels")},
        "versions": {name: versions(*where(name), PACKAGES[name]) for name in BACKENDS},
        "results": rows,
    }


def capability(text: str) -> tuple[int, int]:
    """--capability MAJOR.MINOR (9.0 for an H100)."""
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        hint = "give the GPU's compute capability as MAJOR.MINOR, e.g. 9.0"
        raise SystemExit(f"--capability {text!r}: {hint}") from None
    return major, minor


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "peers":
        peer_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    b = steps.add_parser("build", help="compile each model with iree, tvm and xla for device cuda")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--models", default=",".join(MODELS))
    b.add_argument("--capability", help="the GPU's compute capability (e.g. 9.0) where this machine has none")
    b.add_argument("--levels", type=int, default=0, help="snap random weights to N values (see snap_weights)")
    m = steps.add_parser("measure", help="validate and time the built artifacts on this machine's GPU")
    m.add_argument("--dir", type=Path, required=True)
    m.add_argument("--site", action="append", default=[], help="NAME=PATH: backend NAME's packages")
    m.add_argument("--python", action="append", default=[], help="NAME=PATH: backend NAME's Python")
    m.add_argument("--iterations", type=int, default=200)
    m.add_argument("--warmup", type=int, default=20)
    m.add_argument("--no-peers", action="store_true")
    m.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.step == "build":
        cap = capability(args.capability) if args.capability else None
        LEVELS[:] = [args.levels] if args.levels else []
        report = build(args.out, args.models.split(","), cap)
    else:
        sites = dict(s.split("=", 1) for s in args.site)
        pythons = dict(s.split("=", 1) for s in args.python)
        report = measure(args.dir, pythons, sites, args.iterations, args.warmup, not args.no_peers)
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
