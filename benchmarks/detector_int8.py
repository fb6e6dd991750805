"""A real detector's int8 on this CPU, through the real pipeline; prints JSON.

NudeNet's YOLOv8n (nudenet 3.4.2's `320n.onnx`, real weights) on photos of people (scikit-image's
astronaut and cameraman, whole and cropped: tests/support/pretrained_files.py). Its one output
concatenates box coordinates in pixels with class probabilities, which one int8 scale cannot hold.

One `kompile run` of explicit candidates, each validated by the gate and the validated ones timed by
the pipeline's own interleaved benchmark against the source run eagerly (ONNX Runtime on the ONNX
file): ONNX Runtime fp32, its static int8 plain, with the output's float tail alone
(`keepFloat: tail`) and with the sensitive layers too (`keepFloat: sensitive`), OpenVINO fp32 and
NNCF int8. Each artifact's detections are decoded (score > 0.25, NMS 0.45) and matched to the
source's (same class, IoU > 0.5). Then a `precision: auto` target on every backend: what kompile
selects by itself, the climb and its wall time.

OpenVINO's int8 with NNCF accuracy control (`accuracyControl: "true"`) tunes on the gate's own
verdict (kompile.compile_jobs.validate.headroom), the detections included under task detection.

`--emulate-no-bf16` runs OpenVINO as on an AVX-512 VNNI CPU without bf16 or AMX (oneDNN's
ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI, which OpenVINO's CPU plugin obeys, and kompile told the CPU
lacks bf16): the ladder and the float layers' precision follow. ONNX Runtime's kernels (MLAS) do not
read that variable: its figures stay this CPU's own. Only on a CPU with AVX-512 BF16 or AMX.

`--task detection` (the default) validates with `spec.validation.task: detection`: the gate itself
decodes and matches the detections (kompile.compile_jobs.detections), each candidate's agreement is
printed and auto climbs on it; `--task auto` judges the raw output alone, as before.

    python benchmarks/detector_int8.py --iterations 30 --out /tmp/detector.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from cpu_artifacts import emit_json, machine  # noqa: E402

from kompile.api.resource import parse_manifest  # noqa: E402
from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline  # noqa: E402
from tests.support.detections import Array, matched, nudenet_manifest, outputs  # noqa: E402
from tests.support.pretrained_files import nudenet_detector, people_photos  # noqa: E402

STATIC = {"backend": "onnxruntime", "precision": "int8", "quantization": "static"}
CANDIDATES: list[dict[str, Any]] = [
    {"backend": "onnxruntime", "precision": "fp32"},
    STATIC,
    {**STATIC, "name": "onnxruntime-int8-keep-tail", "options": {"keepFloat": "tail"}},
    {**STATIC, "name": "onnxruntime-int8-keep-sensitive", "options": {"keepFloat": "sensitive"}},
    {"backend": "openvino", "precision": "fp32"},
    {"backend": "openvino", "precision": "int8"},
    {
        "backend": "openvino",
        "precision": "int8",
        "name": "openvino-int8-accuracy-control",
        "options": {"accuracyControl": "true"},
    },
]
# oneDNN's ISA cap for --emulate-no-bf16: AVX-512 with VNNI, without bf16 or AMX.
NO_BF16_ISA = "AVX512_CORE_VNNI"


def emulate_no_bf16() -> str:
    """Cap OpenVINO's oneDNN below bf16 and AMX, and tell kompile's CPU view the same; what is
    emulated, for the report."""
    import os

    from kompile.compile_jobs import hardware

    model, flags = hardware._cpuinfo()
    if not set(hardware.BF16_FLAGS) & flags or "avx512_vnni" not in flags:
        raise SystemExit("--emulate-no-bf16 needs a CPU with AVX-512 VNNI and bf16 (or AMX) to cap")
    os.environ["ONEDNN_MAX_CPU_ISA"] = NO_BF16_ISA  # read when OpenVINO's CPU plugin first loads
    capped = {f for f in flags if not f.startswith("amx") and f not in ("avx512_bf16", "avx512_fp16")}
    hardware._cpuinfo = lambda: (model, capped)  # type: ignore[assignment]
    hardware.local_cpu_class.cache_clear()
    return f"OpenVINO capped at ONEDNN_MAX_CPU_ISA={NO_BF16_ISA}; kompile told: no bf16, no AMX"


def run(doc: dict[str, Any], work: Path) -> tuple[Any, float]:
    """One pipeline run, unregistered; its target's status and its wall time."""
    opts = PipelineOptions(
        base_dir=work, work_dir=work / "kompile", artifact_root=work / "kompile" / "artifacts"
    )
    start = time.perf_counter()
    result = run_pipeline(parse_manifest(doc), opts, LogReporter(lambda m: print(m, file=sys.stderr)))
    (target,) = result.status.targets
    return target, time.perf_counter() - start


