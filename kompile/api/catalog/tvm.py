"""Catalog entry: Apache TVM (Relax) shared libraries for CPUs, MetaSchedule-tuned with a tuning
database shared per hardware class (compile_jobs/backends/tvm.py), built and run in the backend's
own environment (requirements/env-tvm.txt: apache-tvm 0.27 with its pinned FFI, no torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count


class TvmOptions(BackendOptions):
    """TVM options."""

    tuning_trials: Count = Field(
        default=2000,
        description="MetaSchedule trial budget (measured candidates, over the tasks the class's shared "
        "tuning database lacks); 0: no tuning (the database's schedules still apply, the rest runs "
        "TVM's default lowering: slow on CPUs, DLight's generic schedules on GPUs). A GPU class tunes "
        "only where it compiles on a node with its GPU.",
    )
    tuning_minutes: Count = Field(
        default=30,
        description="Time budget of the tuning in minutes, checked before each task's batch of "
        "candidates (seconds to a minute on 2 cores). In a cluster a target's tvm candidates' budgets "
        "together must fit in 75% of the compile Job's deadline (jobs.deadlineSeconds, an hour by "
        "default), else the target fails with TuningOverDeadline before any Job.",
    )
    tuning_scope: Literal["missing", "all"] = Field(
        default="missing",
        description="missing: tune only the tasks the class's shared database lacks (each operator shape "
        "is tuned once in the fleet); all: spend the budget on every task of the model, the ones that "
        "cost most in it first, each search starting from the database's best, so that a later "
        "compile improves the class's schedules (a first 30-minute tuning of ResNet-50 on 2 cores gives "
        "its convolutions 64-128 trials each).",
    )
    tuning_verify: Count = Field(
        default=8,
        description="Best schedules per kernel that the class's tuning database holds, re-measured on the "
        "compiling node (interleaved rounds, its weights flushed from the caches before each call as a "
        "model streams them) before the build, the fastest applied: a record is one "
        "measurement, on whichever node of the class took it (on 2-core AVX2 EPYC VMs a kernel's two "
        "best records, 1.25 ms each, ran at 1.81 and 1.36 ms on another such node a day later). Paid "
        "from tuningMinutes when the compile tunes (ResNet-50 with 8: 167 s on 2 cores); 0 or 1: the "
        "database's best as recorded. CPU classes only.",
    )
    tuning_in_model: Count = Field(
        default=0,
        description="Of those re-measured, the fastest few per kernel then compared in the model: the "
        "model built once per rank (every kernel's first, every kernel's second...), the builds run "
        "interleaved on the compiling node with each kernel call timed, and each kernel keeps the "
        "record whose calls took least time there (a kernel alone is not the kernel in the model: its "
        "input was just written, its weights were read a whole call ago). Costs one whole-model "
        "build per rank (ResNet-50 with 2: 15 s on 2 cores). Off by default: on a 2-core AVX-512 EPYC "
        "it changed 14 of ResNet-50's 28 kernels and the model ran no faster (38.48 against 38.41 ms "
        "without it). 0 or 1: the fastest alone. Needs tuningVerify 2 or more; CPU classes only.",
    )
    tuning_templates: Literal["register-blocked", "none"] = Field(
        default="register-blocked",
        description="register-blocked: before the search, each blocked convolution the compile tunes is "
        "also offered up to 8 hand-written schedules (a few output pixels x channel vectors whose whole "
        "reduction stays in registers, as ONNX Runtime's MLAS kernels work; a row the tile does not "
        "divide ends in a narrower tile of its own), measured and recorded like "
        "the search's candidates (not counted in tuningTrials; paid from tuningMinutes); the fastest "
        "record wins as always. On a 2-core AVX2 EPYC one took ResNet-50's layer-2 1x1 widening "
        "convolution from 0.65 to 0.56 ms after two 30-minute tunings. none: the search's candidates "
        "only. CPU classes with the blocked layout only.",
    )
    weight_layout: Literal["prepacked", "as-is"] = Field(
        default="prepacked",
        description="prepacked: each tuned kernel reads the weights in the blocked layout its schedule "
        "chose (rewritten once at build); as-is: the ONNX layout. The database's records differ "
        "between the two: switching re-tunes.",
    )
    activation_layout: Literal["blocked", "nchw"] = Field(
        default="blocked",
        description="blocked: 2-D convolutions (groups 1, channels a multiple of the ISA's fp32 lanes: "
        "16 with AVX-512, 8 with AVX2, 4 on Arm; or a stem's few input channels) and the ops between "
        "them run in NCHW{lanes}c, the channel block innermost (ResNet-50's tuned 1x1 convolutions "
        "1.1-1.5x faster than in NCHW); "
        "nchw: the ONNX layout. The database's records differ between the two: switching re-tunes.",
    )
    winograd: Literal["off", "on", "auto"] = Field(
        default="auto",
        description="Blocked 3x3 stride-1 convolutions (channels a multiple of the lanes) as Winograd "
        "F(4x4, 3x3): an input transform, one batched matmul per transform point on weights "
        "transformed at build (4x the direct weights), an output transform; a quarter of the "
        "multiplications. auto: both forms are tuned, the model is built both ways and timed on the "
        "compiling node, and each convolution shape keeps the form that took less time in the model "
        "(`winogradMeasured` in the artifact): on a 2-core AVX-512 EPYC after 30 minutes ResNet-50's "
        "64, 128 and 256-channel 3x3s ran as Winograd, its 512-channel ones direct, and the model took "
        "0.89-0.96x ONNX Runtime fp32's time (1.03x all direct). Untuned (no schedule yet for a kernel) the "
        "convolutions stay direct. on: every such convolution as Winograd; off: none. The database's "
        "records differ between the forms: each is tuned once per class.",
    )
    fast_math: Literal["on", "off"] = Field(
        default="on",
        description="on: exp, erf, tanh and softmax as TVM's polynomial approximations (fast_exp, "
        "fast_erf, fast_tanh, fast_softmax; within 6 float32 ulps of the exact ones), which vectorize "
        "where the C library's scalar expf and erff keep a loop from it, as ONNX Runtime's MLAS has "
        "its own; validation still gates the artifact. off: the exact functions. CPU classes only.",
    )
    intra_op_threads: Count = Field(
        default=0,
        description="Threads of the TVM runtime at validation and timing, and the target's num-cores "
        "that tuning measures with; 0: the run's, else all cores.",
    )

    def search_minutes(self) -> float:
        return float(self.tuning_minutes) if self.tuning_trials > 0 else 0.0


ENTRY = BackendEntry(
    name="tvm",
    summary="Apache TVM 0.27 (Relax from the ONNX export): a shared library for the class's CPU ISA "
    "(llvm -mcpu from its features), MetaSchedule-tuned within a trial and time budget; the tuning "
    "database is shared per (hardware class, TVM version, target) through the artifact store (locally "
    "~/.cache/kompile/tuning-databases), so each operator shape is tuned once in the fleet. On NVIDIA "
    "GPU classes (compute capability 7.5 and newer): CUDA kernels for the GPU's sm_XY, tuned the same way "
    "into the GPU class's own database where the compile runs on the class's node (each candidate "
    "measured on the GPU), TVM's default (DLight) schedules for the rest, checked by NVRTC at compile and "
    "compiled by it at load. fp32 only, "
    "at the static (opt) shape. Runs in its own environment (scripts/setup-backend-env.sh tvm). Not "
    "rolled out: Triton has no TVM backend.",
    devices=("cpu", "cuda"),
    precisions=frozenset({"fp32"}),
    consumes="onnx",
    options=TvmOptions,
    extra="torch",
    version_from=("apache-tvm", "apache-tvm-ffi", "onnx"),
    # No server: Triton has no TVM backend, and a Python-backend model in the Triton layout would
    # need a TVM runtime image kompile does not build; the artifact stays in the store.
    serving=None,
    environment="tvm",
    # Not in auto: a class's first compile pays a 30-minute tuning (on 2 cores its ResNet-50 then
    # took 0.89-0.96x ONNX Runtime fp32's time on an AVX-512 EPYC with the Winograd convolutions picked
    # in the model, 2026-11-28; 1.07x all direct on an AVX2 one; BERT-base 0.89-0.95x with fast
    # math), and no server runs the artifact (docs/backends.md, tvm).
)
