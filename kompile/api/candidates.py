"""Which candidates a target stands for. Pure and shared: the operator needs the backends (for the
compile image and the cache key), the compile Job expands the same list and builds each one."""

from __future__ import annotations

from kompile.api.spec import Candidate, Target
from kompile.api.vocabulary import Backend

# A hardware class's default candidates for backend auto, fastest-first by expectation: the
# selection measures anyway, the order only decides ties.
AUTO_BACKENDS: dict[str, tuple[Backend, ...]] = {
    "cpu": ("onnxruntime", "inductor"),
    "cuda": ("tensorrt", "inductor"),
}
GPU_ONLY_BACKENDS = frozenset({"tensorrt"})


def is_multi(target: Target) -> bool:
    """True when the target is decided by a selection among candidates."""
    return target.backend == "auto" or bool(target.candidates)


def target_device(target: Target, gpu_class: bool | None = None) -> str:
    """cpu or cuda: an explicit options.device wins, then the hardware class, then the backend."""
    explicit = (target.options or {}).get("device")
    if explicit in ("cpu", "cuda"):
        return explicit
    if gpu_class is not None:
        return "cuda" if gpu_class else "cpu"
    backends = {c.backend for c in target.candidates or []} | {target.backend}
    return "cuda" if backends & GPU_ONLY_BACKENDS else "cpu"


def candidates_of(target: Target, device: str) -> list[Candidate]:
    """The target's candidates: its own list, the class defaults for auto, or just itself."""
    if target.candidates:
        return list(target.candidates)
    backends = AUTO_BACKENDS[device] if target.backend == "auto" else (target.backend,)
    return [
        Candidate(
            backend=b, precision=target.precision, quantization=target.quantization, options=target.options
        )
        for b in backends
    ]


def candidate_targets(target: Target, device: str) -> list[Target]:
    """Each candidate as a Target of its own (named, precision and tolerances filled in), so one
    build path serves single targets and candidates alike."""
    out: list[Target] = []
    taken: set[str] = {c.name for c in target.candidates or [] if c.name}
    for c in candidates_of(target, device):
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


def backends_of(target: Target, device: str) -> list[str]:
    """Backends the target's candidates use (the compile image must carry each)."""
    return sorted({c.backend for c in candidates_of(target, device)})
