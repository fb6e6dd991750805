"""AOTInductor backend: `torch.export` the source module and compile it ahead of time into a `.pt2`.

Steps, each recorded in the artifact's options:
- the eager module (PyTorch sources only) is cast to the target precision (fp32, bf16, fp16: floating
  parameters, buffers and float inputs) and moved to the request's device (cpu or cuda);
- `torch.export` traces it with the signature's dynamic dimensions as `torch.export.Dim`s (inputs
  that share a dim name share the Dim). The example holds every dynamic dim at size 2 or more:
  export specializes dims it sees at 0 or 1. Whatever cannot become one graph (Python control flow
  on tensor values, an op without export support) fails here with the file:line of the construct:
  an ahead-of-time package has no Python to fall back to, so graph breaks are not allowed;
- `torch._inductor.aoti_compile_and_package` compiles the program into `model.pt2` (C++ and OpenMP
  kernels on the CPU, Triton kernels on CUDA) with `maxAutotune` and `freezing`. On the CPU the
  kernels' OpenMP thread count is baked in at compile time (`intraOpThreads`) unless
  `dynamicThreads` is set; the package also carries its input names and dtypes as metadata;
- `load` opens the package with `torch._inductor.aoti_load_package`, exactly the file that ships.
  AOTInductor packages do not capture CUDA graphs themselves; `cudaGraphs` (cuda only) makes the
  runner load the package single-threaded and capture one CUDA graph per input shape around it.
  A server must do the same to see the same latency (Triton's torch_aoti platform does not).

Serving: Triton's PyTorch backend serves AOTInductor packages as `platform: "torch_aoti"` with
`backend: "pytorch"` and `1/model.pt2` (its default file name) built by the same torch version as
the server's libtorch; inputs are named `ARGS[0]`, `ARGS[1]`, ... in signature order and a single
output `RESULT` (`RESULT[i]` for a tuple). Through KServe: `modelFormat: pytorch` with
`runtime: kserve-tritonserver` set explicitly (TorchServe's runtime claims `pytorch` otherwise).
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch._inductor import exc as inductor_exc

from kompile.api.catalog.inductor import InductorOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    options_of,
)
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.export import dynamic_shapes as dynamic_shapes  # tests read it here
from kompile.compile_jobs.export import example_sizes, names_for_outputs
from kompile.compile_jobs.export import flatten_outputs as flatten_outputs  # executorch reads it here
from kompile.compile_jobs.inputs import generate_feeds, resize
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.source_module import in_eval_mode
from kompile.compile_jobs.sources import module_label
from kompile.compile_jobs.user_code import user_frame

if TYPE_CHECKING:
    from kompile.api.spec import InputSpec

Array = np.ndarray[Any, Any]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INPUT_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
# What torch.export and the user's forward() raise while tracing; re-raised as a BackendError.
EXPORT_ERRORS = (RuntimeError, TypeError, ValueError, AssertionError, AttributeError, IndexError, KeyError)
_META_INPUTS, _META_DTYPES, _META_PRECISION = "kompile.inputs", "kompile.input_dtypes", "kompile.precision"


# ---------------------------------------------------------------------------------------------
# Example inputs and dynamic shapes


def example_feed(signature: Sequence[InputSpec], calibration: Sequence[Feeds]) -> Feeds:
    """The first reference input, resized along dynamic axes to the example sizes (inputs.resize:
    values repeat, a left-padded row keeps its end)."""
    sizes = example_sizes(signature)
    if not calibration:
        return generate_feeds(signature, 1, seed=0, sizes=sizes)[0]
    first: Feeds = calibration[0]
    for spec in signature:
        if spec.name not in first:
            raise BackendError(
                f"reference inputs lack model input {spec.name!r}; they must name each of "
                f"{[s.name for s in signature]}"
            )
    return resize(first, signature, sizes)


def to_tensor(value: Array, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(value, order="C")).to(device=device, dtype=dtype)


def input_dtypes(signature: Sequence[InputSpec], model_dtype: torch.dtype) -> list[torch.dtype]:
    """What the package takes: float inputs in the model's precision, the others as declared."""
    return [
        model_dtype if INPUT_DTYPES[s.dtype].is_floating_point else INPUT_DTYPES[s.dtype] for s in signature
    ]


