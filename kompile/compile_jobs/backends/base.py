"""The small interface every compiler backend implements.

A backend turns the exported ONNX graph (or the source module, for backends that want it) into one
artifact file, and gives back a runner that executes exactly that file, so validation and benchmark
measure what ships. Backends are imported lazily by name (`get_backend`): the package imports on a
machine without TensorRT or CUDA.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np

    from kompile.api.spec import InputSpec, Target

Feeds = dict[str, "np.ndarray[Any, Any]"]


class BackendError(RuntimeError):
    """A compile that failed; the message says what failed and, where it can, what to change."""


class BackendUnavailable(BackendError):
    """The backend cannot run on this machine (missing package, no GPU)."""


@dataclass
class CompileRequest:
    """Everything a backend needs to build one target's artifact."""

    onnx_path: Path | None
    """The source model exported to ONNX at fp32 (dynamic axes where the signature says); None
    when no target of the run consumes ONNX (inductor compiles from the module)."""
    out_dir: Path
    """Scratch folder for this target; the artifact file is written inside it."""
    target: Target
    signature: Sequence[InputSpec]
    calibration: Sequence[Feeds]
    """Reference inputs, one feed dict per sample, for static quantization."""
    threads: int | None = None
    module: Any = None
    """The eager torch module, for backends that compile from PyTorch rather than ONNX."""
    device: str = "cpu"
    """cpu or cuda: the device of the hardware class the artifact is built for (one of the
    backend's `devices`)."""

    def onnx(self) -> Path:
        """The exported graph, for backends that compile from ONNX."""
        if self.onnx_path is None:
            raise BackendError(
                f"target {self.target.name!r}: this backend compiles the ONNX export, which was not made"
            )
        return self.onnx_path


@dataclass
class CompiledArtifact:
    """One built artifact and what it took to build it."""

    model_path: Path
    serving_format: str
    """KServe model format name: onnx, tensorrt, pytorch."""
    triton_platform: str
    """Triton platform or backend: onnxruntime_onnx, tensorrt_plan, ..."""
    model_filename: str
    """File name inside the Triton version folder: model.onnx, model.plan."""
    options: dict[str, str] = field(default_factory=dict)
    """Compile options actually used, recorded with the artifact."""
    toolchain: dict[str, str] = field(default_factory=dict)
    """Package versions that built it."""


class Runner(Protocol):
    """Executes an artifact; outputs come back in `output_names` order as numpy arrays."""

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: Feeds) -> list[np.ndarray[Any, Any]]: ...


class Backend(ABC):
    """A compiler. Subclasses live in `kompile/compile_jobs/backends/<name>.py` as `BACKEND`."""

    name: ClassVar[str]
    precisions: ClassVar[frozenset[str]]
    device: ClassVar[str]
    """cpu or cuda: the device the backend builds for when the hardware class does not say."""
    devices: ClassVar[frozenset[str]] = frozenset()
    """Every device the backend can build for; empty means only `device`."""

    def supports_device(self, device: str) -> bool:
        return device in (self.devices or frozenset({self.device}))

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None when it can."""
        return None

    @abstractmethod
    def version(self) -> str:
        """Version of the compiler, part of the compile cache key."""

    @abstractmethod
    def compile(self, request: CompileRequest) -> CompiledArtifact:
        """Build the artifact. Raises BackendError with a message that says what to change."""

    @abstractmethod
    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> Runner:
        """A runner for the built artifact file, on `device` (the request's)."""


def get_backend(name: str) -> Backend:
    """Import `kompile.compile_jobs.backends.<name>` and return its BACKEND instance."""
    try:
        module = importlib.import_module(f"kompile.compile_jobs.backends.{name}")
    except ModuleNotFoundError as err:
        if err.name and err.name.endswith(f"backends.{name}"):
            raise BackendUnavailable(f"unknown backend {name!r}") from None
        raise BackendUnavailable(
            f"backend {name!r} needs the Python package {err.name!r}: pip install 'kompile[{name}]'"
        ) from None
    backend = module.BACKEND
    assert isinstance(backend, Backend)
    return backend
