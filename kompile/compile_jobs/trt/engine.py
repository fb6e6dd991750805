"""Engine build and runner: the only module that imports TensorRT (lazily, inside functions).

Written to TensorRT's Python API as documented for 10.x and kept to names TensorRT 11 still has:
strongly typed networks (NetworkDefinitionCreationFlag.STRONGLY_TYPED; no EXPLICIT_BATCH, no
FP16/INT8 builder flags, no calibrator), set_memory_pool_limit, builder_optimization_level, timing
caches, optimization profiles, hardware_compatibility_level, and the name-based I/O API
(num_io_tensors, get_tensor_name, set_input_shape, set_tensor_address, execute_async_v3). Buffers,
the stream and the timing events are torch CUDA objects (the GPU image carries CUDA PyTorch).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.backends.base import BackendError, BackendUnavailable, Feeds
from kompile.compile_jobs.trt.profiles import Profile

Array = np.ndarray[Any, Any]

HARDWARE_COMPATIBILITY = {
    "none": "NONE",
    "ampere_plus": "AMPERE_PLUS",
    "same_compute_capability": "SAME_COMPUTE_CAPABILITY",
}


@dataclass(frozen=True)
class BuildSettings:
    workspace_bytes: int
    optimization_level: int = 3
    hardware_compatibility: str = "none"
    version_compatible: bool = False


def import_tensorrt() -> Any:
    """The tensorrt module, or BackendUnavailable saying where to get it."""
    try:
        import tensorrt
    except ImportError as err:
        raise BackendUnavailable(
            "TensorRT's Python package (tensorrt) is not installed here: run the target in the "
            "compile-gpu image (built on nvcr.io/nvidia/tensorrt, Dockerfile target compile-gpu), or "
            f"pip install tensorrt on a machine with an NVIDIA GPU ({err})"
        ) from None
    return tensorrt


def trt_version() -> str:
    return str(import_tensorrt().__version__)


def _parse(trt: Any, network: Any, onnx_path: Path, logger: Any) -> Any:
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise BackendError(
            f"TensorRT's ONNX parser rejected {onnx_path.name}: {'; '.join(errors[:3]) or 'no detail'}; "
            "an op TensorRT lacks needs a plugin or a different export"
        )
    return parser


def _add_profiles(trt: Any, builder: Any, network: Any, config: Any, profiles: Sequence[Profile]) -> None:
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    for profile in profiles:
        unknown = sorted(set(profile.shapes) - names)
        if unknown:
            raise BackendError(f"signature inputs {unknown} are not inputs of the graph ({sorted(names)})")
        opt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            opt_profile.set_shape(name, trt.Dims(lo), trt.Dims(opt), trt.Dims(hi))
        config.add_optimization_profile(opt_profile)


def _load_timing_cache(config: Any, path: Path | None) -> Any:
    blob = path.read_bytes() if path is not None and path.is_file() else b""
    cache = config.create_timing_cache(blob)
    config.set_timing_cache(cache, False)  # a cache from another device or version is an error
    return cache


def save_timing_cache(config: Any, path: Path) -> None:
    """Write the build's timing cache, merged with whatever another build saved meanwhile."""
    cache = config.get_timing_cache()
    if path.is_file():
        theirs = config.create_timing_cache(path.read_bytes())
        cache.combine(theirs, False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(bytes(cache.serialize()))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new cache, never half


def build_plan(
    onnx_path: Path, profiles: Sequence[Profile], settings: BuildSettings, timing_cache: Path | None
) -> bytes:
    """Serialized plan of a strongly typed network built from the prepared ONNX graph."""
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = _parse(trt, network, onnx_path, logger)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    config.builder_optimization_level = settings.optimization_level
    if settings.hardware_compatibility != "none":
        member = HARDWARE_COMPATIBILITY[settings.hardware_compatibility]
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, member)
    if settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    _add_profiles(trt, builder, network, config, profiles)
    _load_timing_cache(config, timing_cache)
    plan = builder.build_serialized_network(network, config)
    del parser  # the parser owns weights the network referenced until the build is done
    if plan is None:
        raise BackendError(
            f"TensorRT could not build {onnx_path.name} (see the log above); a larger workspace "
            "(option workspaceMiB) or a lower optimization level (optLevel) can help"
        )
    if timing_cache is not None:
        save_timing_cache(config, timing_cache)
    return bytes(plan)


