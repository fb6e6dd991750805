"""The xla backend (torchax -> jax.export -> XLA CPU, in its own environment) beside eager, ONNX
Runtime fp32 and OpenVINO fp32 on this machine's CPU; prints JSON.

For each model at batch 1: the XLA module built by kompile's xla backend (exported at the static
batch-1 shape, timed in its environment's process), ONNX Runtime fp32 and OpenVINO fp32 built by
kompile's onnxruntime and openvino backends and eager PyTorch, each validated against eager, with
the artifact's bytes and compile seconds (the xla figure includes starting its environment and
torchax's lowering; XLA's own compile happens at load, reported as `load_s`), all timed in the
same interleaved rounds (cpu_artifacts' machinery). The CPU's instruction sets are printed beside the figures.

    python benchmarks/xla_stack.py --models resnet50,bert_base --threads 2 \\
        --out benchmarks/results/xla-stack-<date>-<cpu>.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT)]

from cpu_artifacts import CaseRun, ModelCase, add_run_artifacts, best_validated, main, measure_case  # noqa: E402
from edge_artifacts import ORT, add_built  # noqa: E402

ORT_FP32 = [a for a in ORT if a[0] == "ort-fp32"]


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    def runtimes(run: CaseRun) -> None:
        add_run_artifacts(run, ORT_FP32)
        # OpenVINO fp32 (INFERENCE_PRECISION_HINT f32), the other fp32 CPU backend auto offers.
        add_built(
            run, [("xla-fp32", "xla", "fp32", None, {}), ("openvino-fp32", "openvino", "fp32", None, {})]
        )

    report = measure_case(case, args, work, threads, runtimes, reference_batch=1)
    report["best"] = best_validated(report)
    report["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    return report


if __name__ == "__main__":
    defaults = ["--models", "resnet50,bert_base", "--batch-sizes", "1", "--no-torch-compile"]
    raise SystemExit(main(defaults + sys.argv[1:], case_runner=run_case))
