"""The small interface every compiler backend implements.

A backend turns the exported ONNX graph (or the source module, for backends that want it) into an
artifact, and gives back a runner that executes exactly that artifact, so validation and benchmark
measure what ships. What a backend is (name, devices, precisions, input, serving format, options,
version) is its catalog entry in `kompile.api.catalog`; the class here reads it from there.
Backends are imported lazily by name (`get_backend`): the package imports on a machine without
TensorRT or CUDA.
"""

from __future__ import annotations

import importlib
import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from kompile.api.catalog import CATALOG, BackendEntry, BackendOptions, Serving
from kompile.compile_jobs.calibration import calibration_part, held_out
from kompile.compile_jobs.quiet import output_held

if TYPE_CHECKING:
    import numpy as np

    from kompile.api.spec import InputSpec, Target
    from kompile.api.status import Thresholds
    from kompile.api.vocabulary import TaskKind
    from kompile.compile_jobs.run_results import RunResults

log = logging.getLogger("kompile")

Feeds = dict[str, "np.ndarray[Any, Any]"]
OptionsT = TypeVar("OptionsT", bound=BackendOptions)


class BackendError(RuntimeError):
    """A compile that failed; the message says what failed and, where it can, what to change."""


class BackendUnavailable(BackendError):
    """The backend cannot run on this machine (missing package, no GPU)."""


def node_gpu(backend: str, capability: tuple[int, int] | None) -> tuple[int, int]:
    """The compute capability a backend's cuda build targets and validates on (`capability`, the
    node's GPU as hardware.local_cuda_capability probes it); BackendUnavailable where it has none."""
    if capability is None:
        raise BackendUnavailable(
            f"{backend} for cuda builds for this node's NVIDIA GPU and validates on it; torch sees none "
            "here (torch.cuda.is_available() is False): run this target on a GPU node"
        )
    return capability


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
    reference: RunResults
    """The source model's outputs on the reference inputs, computed once per run: calibration data
    for static quantization, and what a backend's own pre-checks compare against."""
    options: BackendOptions
    """The target's options, parsed by the backend's catalog entry."""
    thresholds: Thresholds
    """Validation thresholds of the target (precision defaults, spec.validation, the target's)."""
    task: TaskKind = "auto"
    """spec.validation.task, for the task-level checks."""
    threads: int | None = None
    module: Any = None
    """The eager torch module, for backends that compile from PyTorch rather than ONNX."""
    device: str = "cpu"
    """cpu or cuda: the device of the hardware class the artifact is built for (one of the
    backend's devices)."""
    progress: Callable[[str], None] | None = None
    """Where a long compile says what it is doing (a tuning's rounds): the run's progress display
    or the Job's log. None: nowhere."""

    sized_inputs: Sequence[Feeds] = ()
    """The calibration samples' inputs at the other sizes of the dynamic dims the artifact is
    validated at (kompile.compile_jobs.dims_check: each dim's min, half its opt, its max)."""

    @property
    def calibration(self) -> list[Feeds]:
        """The reference inputs static int8 calibrates on, one feed dict per sample: all but those
        held out for the gate to judge as unseen (kompile.compile_jobs.calibration)."""
        return calibration_part(self.reference.inputs)

    @property
    def calibration_outputs(self) -> list[list[np.ndarray[Any, Any]]]:
        """The source model's outputs on `calibration`, sample for sample."""
        return calibration_part(self.reference.outputs)

    @property
    def held_out_samples(self) -> list[int]:
        """Indices of the reference samples no calibration sees."""
        return held_out(len(self.reference.inputs))

    @property
    def calibration_at_sizes(self) -> list[Feeds]:
        """The calibration inputs and those at the other sizes validated: a range calibrated at opt
        alone clips what grows with the size (NudeNet's YOLOv8 box coordinates at 512 against 224:
        ONNX Runtime int8 at cosine 0.958 there, 0.9999 calibrated at the sizes too).
        `sized_inputs` leaves out the held-out samples' too (DimsCheck.inputs)."""
        return [*self.calibration, *self.sized_inputs]

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

    backend: str
    model_path: Path
    """The model file; a backend whose serving format has more files writes them beside it."""
    options: dict[str, str] = field(default_factory=dict)
    """Compile options actually used, recorded with the artifact."""
    toolchain: dict[str, str] = field(default_factory=dict)
    """Package versions that built it."""
    serving_parameters: dict[str, str] = field(default_factory=dict)
    """Parameters for the Triton backend that serves it (its config.pbtxt `parameters`)."""
    data_files: list[str] = field(default_factory=list)
    """Files beside model_path that its model reads (ONNX external data): part of the artifact."""

    @property
    def serving(self) -> Serving | None:
        """How Triton serves it (from the catalog); None for a backend kompile cannot roll out."""
        return CATALOG[self.backend].serving

    def files(self) -> list[tuple[Path, str]]:
        """(built file, name in the Triton version folder) for each file of the artifact."""
        data = [(self.model_path.parent / name, name) for name in self.data_files]
        if self.serving is None:
            return [(self.model_path, self.model_path.name), *data]
        first, *rest = self.serving.files
        return [(self.model_path, first)] + [(self.model_path.parent / name, name) for name in rest] + data


