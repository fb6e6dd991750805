"""The TVM target of a hardware class, from its CPU features (never this machine's model name) or, on
a GPU class, its CUDA compute capability: used by the `tvm` environment's steps to build and by the
pipeline to key the shared tuning database. Standard library only (it runs on both sides)."""

from __future__ import annotations

from typing import Any


def mcpu_for(arch: str, features: set[str]) -> str:
    """The LLVM CPU whose ISA the class's features name (never this machine's model): the widest
    vector extension decides TVM's vector width and instruction choice."""
    if arch == "arm64":
        return "neoverse-n1" if "asimddp" in features else "cortex-a72"
    if {"avx512_bf16", "avx512_vnni", "avx512f"} <= features:
        return "cooperlake"
    if {"avx512_vnni", "avx512f"} <= features:
        return "cascadelake"
    if "avx512f" in features:
        return "skylake-avx512"
    if "avx2" in features:
        return "haswell"
    return "x86-64"


def class_features(options: dict[str, str]) -> set[str]:
    """The class's CPU feature flags from the step's options (`cpuFeatures`, comma-separated)."""
    return set(filter(None, options.get("cpuFeatures", "").split(",")))


def vector_lanes(options: dict[str, str]) -> int:
    """fp32 lanes of the class's widest vector registers: the channel block of the blocked
    activation layout (NCHW{lanes}c), so that a convolution's innermost loop fills a register."""
    features = class_features(options)
    if options.get("arch", "amd64") == "arm64":
        return 4
    return 16 if "avx512f" in features else 8 if "avx2" in features else 4


OLDEST_CUDA = (7, 5)
"""CUDA 13 (the environment's NVRTC) builds for compute capability 7.5 (Turing) and newer: it dropped
sm_50 to sm_72."""


def cuda_arch(capability: str) -> str:
    """`sm_XY` of a compute capability 'X.Y'; ValueError below what CUDA 13 builds for."""
    major, _, minor = capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"the compute capability {capability!r} is not of the form X.Y")
    if (int(major), int(minor)) < OLDEST_CUDA:
        raise ValueError(
            f"TVM's CUDA 13 toolchain builds for compute capability {OLDEST_CUDA[0]}.{OLDEST_CUDA[1]} "
            f"and newer, not {capability}: build this target for cpu or with another backend"
        )
    return f"sm_{major}{minor}"


def target_for(options: dict[str, str]) -> dict[str, Any]:
    """The TVM target (JSON form: TVM 0.27 no longer parses `llvm -mcpu=...` strings): `cuda` with
    the GPU's `sm_XY` where the options name the device cuda (the host code is generic x86-64 or
    Arm), else `llvm` for the class's CPU."""
    if options.get("device") == "cuda":
        return {"kind": "cuda", "arch": cuda_arch(options.get("computeCapability", ""))}
    arch = options.get("arch", "amd64")
    features = class_features(options)
    target: dict[str, Any] = {"kind": "llvm", "mcpu": mcpu_for(arch, features)}
    if arch == "arm64":
        target["mtriple"] = "aarch64-linux-gnu"
    cores = int(options.get("cores", "0") or 0)
    if cores > 0:
        target["num-cores"] = cores
    return target


def target_string(target: dict[str, Any]) -> str:
    """The target as the artifact and the database key record it, e.g.
    'llvm -mcpu=cooperlake -num-cores=2'."""
    rest = " ".join(f"-{k}={v}" for k, v in sorted(target.items()) if k != "kind")
    return f"{target['kind']} {rest}".strip()