# ---------------------------------------------------------------------------------------------
# Export errors: name the construct and where it sits


_LOCATION = re.compile(r"File: (\S+?\.py):(\d+) in \w+, code: (.+)|\((\S+?\.py):(\d+) in \w+\)")


_FIX = re.compile(r"^\s*(\w+) = (Dim\(.*\)|\d+)\s*$")


def _suggested_fixes(text: str) -> list[str]:
    """torch.export's 'Suggested fixes:' lines ("seq = Dim('seq', max=24)", 'seq = 16')."""
    _, found, rest = text.partition("Suggested fixes:")
    return [m.group(0).strip() for ln in rest.splitlines() if (m := _FIX.match(ln))] if found else []


def _constraint_advice(first: str, fixes: list[str]) -> str:
    """A declared dim torch.export could not hold: a narrower range (a branch or an index on the
    size) is fixed by the dim's min/max, a size the code fixes by making it static or generic."""
    ranged = [f for f in fixes if "Dim(" in f]
    if ranged:
        names = ", ".join(f.split(" = ")[0] for f in ranged)
        return (
            f"{first}; the model's code holds {names} only in a narrower range than spec.inputs declares "
            f"(torch.export suggests {'; '.join(ranged)}): narrow that dim's min/max in "
            "spec.inputs[].dynamicDims, or make the code shape-generic past it"
        )
    said = f" (torch.export suggests {'; '.join(fixes)})" if fixes else ""
    return (
        f"{first}; a dimension declared dynamic in spec.inputs is treated as a constant by the "
        f"model{said}: make the code shape-generic, or make that dimension static in spec.inputs"
    )


def describe_export_error(err: BaseException, label: str, package: str = "an AOTInductor package") -> str:
    """A one-paragraph message: where (file:line and code), what construct, and what to change."""
    text = str(err)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)
    frame = user_frame(err)
    where, code = "", ""
    if frame is not None:
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    elif match := _LOCATION.search(text):
        path, line = match.group(1) or match.group(4), match.group(2) or match.group(5)
        where, code = f"{Path(path).name}:{line}", (match.group(3) or "").strip()
    op = re.search(r"(aten[.:]{1,2}[A-Za-z0-9_.]+)", text)
    if "data-dependent" in text or "GuardOnDataDependent" in type(err).__name__:
        what = (
            "Python control flow or a Python value computed from a tensor's values (data-dependent); "
            "rewrite it with tensor ops (torch.where, torch.cond) or make it independent of input values"
        )
    elif "Constraints violated" in text or "specialized" in text:
        what = _constraint_advice(first, _suggested_fixes(text))
    elif op:
        what = f"operator {op.group(1)} cannot be exported ({first}); replace it or register a fake kernel"
    else:
        what = first
    at = f"{where}: `{code}`: " if code else (f"{where}: " if where else "")
    return (
        f"cannot export {label} with torch.export for {package}: {at}{what}. Graph breaks "
        "are not allowed in an ahead-of-time package: the whole forward() must trace as one graph"
    )


# ---------------------------------------------------------------------------------------------
# Toolchain