@dataclass(frozen=True)
class Remedy:
    """One known way to win back accuracy an int8 artifact lost: built as a candidate of its own
    (named `<candidate>-<name>`) with these options over the failed one's."""

    name: str
    summary: str
    options: dict[str, str] = field(default_factory=dict)
    quantization: str | None = None
    """dynamic or static; None keeps the failed candidate's."""


class Runner(Protocol):
    """Executes an artifact; outputs come back in `output_names` order as numpy arrays."""

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: Feeds) -> list[np.ndarray[Any, Any]]: ...


class Backend(ABC):
    """A compiler. Subclasses live in `kompile/compile_jobs/backends/<name>.py` as `BACKEND`; what
    they are comes from `kompile.api.catalog.CATALOG[name]`."""

    name: ClassVar[str]

    @property
    def entry(self) -> BackendEntry:
        return CATALOG[self.name]

    @property
    def precisions(self) -> frozenset[str]:
        return self.entry.precisions

    def supports_device(self, device: str) -> bool:
        return device in self.entry.devices

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None when it can."""
        return None

    def installed_versions(self) -> dict[str, str]:
        """Versions of the entry's distributions as installed here, or in its own environment
        (absent ones left out)."""
        if self.entry.environment:
            from kompile.compile_jobs import environments

            return environments.installed_versions(self.entry.environment, self.entry.version_from)
        out = {}
        for dist in self.entry.version_from:
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return out

    def version(self) -> str:
        """Its version as the catalog spells it: part of the lineage, and equal to the operator's
        cache-key version when the image carries the pinned toolchain."""
        return self.entry.version_string(self.installed_versions())

    def check_request(self, request: CompileRequest) -> None:
        """Refuse a precision or device the backend does not build, naming what it does."""
        target = request.target
        if target.precision not in self.precisions:
            builds = sorted(self.precisions)
            raise BackendError(f"target {target.name!r}: {self.name} builds {builds}, not {target.precision}")
        if not self.supports_device(request.device):
            raise BackendError(f"{self.name} builds for {list(self.entry.devices)}, not {request.device}")

    def remedies(self, failed: CompiledArtifact) -> list[Remedy]:
        """What to try, in order, when this int8 artifact failed validation; none by default. The
        recorded options of `failed` say what it already was, so no remedy repeats it."""
        return []

    @abstractmethod
    def compile(self, request: CompileRequest) -> CompiledArtifact:
        """Build the artifact. Raises BackendError with a message that says what to change."""

    @abstractmethod
    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> Runner:
        """A runner for the built artifact, on `device` (the request's)."""


def get_backend(name: str) -> Backend:
    """Import `kompile.compile_jobs.backends.<name>` and return its BACKEND instance."""
    if name not in CATALOG:
        raise BackendUnavailable(f"unknown backend {name!r}; the catalog has {sorted(CATALOG)}")
    qualified = f"kompile.compile_jobs.backends.{name}"
    imported = sys.modules.get(qualified)
    if imported is not None:  # looked up once per candidate: only the first import prints
        backend: Backend = imported.BACKEND
        return backend
    printed: list[str] = []
    try:
        # Compiler packages print notes as they are imported (coremltools: eleven lines on versions
        # it has not tested and macOS libraries): kept for --debug, not amid a run's progress.
        with output_held(printed):
            module = importlib.import_module(qualified)
    except ModuleNotFoundError as err:
        if err.name and err.name.endswith(f"backends.{name}"):
            raise BackendUnavailable(f"backend {name!r} is in the catalog but has no module") from None
        raise BackendUnavailable(
            f"backend {name!r} needs the Python package {err.name!r}: "
            f"pip install 'kompile[{CATALOG[name].extra}]'"
        ) from None
    finally:
        if printed and printed[0].strip():
            log.debug("importing backend %s printed:\n%s", name, printed[0].rstrip())
    backend = module.BACKEND
    assert isinstance(backend, Backend)
    return backend


def options_of(request: CompileRequest, kind: type[OptionsT]) -> OptionsT:
    """The request's options as the backend's own options model (a programming error otherwise)."""
    if not isinstance(request.options, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(request.options).__name__}")
    return request.options
