"""This machine's hardware class, and which targets it can serve.

A class name is what the artifact depends on: architecture and the widest vector ISA for CPUs
(ONNX Runtime's saved layouts and int8 kernels differ by ISA; AMX and AVX-512 BF16 compute bf16 and
int8 natively where plain VNNI emulates bf16), product and compute capability for
GPUs. The operator derives the same names from node labels.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def cpu_isa(flags: set[str], arch: str) -> str:
    """The widest vector ISA that changes which kernels run."""
    if arch == "amd64":
        # AMX and AVX-512 BF16 first: bf16 (and AMX int8) run natively there and emulated on plain
        # VNNI, so a winner measured on one is not the winner, or not native code, on the other.
        if "amx_int8" in flags:
            return "amx"
        if "avx512_bf16" in flags:
            return "avx512bf16"
        if "avx512_vnni" in flags or "avx512vnni" in flags:
            return "avx512vnni"
        if "avx512f" in flags:
            return "avx512"
        if "avx_vnni" in flags:
            return "avxvnni"
        if "avx2" in flags:
            return "avx2"
        return "sse"
    if arch == "arm64":
        return "dotprod" if "asimddp" in flags else "neon"
    return "generic"


# Flags that decide which kernels (and so which figures) a CPU gets, printed beside every figure.
_FIGURE_FLAGS = (
    "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "asimddp", "bf16", "i8mm", "sve",
)  # fmt: skip


@cache
def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, feature flags) of this machine's CPU, from /proc/cpuinfo where there is one."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "Model")) and model in ("", platform.machine()):
                model = line.split(":", 1)[1].strip()
            if line.startswith(("flags", "Features")) and not flags:
                flags = set(line.split(":", 1)[1].split())
    return model, flags


def local_arch() -> str:
    """This machine's architecture as Kubernetes names it (`kubernetes.io/arch`: amd64, arm64)."""
    return _ARCH.get(platform.machine().lower(), platform.machine().lower())


@cache
def local_cpu_class() -> str:
    arch = local_arch()
    return f"cpu-{arch}-{cpu_isa(_cpuinfo()[1], arch)}"


# Flags of CPUs that compute bf16 natively; elsewhere bf16 is emulated, slower than fp32.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def has_fast_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16, AMX, or Arm's BF16 extension)."""
    return any(f in _cpuinfo()[1] for f in BF16_FLAGS)


# x86 flags of instructions that multiply u8 by s8 straight into int32 (VNNI, AMX). Without them
# int8 kernels add each pair of products in int16 first (vpmaddubsw), which saturates where 8-bit
# weights meet large activations.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_pairs_saturate() -> bool:
    """Whether this CPU's u8 x s8 kernels add product pairs in int16 (x86 without VNNI): ONNX
    Runtime's int8 then drifts from the quantized model's own math unless weights keep 7 bits."""
    return local_arch() == "amd64" and not any(f in _cpuinfo()[1] for f in VNNI_FLAGS)


def cpu_description() -> str:
    """The CPU model and the ISA features that shape its figures, e.g. 'AMD EPYC (avx2, avx512f)'."""
    model, flags = _cpuinfo()
    shown = [f for f in _FIGURE_FLAGS if f in flags]
    return f"{model} ({', '.join(shown) or 'no vector extensions reported'})"


def local_cuda_capability() -> tuple[int, int] | None:
    """Compute capability of device 0, or None without CUDA (imports torch lazily)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return int(major), int(minor)


def local_cuda_class() -> str | None:
    """GPU class of device 0, or None without CUDA (imports torch lazily)."""
    capability = local_cuda_capability()
    if capability is None:
        return None
    import torch

    product = torch.cuda.get_device_name(0).replace(" ", "-")
    return f"gpu-{product}-sm{capability[0]}{capability[1]}"
