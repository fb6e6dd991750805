"""Which candidates a target stands for. Pure and shared: the operator needs the backends (for the
compile image and the cache key), the compile Job expands the same list and builds each one. What
`auto` offers on a device, and which backends only build for GPUs, comes from the catalog."""

from __future__ import annotations

from kompile.api.catalog import AUTO, auto_backends, entry, options_for
from kompile.api.spec import Candidate, Target

# precision: auto tries these in order, expected fastest first; the first that validates ends it.
LADDER = ("int8", "bf16", "fp16", "fp32")
# Rungs a CPU class climbs only where a candidate names them: a CPU computes fp16 no faster than
# fp32. Measured (Intel Xeon with AVX512-FP16 and AMX, 2 threads, MobileNetV2 batch 1): inductor fp16
# 9.56 ms, its fp32 9.44, ONNX Runtime fp32 3.91; validated, fp16 ended the climb 2.4x short.
GPU_RUNGS = frozenset({"fp16"})


def is_multi(target: Target) -> bool:
    """True when the target is decided by a selection among candidates."""
    return target.backend == AUTO or bool(target.candidates) or target.precision == AUTO


def is_generated(target: Target) -> bool:
    """True when kompile chose the candidates (backend or precision auto, no explicit list): such a
    target drops what cannot build here without a word, and may add int8 remedies."""
    return not target.candidates and (target.backend == AUTO or target.precision == AUTO)


def _device_option(options: dict[str, str] | None) -> str | None:
    value = (options or {}).get("device", "").strip().lower()
    return value or None


def needs_gpu(target: Target) -> bool:
    """A target is for a GPU when a backend it names only builds for one, or its options (or a
    candidate's) say device cuda."""
    parts = [(target.backend, target.options)] + [(c.backend, c.options) for c in target.candidates or []]
    return any((b != AUTO and entry(b).gpu_only) or _device_option(o) == "cuda" for b, o in parts)


def target_device(target: Target, gpu_class: bool | None = None) -> str:
    """cpu or cuda: an explicit options.device wins, then the hardware class, then the backends."""
    explicit = _device_option(target.options)
    if explicit is not None:
        return explicit
    if gpu_class is not None:
        return "cuda" if gpu_class else "cpu"
    return "cuda" if needs_gpu(target) else "cpu"


def _listed(target: Target, device: str, arch: str | None) -> list[Candidate]:
    """The target's own list, the class's auto backends, or just itself, before any precision."""
    if target.candidates:
        return list(target.candidates)
    if target.backend == AUTO:
        pairs = [(b, options_for(b, target.options)) for b in auto_backends(device, arch)]
    else:
        pairs = [(target.backend, target.options)]
    return [Candidate(backend=b, quantization=target.quantization, options=o or None) for b, o in pairs]


def _climbed(device: str) -> tuple[str, ...]:
    """The ladder's rungs on a device: a CPU class leaves the GPU rungs out."""
    return tuple(r for r in LADDER if device == "cuda" or r not in GPU_RUNGS)


def rungs_left_out(target: Target, device: str, arch: str | None = None) -> list[tuple[str, str]]:
    """(backend, rung) for each rung the device's ladder leaves out where the backend builds it."""
    if target.precision != AUTO:
        return []
    listed = dict.fromkeys(c.backend for c in _listed(target, device, arch) if c.precision is None)
    return [(b, r) for r in LADDER if r not in _climbed(device) for b in listed if r in entry(b).precisions]


def candidates_of(target: Target, device: str, arch: str | None = None) -> list[Candidate]:
    """The target's candidates: its own list, the class's auto backends (by device and architecture;
    None: any), or just itself. An auto candidate gets the keys of the target's options that its
    backend knows."""
    listed = _listed(target, device, arch)
    if target.precision != AUTO:
        return [c if c.precision else c.model_copy(update={"precision": target.precision}) for c in listed]
    # The ladder: each candidate without a precision of its own once per rung, rung by rung.
    climbed = _climbed(device)
    return [
        c.model_copy(update={"precision": rung, "quantization": c.quantization if rung == "int8" else None})
        if c.precision is None
        else c
        for rung in LADDER
        for c in listed
        if c.precision == rung or (c.precision is None and rung in climbed)
    ]


def candidate_targets(target: Target, device: str, arch: str | None = None) -> list[Target]:
    """Each candidate as a Target of its own (named, precision and tolerances filled in), so one
    build path serves single targets and candidates alike."""
    out: list[Target] = []
    taken: set[str] = {c.name for c in target.candidates or [] if c.name}
    for c in candidates_of(target, device, arch):
        precision = c.precision or target.precision
        name = c.name
        if name is None:
            base = f"{c.backend}-{precision}"
            name, n = base, 2
            while name in taken:
                name, n = f"{base}-{n}", n + 1
        taken.add(name)
        out.append(
            Target(
                name=name,
                backend=c.backend,
                precision=precision,
                quantization=c.quantization if precision == "int8" else None,
                options=c.options,
                tolerances=target.tolerances,
                hardware=target.hardware,
            )
        )
    return out


def backends_of(target: Target, device: str, arch: str | None = None) -> list[str]:
    """Backends the target's candidates use (the compile image must carry each)."""
    return sorted({c.backend for c in candidates_of(target, device, arch)})
