"""The compiler stacks the field names (Apache TVM, IREE, XLA) beside eager and ONNX Runtime on this
machine's CPU; prints JSON.

For each model at batch 1: TVM untuned and MetaSchedule-tuned (the trial and time budget given;
the tuning database is shared by the models of the run and by earlier runs on this machine, as a
hardware class shares it; --tvm-models, default resnet50), IREE with its default and its chosen
llvm-cpu flags, and XLA (torchax to StableHLO, jax.export), each built by kompile's backend in its
own environment and timed in that process; ONNX Runtime fp32, OpenVINO fp32 and eager PyTorch in
the same interleaved rounds (cpu_artifacts' machinery). Every artifact is validated against eager
(cosine and errors) and its compile seconds recorded. The CPU's instruction sets are printed beside
the figures.

    python benchmarks/compiler_stacks.py --models resnet50,bert_base --threads 2 \
        --tvm-trials 2000 --tvm-minutes 30 --out benchmarks/results/compiler-stacks-<date>-<cpu>.json

`--tvm-verify 8,0` builds tuned TVM twice: with each kernel's 8 best records re-measured on this
machine before the build (the default) and with the database's best as recorded. `--tvm-in-model 0,2`
builds the re-measured ones twice: with the fastest alone (the default) and with each kernel's 2
fastest alone then compared in the model.
`--tvm-winograd auto,off` builds tuned TVM with the Winograd convolutions picked by their time in the
model and again with every convolution direct, from the same database.
`--tvm-untuned no` leaves untuned TVM out (on BERT-base it takes minutes a call, and its timing
rounds would take most of the run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT)]

from cpu_artifacts import CaseRun, ModelCase, add_run_artifacts, best_validated, main, measure_case  # noqa: E402
from edge_artifacts import ORT, BuiltSpec, add_built  # noqa: E402

from kompile.api.catalog.tvm import TvmOptions  # noqa: E402
from kompile.compile_jobs import tvm_database  # noqa: E402

ORT_FP32 = [a for a in ORT if a[0] == "ort-fp32"]
BUDGET: dict[str, str] = {}
"""The TVM tuning budget of this run (--tvm-trials, --tvm-minutes), as target options."""
LAYOUT_NAMES = {"prepacked": "tvm-tuned", "as-is": "tvm-tuned-as-is"}
"""Each weightLayout the benchmark tunes, and its runtime's name in the report."""
TVM_LAYOUTS: list[str] = []
"""The weight layouts TVM is tuned and timed with (--tvm-layouts, default prepacked,as-is): each
layout's kernels are their own workloads, so each tunes within the whole budget on a new database."""
TVM_UNTUNED: list[bool] = [True]
"""Whether untuned TVM is built and timed (--tvm-untuned yes|no): on BERT-base it takes minutes a
call, so its timing rounds would take most of the run."""
TVM_VERIFY: list[str] = []
"""The tuningVerify values TVM is built with (--tvm-verify, default 8): each its own runtime, named
`tvm-tuned-verify<N>` but for the default, so a run can time the database's best as recorded (0)
beside the best re-measured on this machine."""
TVM_IN_MODEL: list[str] = []
"""The tuningInModel values the re-measured builds are made with (--tvm-in-model, default 0): each its
own runtime, `-inmodel<N>` appended to the name but for the default."""
TVM_WINOGRAD: list[str] = []
"""The winograd values tuned TVM is built with (--tvm-winograd, default auto): each its own runtime,
`-winograd-<value>` appended to the name but for the first, which tunes first (`auto,off`: auto tunes
the direct and the Winograd kernels, then off builds the direct ones from the same database)."""
TVM_MODELS: set[str] = set()
"""The models TVM builds (--tvm-models): untuned TVM runs a call in seconds, so each left out saves
minutes of timing rounds."""


STACKS: list[str] = []
"""The other stacks built and timed beside TVM (--stacks, default all of `stacks()`): leaving IREE and
XLA out saves their builds and timing rounds in a run about TVM."""


def stacks() -> list[BuiltSpec]:
    return [spec for spec in all_stacks() if not STACKS or spec[0] in STACKS]


def all_stacks() -> list[BuiltSpec]:
    return [
        ("iree-default", "iree", "fp32", None, {"flags": "default"}),
        ("iree-tuned", "iree", "fp32", None, {"flags": "tuned"}),
        ("xla", "xla", "fp32", None, {}),
        # OpenVINO fp32 (INFERENCE_PRECISION_HINT f32): the other fp32 CPU compiler a user would pick.
        ("openvino-fp32", "openvino", "fp32", None, {}),
    ]