def cxx_compiler() -> str | None:
    """The C++ compiler AOTInductor would use, or None when there is none."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        return str(get_cpp_compiler())
    except inductor_exc.InvalidCxxCompiler:
        return None


def _first_line_of(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def toolchain(device: str) -> dict[str, str]:
    cxx = cxx_compiler() or "none"
    out = {"torch": str(torch.__version__), "cxx": f"{cxx}: {_first_line_of([cxx, '--version'])}"}
    if device == "cuda":
        out["cuda"] = str(torch.version.cuda)
        out["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        out["computeCapability"] = f"{major}.{minor}"
        with contextlib.suppress(ModuleNotFoundError):
            import triton

            out["triton"] = str(triton.__version__)
    return out


def _cuda_missing(what: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"{what} for cuda needs an NVIDIA GPU with CUDA and a CUDA build of torch; here "
        f"torch {torch.__version__} sees none (torch.cuda.is_available() is False): run this target "
        "on a GPU node, or build it for cpu"
    )


# ---------------------------------------------------------------------------------------------
# The runner


class InductorRunner:
    """The AOTInductor package on its device; float outputs come back as float32 numpy arrays."""

    def __init__(self, path: Path, device: str, cuda_graphs: bool = False) -> None:
        try:
            self.model = torch._inductor.aoti_load_package(str(path), run_single_threaded=cuda_graphs)
        except (RuntimeError, ValueError, OSError) as err:
            raise BackendError(f"cannot load the AOTInductor package {path}: {err}") from err
        meta = self.model.get_metadata()
        built_for = meta.get("AOTI_DEVICE_KEY", device)
        if built_for != device:
            raise BackendError(f"{path.name} was built for {built_for}, not {device}: load it on {built_for}")
        if _META_INPUTS not in meta:
            raise BackendError(
                f"{path} was not built by kompile (no input names in its metadata); rebuild it"
            )
        self.path, self.device, self.cuda_graphs = path, device, cuda_graphs
        self.input_names: list[str] = meta[_META_INPUTS].split(",")
        self._dtypes = [getattr(torch, d) for d in meta[_META_DTYPES].split(",")]
        from torch.utils._pytree import treespec_loads

        leaves = treespec_loads(self.model.loader.get_call_spec()[1]).num_leaves
        self.output_names: list[str] = names_for_outputs(leaves)
        self._graphs: dict[tuple[Any, ...], tuple[Any, list[torch.Tensor], Any]] = {}

    def run(self, feeds: Feeds) -> list[Array]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BackendError(f"inputs {missing} missing for {self.path.name}; it takes {self.input_names}")
        args = [
            to_tensor(feeds[n], dt, self.device) for n, dt in zip(self.input_names, self._dtypes, strict=True)
        ]
        try:
            with torch.inference_mode():
                out = self._graphed(args) if self.cuda_graphs else self.model(*args)
                flat = [t.float().cpu().numpy() for t in flatten_outputs(out)]
        except (RuntimeError, ValueError) as err:
            shapes = {n: list(np.shape(feeds[n])) for n in self.input_names}
            raise BackendError(
                f"running {self.path.name} on inputs shaped {shapes} failed: {err}; are they inside the "
                "signature's dynamic ranges?"
            ) from err
        if self.device == "cuda":
            torch.cuda.synchronize()  # .cpu() already waits; this keeps timings honest for any output
        return flat

    def _graphed(self, args: list[torch.Tensor]) -> Any:
        """Replay the CUDA graph captured for these shapes (captured on first sight)."""
        key = tuple(tuple(a.shape) for a in args)
        if key not in self._graphs:
            static = [a.clone() for a in args]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # kernel loading and first allocations stay out of the capture
                    self.model(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.model(*static)
            self._graphs[key] = (graph, static, out)
        graph, static, out = self._graphs[key]
        for buffer, arg in zip(static, args, strict=True):
            buffer.copy_(arg)
        graph.replay()
        return out


# ---------------------------------------------------------------------------------------------
# The backend


def _already(module: Any, device: str, dtype: torch.dtype) -> bool:
    """Whether every floating weight of the module is on `device` in `dtype` (to() changes nothing)."""
    tensors = [*module.parameters(), *module.buffers()] if isinstance(module, torch.nn.Module) else []
    return all(t.device.type == device and (t.dtype == dtype or not t.is_floating_point()) for t in tensors)


class InductorBackend(Backend):
    name = "inductor"

    def unavailable_reason(self) -> str | None:
        if cxx_compiler() is None:
            return (
                "inductor compiles C++ and finds no C++ compiler (g++, clang++ or $CXX) on PATH: install "
                "one (apt-get install g++) in the compile image"
            )
        return None

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        target, device = request.target, request.device
        if request.module is None:
            raise BackendError(
                f"target {target.name!r}: inductor compiles from a PyTorch source (an nn.Module, a "
                "torch.export .pt2 or a python:// factory) and this source is ONNX; use backend "
                "onnxruntime or tensorrt for it"
            )
        if device == "cuda" and not torch.cuda.is_available():
            raise _cuda_missing("inductor")
        opts = options_of(request, InductorOptions)
        if opts.cuda_graphs and device != "cuda":
            raise BackendError(
                "option cudaGraphs=true applies to cuda builds only; remove it for a cpu target"
            )
        dtype = DTYPES[target.precision]
        threads = opts.intra_op_threads or request.threads or available_cores()
        label = module_label(request.module)
        # Module.to() converts in place: a copy unless the source already is on this device in this
        # dtype, so that the eager reference and benchmark keep the model as the user gave it.
        module = request.module if _already(request.module, device, dtype) else copy.deepcopy(request.module)
        module = in_eval_mode(module.to(device=device, dtype=dtype))
        dtypes = input_dtypes(request.signature, dtype)
        feed = example_feed(request.signature, request.calibration)
        args = tuple(
            to_tensor(feed[s.name], dt, device) for s, dt in zip(request.signature, dtypes, strict=True)
        )
        record = {
            "precision": target.precision,
            "device": device,
            "maxAutotune": str(opts.max_autotune).lower(),
            "freezing": str(opts.freezing).lower(),
            "inputOrder": ",".join(s.name for s in request.signature),
            "exampleSizes": ",".join(f"{k}={v}" for k, v in example_sizes(request.signature).items()),
        }
        configs: dict[str, Any] = {
            "max_autotune": opts.max_autotune,
            "freezing": opts.freezing,
            "aot_inductor.metadata": {
                _META_INPUTS: record["inputOrder"],
                _META_DTYPES: ",".join(str(d).removeprefix("torch.") for d in dtypes),
                _META_PRECISION: target.precision,
            },
        }
        if device == "cpu":
            configs["cpp.threads"] = threads
            configs["cpp.dynamic_threads"] = opts.dynamic_threads
            record.update(intraOpThreads=str(threads), dynamicThreads=str(opts.dynamic_threads).lower())
        else:
            record["cudaGraphs"] = str(opts.cuda_graphs).lower()
        out = request.out_dir / "model.pt2"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        # torch prints graphs and progress (pages of a traced graph when export fails): into the
        # build folder's log, not amid the progress and `kompile run --json`'s stdout.
        with output_to(request.out_dir / "compile.log"):
            try:
                shapes: tuple[Any, ...] | None = dynamic_shapes(request.signature)
                if shapes and getattr(module, "wraps_source", False):
                    shapes = (shapes,)  # source_module.SourceModule takes its inputs as *tensors
                with torch.no_grad():
                    program = torch.export.export(module, args, dynamic_shapes=shapes)
            except EXPORT_ERRORS as err:
                raise BackendError(describe_export_error(err, label)) from err
            try:
                torch._inductor.aoti_compile_and_package(
                    program, package_path=str(out), inductor_configs=configs
                )
            except (RuntimeError, OSError) as err:  # CppCompileError and InductorError are RuntimeErrors
                first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
                raise BackendError(
                    f"AOTInductor could not compile {label} for {device} at {target.precision}: {first}; "
                    "try freezing=false or maxAutotune=false, or precision fp32"
                ) from err
        return CompiledArtifact(
            backend=self.name,
            model_path=out,
            options=record,
            toolchain=toolchain(device),
        )

    def load(
        self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu"
    ) -> InductorRunner:
        if device == "cuda" and not torch.cuda.is_available():
            raise _cuda_missing(f"loading {artifact.model_path.name}")
        recorded = artifact.options.get("intraOpThreads", "")
        # oneDNN and ATen kernels outside the generated code use torch's pool.
        torch.set_num_threads(threads or (int(recorded) if recorded.isdigit() else available_cores()))
        cuda_graphs = device == "cuda" and artifact.options.get("cudaGraphs") == "true"
        return InductorRunner(artifact.model_path, device, cuda_graphs)


BACKEND = InductorBackend()
