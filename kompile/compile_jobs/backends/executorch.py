"""ExecuTorch backend for CPUs of devices: the source module through `torch.export` and
`to_edge_transform_and_lower` with the XNNPACK partitioner into a `.pte` program.

Steps, each recorded in the artifact's options:
- `torch.export` at a static shape: the signature's opt size for each dynamic dimension (XNNPACK
  programs are planned for fixed sizes; a device app calls them at the size it was exported at).
  The artifact's options say `exportedStatic` with the shape when the signature was dynamic;
- int8: PT2E quantization with ExecuTorch's XNNPACK quantizer (symmetric, per channel unless
  `perChannel=false`), `prepare_pt2e`, calibration on the run's reference inputs (static), or
  activations quantized at run time in the linear layers (quantization dynamic: no calibration;
  XNNPACK has no dynamically quantized convolution), `convert_pt2e`, and the quantized graph
  exported again;
- lowering: the XNNPACK delegate takes every partition it supports; what it cannot take stays on
  ExecuTorch's portable kernels (`delegatedPartitions` counts the delegate calls);
- `load` opens exactly the `.pte` that ships through ExecuTorch's Python runtime and sizes its
  XNNPACK thread pool (one pool per process: the last load sets it).

Not served by KServe: the artifact is for devices, which fetch their class's winner from the store
(docs/operations.md, "Device fleets").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kompile.api.catalog.executorch import ExecuTorchOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    options_of,
)
from kompile.compile_jobs.backends.inductor import (
    EXPORT_ERRORS,
    INPUT_DTYPES,
    describe_export_error,
    flatten_outputs,
    to_tensor,
)
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.export import names_for_outputs
from kompile.compile_jobs.hardware import cpu_description
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.source_module import in_eval_mode
from kompile.compile_jobs.sources import module_label

if TYPE_CHECKING:
    from kompile.api.spec import InputSpec

Array = np.ndarray[Any, Any]


def static_feed(signature: Sequence[InputSpec], calibration: Sequence[Feeds]) -> Feeds:
    """The export example: the first reference input when it has the signature's opt shape, else
    inputs drawn at that shape."""
    from kompile.compile_jobs.inputs import generate_feeds

    shapes = {s.name: tuple(s.concrete_shape()) for s in signature}
    for feed in calibration:
        if all(s.name in feed and tuple(np.shape(feed[s.name])) == shapes[s.name] for s in signature):
            return {s.name: feed[s.name] for s in signature}
    return generate_feeds(signature, 1, seed=0)[0]


def static_example(request: CompileRequest) -> tuple[tuple[torch.Tensor, ...], dict[str, str]]:
    """The export example at the signature's static (opt) shape, and what the artifact records of
    it: precision, input order, and the shapes a dynamic signature was fixed at."""
    signature = request.signature
    args = to_args(static_feed(signature, request.calibration), signature)
    record = {"precision": request.target.precision, "inputOrder": ",".join(s.name for s in signature)}
    if any(s.dynamic_dims for s in signature):
        shapes = zip(signature, args, strict=True)
        record["exportedStatic"] = ";".join(f"{s.name}={list(a.shape)}" for s, a in shapes)
    return args, record


def device_example(
    request: CompileRequest, backend: str, intra_op_threads: int
) -> tuple[tuple[torch.Tensor, ...], dict[str, str]]:
    """What a device backend (a program exported at static shapes from the torch module) starts
    from: `static_example`, with the input dtypes and the thread count recorded; a BackendError
    for an ONNX source."""
    if request.module is None:
        raise BackendError(
            f"target {request.target.name!r}: {backend} compiles from a PyTorch source (an nn.Module, "
            "a torch.export .pt2 or a python:// factory) and this source is ONNX; use backend "
            "onnxruntime for it"
        )
    threads = intra_op_threads or request.threads or available_cores()
    args, record = static_example(request)
    record.update(inputDtypes=",".join(s.dtype for s in request.signature), threads=str(threads))
    return args, record


def to_args(feed: Feeds, signature: Sequence[InputSpec]) -> tuple[torch.Tensor, ...]:
    return tuple(to_tensor(feed[s.name], INPUT_DTYPES[s.dtype], "cpu") for s in signature)


def _float_only(quantizer: Any) -> Any:
    """The XNNPACK quantizer with its annotations kept to float tensors: its global config also
    annotates integer arithmetic (a transformer's mask built from aranges and adds), and a
    quantized index tensor then fails the graph (`tensors used as indices must be long`)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    def is_float(node: Any) -> bool:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        return not isinstance(val, torch.Tensor) or val.is_floating_point()

    class FloatOnly(Quantizer):  # type: ignore[misc]
        def annotate(self, model: Any) -> Any:
            quantizer.annotate(model)
            for node in model.graph.nodes:
                note = node.meta.get("quantization_annotation")
                if note is None:
                    continue
                if not is_float(node):
                    del node.meta["quantization_annotation"]
                    continue
                for arg in [a for a in note.input_qspec_map if not is_float(a)]:
                    del note.input_qspec_map[arg]
            return model

        def validate(self, model: Any) -> None:
            quantizer.validate(model)

    return FloatOnly()


def quantize(
    module: Any,
    args: tuple[torch.Tensor, ...],
    request: CompileRequest,
    opts: ExecuTorchOptions,
    record: dict[str, str],
) -> Any:
    """PT2E int8 with the XNNPACK quantizer; static calibrates on the reference inputs of the
    exported shape."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    dynamic = request.target.quantization == "dynamic"
    if dynamic and not opts.per_channel:
        # XNNPACK leaves per-tensor dynamic linears to portable kernels ExecuTorch does not ship.
        raise BackendError(
            "executorch int8 dynamic needs per-channel weights: remove perChannel=false, or use "
            "quantization static"
        )
    config = get_symmetric_quantization_config(is_per_channel=opts.per_channel, is_dynamic=dynamic)
    # XNNPACK runs dynamically quantized activations in its linear (fully connected) kernels only:
    # dynamic leaves convolutions in float.
    quantizer = (
        XNNPACKQuantizer().set_module_type(torch.nn.Linear, config)
        if dynamic
        else XNNPACKQuantizer().set_global(config)
    )
    shapes = [tuple(a.shape) for a in args]
    samples = [
        f
        for f in request.calibration
        if all(s.name in f for s in request.signature)
        and [tuple(np.shape(f[s.name])) for s in request.signature] == shapes
    ]
    if not dynamic and not samples:
        raise BackendError(
            "executorch int8 static calibrates on reference inputs at the exported shape "
            f"{shapes} and the run has none; give spec.validation a dataset at that shape, or use "
            "quantization dynamic"
        )
    graph = torch.export.export(module, args).module()
    prepared = prepare_pt2e(graph, _float_only(quantizer))
    with torch.no_grad():
        if dynamic:  # scales come at run time; one pass only records the graph's observers
            prepared(*args)
        for feed in [] if dynamic else samples:
            prepared(*to_args(feed, request.signature))
    record.update(
        quantization=f"pt2e-xnnpack-{'dynamic' if dynamic else 'static'}",
        perChannel=str(opts.per_channel).lower(),
        calibrationSamples=str(0 if dynamic else len(samples)),
    )
    converted = convert_pt2e(prepared)
    # The quantizer annotates what it has kernels for and returns the rest float, silently: a model
    # with none of it (dynamic: no Linear) came back whole, the fp32 program labelled int8.
    if not any("quantized_decomposed" in str(n.target) for n in converted.graph.nodes):
        why = (
            "dynamic quantizes linear layers only and the model has none"
            if dynamic
            else "it annotated no operator of the model"
        )
        raise BackendError(
            f"executorch int8 quantized no operator: XNNPACK's quantizer {why}; the program would be "
            "the fp32 one labelled int8. "
            + ("Use quantization static, or build at fp32" if dynamic else "Build this target at fp32")
        )
    return converted


def lower(module: Any, args: tuple[torch.Tensor, ...], out: Path) -> int:
    """Export, lower to XNNPACK and write the program; returns the number of delegated partitions."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(module, args)
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    graph = edge.exported_program().graph
    delegated = sum(1 for n in graph.nodes if n.op == "call_function" and "call_delegate" in str(n.target))
    out.write_bytes(edge.to_executorch().buffer)
    return delegated


def set_pool_threads(threads: int) -> None:
    """XNNPACK's pool in ExecuTorch's runtime: one per process, sized here."""
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    _unsafe_reset_threadpool(threads)


class PteRunner:
    """A `.pte` program run by ExecuTorch's Python runtime; float outputs come back as float32."""

    def __init__(self, path: Path, input_names: list[str], dtypes: list[torch.dtype]) -> None:
        from executorch.runtime import Runtime

        try:
            method = Runtime.get().load_program(path).load_method("forward")
        except (RuntimeError, ValueError, OSError) as err:
            raise BackendError(f"ExecuTorch cannot load {path.name}: {err}; rebuild it") from err
        if method is None:
            raise BackendError(f"{path.name} has no forward method; rebuild it")
        self.path, self.method = path, method
        self.input_names, self._dtypes = input_names, dtypes
        meta = method.metadata
        self.shapes = [tuple(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        count = meta.num_outputs()
        self.output_names: list[str] = names_for_outputs(count)

    def run(self, feeds: Feeds) -> list[Array]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BackendError(f"inputs {missing} missing for {self.path.name}; it takes {self.input_names}")
        shapes = [tuple(np.shape(feeds[n])) for n in self.input_names]
        if shapes != self.shapes:
            raise BackendError(
                f"{self.path.name} was exported at the static shapes {self.shapes} and runs only those, "
                f"not {shapes}"
            )
        args = [to_tensor(feeds[n], dt, "cpu") for n, dt in zip(self.input_names, self._dtypes, strict=True)]
        try:
            out = self.method.execute(args)
        except RuntimeError as err:
            raise BackendError(f"ExecuTorch failed running {self.path.name}: {err}") from err
        return [t.float().numpy() if t.is_floating_point() else t.numpy() for t in flatten_outputs(list(out))]


class ExecuTorchBackend(Backend):
    name = "executorch"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        target = request.target
        opts = options_of(request, ExecuTorchOptions)
        args, record = device_example(request, self.name, opts.intra_op_threads)
        label = module_label(request.module)
        out = request.out_dir / "model.pte"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        # torch and ExecuTorch print graphs and progress: into the build folder's log (quiet.py).
        with output_to(request.out_dir / "compile.log"), torch.no_grad():
            module = in_eval_mode(request.module)
            try:
                torch.export.export(module, args)  # export errors name the construct; lowering's below
            except EXPORT_ERRORS as err:
                raise BackendError(describe_export_error(err, label, "an ExecuTorch program")) from err
            try:
                if target.precision == "int8":
                    module = quantize(module, args, request, opts, record)
                delegated = lower(module, args, out)
            except BackendError:
                raise
            except EXPORT_ERRORS as err:
                first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
                raise BackendError(
                    f"ExecuTorch could not lower {label} at {target.precision} to XNNPACK: {first}; "
                    "try precision fp32, or quantization static"
                ) from err
        record["delegatedPartitions"] = str(delegated)
        return CompiledArtifact(
            backend=self.name,
            model_path=out,
            options=record,
            toolchain={**self.installed_versions(), "cpu": cpu_description()},
        )

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> PteRunner:
        recorded = artifact.options.get("threads", "")
        set_pool_threads(threads or (int(recorded) if recorded.isdigit() else available_cores()))
        names = artifact.options["inputOrder"].split(",")
        dtypes = [INPUT_DTYPES[d] for d in artifact.options["inputDtypes"].split(",")]
        return PteRunner(artifact.model_path, names, dtypes)


BACKEND = ExecuTorchBackend()