def add_tvm(run: CaseRun) -> None:
    """TVM untuned (unless --tvm-untuned no) and tuned within the budget on the shared database,
    with each weight layout of --tvm-layouts."""
    if TVM_UNTUNED[0]:
        add_untuned_tvm(run)
    # Tuned with prepacked weights (the default) and with the weights in the ONNX layout: each
    # layout has its own records in the database, so each is tuned (or reused) on its own.
    tuned = [
        (
            _tvm_name(lay, v, m) + ("" if w == TVM_WINOGRAD[0] else f"-winograd-{w}"),
            "tvm",
            "fp32",
            None,
            {**BUDGET, "weightLayout": lay, "tuningVerify": v, "tuningInModel": m, "winograd": w},
        )
        for w in TVM_WINOGRAD
        for lay in TVM_LAYOUTS
        for v in TVM_VERIFY
        # Without re-measuring there is no ranking to compare in the model: one build.
        for m in (TVM_IN_MODEL if int(v) > 1 else TVM_IN_MODEL[:1])
    ]
    add_built(run, tuned)


def _tvm_name(layout: str, verify: str, in_model: str) -> str:
    name = LAYOUT_NAMES[layout] + ("" if verify == "8" else f"-verify{verify}")
    return name + ("" if in_model == "0" or int(verify) < 2 else f"-inmodel{in_model}")


def add_untuned_tvm(run: CaseRun) -> None:
    """Untuned TVM on an empty database (the shared one would lend it earlier runs' schedules)."""
    with tempfile.TemporaryDirectory(prefix="tvm-empty-db-") as empty:
        saved = os.environ.get(tvm_database.ROOT_ENV)
        os.environ[tvm_database.ROOT_ENV] = empty
        try:
            add_built(run, [("tvm-untuned", "tvm", "fp32", None, {"tuningTrials": "0"})])
        finally:
            if saved is None:
                os.environ.pop(tvm_database.ROOT_ENV)
            else:
                os.environ[tvm_database.ROOT_ENV] = saved


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    def runtimes(run: CaseRun) -> None:
        add_run_artifacts(run, ORT_FP32)
        if case.name in TVM_MODELS:
            add_tvm(run)
        add_built(run, stacks())

    report = measure_case(case, args, work, threads, runtimes, reference_batch=1)
    report["best"] = best_validated(report)
    report["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    return report


def _budget(argv: list[str]) -> list[str]:
    """Takes the --tvm-* options off argv (the shared parser does not know them)."""
    p = argparse.ArgumentParser(
        add_help=False, usage="compiler_stacks.py [TVM and stack options] [shared options]"
    )
    p.add_argument("--tvm-trials", default="64", help="tuningTrials: the trial budget")
    p.add_argument("--tvm-minutes", default="5", help="tuningMinutes: the time budget")
    p.add_argument("--tvm-models", default="resnet50", help="the models TVM builds, comma-separated")
    p.add_argument("--tvm-layouts", default="prepacked,as-is", help="weightLayout values, comma-separated")
    p.add_argument("--tvm-untuned", choices=["yes", "no"], default="yes", help="also build untuned TVM")
    p.add_argument("--tvm-winograd", default="auto", help="winograd values (off, on, auto), comma-separated")
    p.add_argument("--tvm-verify", default="8", help="tuningVerify values, comma-separated")
    p.add_argument("--tvm-in-model", default="0", help="tuningInModel values, comma-separated")
    names = [spec[0] for spec in all_stacks()]
    p.add_argument("--stacks", default=",".join(names), help="the other stacks timed beside TVM, or none")
    if {"-h", "--help"} & set(argv):
        # The shared parser prints its own options and exits; these come first so --help shows both.
        print(p.format_help())
    known, rest = p.parse_known_args(argv)
    STACKS.extend(["none"] if known.stacks == "none" else known.stacks.split(","))
    if unknown := set(STACKS) - {*names, "none"}:
        p.error(f"--stacks: {', '.join(sorted(unknown))}; choose from {', '.join(names)} or none")
    TVM_UNTUNED[0] = known.tvm_untuned == "yes"
    TVM_LAYOUTS.extend(known.tvm_layouts.split(","))
    if unknown := set(TVM_LAYOUTS) - set(LAYOUT_NAMES):
        p.error(f"--tvm-layouts: {', '.join(sorted(unknown))}; choose from {', '.join(LAYOUT_NAMES)}")
    BUDGET.update(tuningTrials=known.tvm_trials, tuningMinutes=known.tvm_minutes)
    TVM_WINOGRAD.extend(known.tvm_winograd.split(","))
    modes = TvmOptions.choices("winograd") or []
    if bad := [v for v in TVM_WINOGRAD if v not in modes]:
        p.error(f"--tvm-winograd: {', '.join(bad)}; choose from {', '.join(modes)}")
    TVM_MODELS.update(known.tvm_models.split(","))
    TVM_VERIFY.extend(known.tvm_verify.split(","))
    if bad := [v for v in TVM_VERIFY if not v.isdigit()]:
        p.error(f"--tvm-verify: {', '.join(bad)}; give counts, e.g. 8,0")
    TVM_IN_MODEL.extend(known.tvm_in_model.split(","))
    if bad := [v for v in TVM_IN_MODEL if not v.isdigit()]:
        p.error(f"--tvm-in-model: {', '.join(bad)}; give counts, e.g. 0,2")
    return rest


if __name__ == "__main__":
    defaults = ["--models", "resnet50,bert_base", "--batch-sizes", "1", "--no-torch-compile"]
    raise SystemExit(main(defaults + _budget(sys.argv[1:]), case_runner=run_case))