def artifact_file(root: Path, name: str, digest: str) -> Path:
    (model,) = [
        p
        for p in (root / name).glob(f"*-{digest.removeprefix('sha256:')[:12]}/{name}/1/model.*")
        if p.suffix != ".bin"
    ]
    return model


def candidate_figures(c: Any, source: Array, model: Path | None, photos: Array) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": c.name,
        "phase": c.phase,
        "reason": c.reason,
        "gate": (c.message or "").split(" (values")[0] if c.phase != "Succeeded" else "passed",
        "min_cosine": None if c.min_cosine is None else round(c.min_cosine, 5),
        "compile_s": c.compile_seconds,
        "float_nodes": (c.options or {}).get("floatNodes"),
        "detection_agreement": c.detection_agreement,
    }
    if c.latency:
        (lat,) = c.latency
        out.update(p50_ms=round(lat.p50_ms, 3), spread=lat.spread, speedup_over_eager=c.speedup)
    if model is not None:
        total, kept, extra = matched(source, outputs(model, photos, c.options))
        out.update(detections_kept=f"{kept} of {total}", extra_detections=extra)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--iterations", type=int, default=30, help="timed rounds of the pipeline's benchmark")
    p.add_argument("--skip-auto", action="store_true", help="leave out the precision-auto run")
    p.add_argument(
        "--task", choices=["detection", "auto"], default="detection", help="spec.validation.task of both runs"
    )
    p.add_argument(
        "--emulate-no-bf16", action="store_true", help="OpenVINO as on AVX-512 VNNI without bf16 or AMX"
    )
    p.add_argument(
        "--reduce-range",
        choices=["auto", "true", "false"],
        default="auto",
        help="ONNX Runtime's static int8 weight width for its listed candidates (true: 7 bits)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    emulated = emulate_no_bf16() if args.emulate_no_bf16 else None
    candidates = [
        {**c, "options": {**c.get("options", {}), "reduceRange": args.reduce_range}}
        if c.get("quantization") == "static"
        else c
        for c in CANDIDATES
    ]
    photos = people_photos()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = work / "people.npz"
        np.savez(dataset, images=photos)
        source = outputs(nudenet_detector(), photos)
        listed = {"name": "cpu", "candidates": candidates}
        doc = nudenet_manifest("nudenet", dataset, listed, args.iterations, warmup=3, task=args.task)
        target, wall = run(doc, work)
        root = work / "kompile" / "artifacts"
        report: dict[str, Any] = {
            "model": "nudenet 3.4.2 320n.onnx (YOLOv8n), 6 photos of people at 320x320",
            "machine": machine(2),
            "eager_p50_ms": round(target.eager_latency[0].p50_ms, 3) if target.eager_latency else None,
            "iterations": args.iterations,
            "task": args.task,
            "emulated": emulated,
            "onnxruntime_reduce_range": args.reduce_range,
            "listed_wall_s": round(wall, 1),
            "selected": target.selection.winner if target.selection else None,
            "candidates": [
                candidate_figures(
                    c,
                    source,
                    artifact_file(root, "nudenet", c.artifact_digest) if c.artifact_digest else None,
                    photos,
                )
                for c in target.candidates
            ],
        }
        if not args.skip_auto:
            auto, wall = run(
                nudenet_manifest(
                    "nudenet-auto", dataset, {"name": "cpu", "precision": "auto"}, 6, task=args.task
                ),
                work,
            )
            report["precision_auto"] = {
                "wall_s": round(wall, 1),
                "selected": auto.selection.winner if auto.selection else None,
                "climb": [
                    {
                        "name": c.name,
                        "phase": c.phase,
                        "reason": c.reason,
                        "compile_s": c.compile_seconds,
                        "detection_agreement": c.detection_agreement,
                        "p50_ms": round(c.latency[0].p50_ms, 3) if c.latency else None,
                    }
                    for c in auto.candidates
                ],
                "not_offered": auto.not_offered,
            }
    emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