class TrtRunner:
    """Executes one plan on CUDA device 0: torch buffers, a private stream, events for timing."""

    def __init__(self, plan_path: Path, version_compatible: bool = False) -> None:
        trt = import_tensorrt()
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable("running a TensorRT plan needs an NVIDIA GPU; this machine has none")
        self._trt, self._torch = trt, torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        if version_compatible:
            self._runtime.engine_host_code_allowed = True  # the plan embeds its lean runtime
        self.engine = self._runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if self.engine is None:
            raise BackendError(
                f"TensorRT {trt.__version__} could not load {plan_path.name}: a plan loads only on the "
                "TensorRT version and GPU class that built it"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names: list[str] = [n for n in names if is_input[n]]
        self.output_names: list[str] = [n for n in names if not is_input[n]]
        self._dtypes = {n: self._torch_dtype(self.engine.get_tensor_dtype(n)) for n in names}
        self.stream = torch.cuda.Stream()
        self._profile = -1
        self._live: list[Any] = []

    def _torch_dtype(self, dtype: Any) -> Any:
        if dtype == self._trt.DataType.BF16:
            return self._torch.bfloat16
        return self._torch.from_numpy(np.empty(0, dtype=self._trt.nptype(dtype))).dtype

    def _select_profile(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Switch to the first optimization profile whose ranges hold these input shapes."""
        for index in range(self.engine.num_optimization_profiles):
            fits = True
            for name, shape in shapes.items():
                lo, _, hi = self.engine.get_tensor_profile_shape(name, index)
                fits &= all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))
            if fits:
                if index != self._profile:
                    self.context.set_optimization_profile_async(index, self.stream.cuda_stream)
                    self._profile = index
                return
        raise BackendError(f"input shapes {shapes} fall outside every optimization profile of the plan")

    def _bind(self, feeds: Feeds) -> list[Any]:
        """Upload the inputs, set shapes and addresses; the output buffers (bound, not yet filled)."""
        torch = self._torch
        inputs = {}
        for name in self.input_names:
            if name not in feeds:
                raise BackendError(f"input {name!r} missing; the plan takes {self.input_names}")
            host = torch.from_numpy(np.asarray(feeds[name], order="C"))
            inputs[name] = host.to(device="cuda", dtype=self._dtypes[name])
        self._select_profile({n: tuple(t.shape) for n, t in inputs.items()})
        for name, tensor in inputs.items():
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        outputs = []
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            out = torch.empty(shape, dtype=self._dtypes[name], device="cuda")
            self.context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        self.stream.wait_stream(torch.cuda.current_stream())  # the uploads above ran on that stream
        # The context holds raw addresses: keep the tensors alive until the next bind.
        self._live = [*inputs.values(), *outputs]
        return outputs

    def _execute(self) -> None:
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise BackendError("TensorRT execute_async_v3 failed (see the log above)")

    def run(self, feeds: Feeds) -> list[Array]:
        outputs = self._bind(feeds)
        self._execute()
        self.stream.synchronize()
        return [o.float().cpu().numpy() for o in outputs]

    def time_ms(self, feeds: Feeds, iterations: int = 50, warmup: int = 10) -> list[float]:
        """Device time of each execution (CUDA events on the runner's stream, inputs already on the
        device), after a warm-up."""
        torch = self._torch
        self._bind(feeds)
        for _ in range(warmup):
            self._execute()
        self.stream.synchronize()
        times = []
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            self._execute()
            end.record(self.stream)
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        return times
