"""Export the source module to ONNX, and compute the eager reference outputs.

The TorchScript-based exporter is the default: measured here, ONNX Runtime ran its ResNet-50 graph
faster than the dynamo exporter's (46 vs 51 ms, DESIGN.md). Tracing silently bakes in Python control
flow that depends on tensor values, so tracer warnings are raised as errors that name the construct.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np

from kompile.api.spec import InputSpec, batch_dim, leading
from kompile.api.vocabulary import DType
from kompile.compile_jobs.inputs import Feed, resize
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.sources import LoadedSource, module_label
from kompile.compile_jobs.triton import TensorSpec
from kompile.compile_jobs.user_code import first_line, where

OPSET = 17


class ExportError(RuntimeError):
    """The source could not be exported; the message names the module and the construct."""


def flatten_outputs(out: Any) -> list[Any]:
    """Output leaves in torch's pytree order (a dict's values as written), the ONNX exporter's:
    the order of the reference and of every runner's outputs."""
    if isinstance(out, dict):
        return [x for v in out.values() for x in flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [x for item in out for x in flatten_outputs(item)]
    return [out]


def to_torch(feed: Feed, signature: Sequence[InputSpec]) -> tuple[Any, ...]:
    import torch

    return tuple(torch.from_numpy(np.asarray(feed[s.name], order="C")) for s in signature)


def eager_outputs(
    module: Any, feeds: Sequence[Feed], signature: Sequence[InputSpec]
) -> list[list[np.ndarray[Any, Any]]]:
    """Run the eager source on each feed: the reference every artifact is held to."""
    import torch

    results: list[list[np.ndarray[Any, Any]]] = []
    with torch.inference_mode():
        for feed in feeds:
            try:
                out = module(*to_torch(feed, signature))
            except Exception as err:  # noqa: BLE001 - the model's own code failed: say where
                from kompile.compile_jobs.source_module import forward_hint

                kind = (
                    ""
                    if isinstance(err, (RuntimeError, TypeError, ValueError))
                    else f"{type(err).__name__}: "
                )
                at = where(err)
                raise ExportError(
                    f"{module_label(module)} failed on inputs shaped "
                    f"{ {k: list(v.shape) for k, v in feed.items()} }: {kind}{first_line(err)}"
                    f"{f' (at {at})' if at else ''}; {_dtype_hint(module, signature)}"
                    f"{dims_hint(signature, feed)}"
                    f"{forward_hint(module, [s.name for s in signature])}"
                    "check spec.inputs (names, dtypes, shapes) against the model's forward()"
                ) from None
            # Integer and boolean outputs (labels, masks) stay so: validation holds them to equality.
            results.append(
                [
                    (t.detach().float() if t.is_floating_point() else t.detach()).cpu().numpy()
                    for t in flatten_outputs(out)
                ]
            )
    return results


def dims_hint(signature: Sequence[InputSpec], feed: Feed) -> str:
    """The dynamic dims (batch aside) at the sizes the failing feed had, and how to set others: a
    guessed size (128 for a dim named like a sequence) can be too small for a model (a convolution
    over 400 audio samples)."""
    sizes: dict[str, int] = {}
    batch = batch_dim(signature)  # also axis 1 of an RNN state: not a size to set
    for spec in signature:
        for dim in spec.dynamic_dims or []:
            if dim.axis > 0 and dim.name != batch and spec.name in feed:
                sizes.setdefault(dim.name, int(feed[spec.name].shape[dim.axis]))
    if not sizes:
        return ""
    at = ", ".join(f"{name}={size}" for name, size in sizes.items())
    first = next(iter(sizes))
    return (
        f"the dynamic dims were {at}: a model that needs another size takes it with `--dim "
        f"{first}=MIN:OPT:MAX`, or real inputs with `--dataset samples.npz` (kompile run or init on "
        "a model file), or in spec.inputs[].dynamicDims; "
    )


def _dtype_hint(module: Any, signature: Sequence[InputSpec]) -> str:
    """Say so when the model's floating weights are not in the dtype its float inputs declare (a
    checkpoint saved after .half()): the usual cause of a dtype mismatch in the first layer."""
    import torch

    weights = (
        {
            str(t.dtype).removeprefix("torch.")
            for t in [*module.parameters(), *module.buffers()]
            if t.is_floating_point()
        }
        if isinstance(module, torch.nn.Module)
        else set()
    )
    declared = {s.dtype for s in signature if s.dtype.startswith(("float", "bfloat"))}
    if len(weights) != 1 or not declared or weights == declared:
        return ""
    (dtype,) = weights
    if dtype not in get_args(DType):  # float64: no dtype kompile feeds would fit it
        return (
            f"the model's weights are {dtype}, which kompile does not compile (serving runtimes run "
            "float32 and lower): give kompile the model after .float(); "
        )
    return (
        f"the model's weights are {dtype} and spec.inputs declares {', '.join(sorted(declared))}: "
        f"set dtype: {dtype} on those inputs, or give kompile the model after .float(); "
    )


def eager_callable(module: Any, feed: Feed, signature: Sequence[InputSpec]) -> Any:
    """A no-argument function running the eager module once on `feed` (for the benchmark)."""
    import torch

    args = to_torch(feed, signature)

    def call() -> Any:
        with torch.inference_mode():
            return module(*args)

    return call


def describe_failure(err: BaseException) -> str:
    """The unexportable construct and where it sits, from a tracer or exporter message."""
    text = _ANSI.sub("", str(err))
    if (summary := _exporter_summary(text)) is not None:
        return summary
    op = re.search(r"operator '([^']+)'", text) or re.search(r"((?:aten|quantized)::[A-Za-z0-9_.]+)", text)
    if op and op.group(1).startswith("quantized::"):
        return (
            f"operator {op.group(1)} has no ONNX conversion: the model was quantized with torch.ao "
            "(quantize_dynamic or prepare/convert), whose kernels no compiler here reads. Give kompile "
            "the float model and add an int8 target: it quantizes per backend and validates against "
            "the float outputs"
        )
    if op:
        return f"operator {op.group(1)} has no ONNX conversion at opset {OPSET}"
    return first_line(err)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch.onnx colours its messages for a terminal
_NO_ONNX_FUNCTION = re.compile(r"No ONNX function found for <OpOverload\(op='([^']+)'")


def _exporter_summary(text: str) -> str | None:
    """torch.onnx's dynamo exporter says which of its steps failed, then next steps for torch's
    developers, and the cause last, under "## Exception summary" (chained causes joined by an
    arrow, the root first): the step and the root cause, or None for another message."""
    if "## Exception summary" not in text:
        return None
    headline = text.split(". ", 1)[0].strip()
    step = re.search(r"step (\d+/\d+)", text)
    summary = text.split("## Exception summary", 1)[1].split("(Refer to the full stack trace", 1)[0]
    causes = [c.strip() for c in summary.split("\u2b06\ufe0f") if c.strip()]
    root = re.sub(r"^<class '(?:[\w.]+\.)?(\w+)'>:\s*", r"\1: ", causes[0]) if causes else "no cause given"
    where = f"torch.onnx {'step ' + step.group(1) if step else 'export'} ({headline})"
    if op := _NO_ONNX_FUNCTION.search(text):
        return (
            f"operator {op.group(1)} has no ONNX conversion ({where}): register one in "
            "torch.onnx.export's custom_translation_table and export the model to ONNX yourself, or "
            "use a backend that compiles the PyTorch model itself (inductor)"
        )
    return f"{where}: {root.splitlines()[0]}"


def example_sizes(signature: Sequence[InputSpec]) -> dict[str, int]:
    """A size per dynamic dim name: opt, at least 2 (export specializes 0 and 1), distinct across
    names where the range allows (dims traced at equal sizes can be unified into one symbol)."""
    sizes: dict[str, int] = {}
    for spec in signature:
        for d in spec.dynamic_dims or []:
            if d.name in sizes or d.max < 2:
                continue
            size = min(max(d.opt, 2, d.min), d.max)
            while size in sizes.values() and size < d.max:
                size += 1
            sizes[d.name] = size
    return sizes


def dynamic_shapes(signature: Sequence[InputSpec]) -> tuple[dict[int, Any] | None, ...] | None:
    """torch.export dynamic_shapes for the positional inputs; one Dim per name, ranges intersected."""
    import torch

    ranges: dict[str, tuple[int, int]] = {}
    for spec in signature:
        for d in spec.dynamic_dims or []:
            low, high = ranges.get(d.name, (d.min, d.max))
            ranges[d.name] = (max(low, d.min), min(high, d.max))
    # A range of one size (or only 0/1) is a static dimension: export would specialize it anyway.
    dims = {n: torch.export.Dim(n, min=lo, max=hi) for n, (lo, hi) in ranges.items() if hi > max(lo, 1)}
    shapes = tuple(
        {d.axis: dims[d.name] for d in spec.dynamic_dims or [] if d.name in dims} or None
        for spec in signature
    )
    return shapes if any(shapes) else None


def names_for_outputs(count: int, module: Any = None, inputs: Sequence[str] = ()) -> list[str]:
    """Serving names of the outputs: what the model's dict or NamedTuple called them (logits,
    pooler_output; source_module.leaf_names), else output / output_<i>. Made safe for every
    server's naming rules, unique, and distinct from the input names (an ONNX output that
    shares an input's name would be that input)."""
    given = getattr(module, "leaf_names", None) if getattr(module, "names_outputs", False) else None
    if not given or len(given) != count:
        given = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    names: list[str] = []
    taken = set(inputs)
    for i, raw in enumerate(given):
        name = re.sub(r"[^A-Za-z0-9_]", "_", raw) or f"output_{i}"
        while name in taken:
            name += "_out"
        taken.add(name)
        names.append(name)
    return names


def torch_io(
    module: Any, signature: Sequence[InputSpec], output_names: Sequence[str]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Serving tensor specs without an ONNX graph: inputs from the signature; outputs from eager
    runs with every dynamic dim at two sizes (an output dim that moves with them is dynamic)."""
    from kompile.compile_jobs.inputs import generate_feeds

    dims = [d for s in signature for d in s.dynamic_dims or []]
    low = {d.name: d.opt for d in dims}
    high = {d.name: d.max if d.max != d.opt else d.min for d in dims}
    a = eager_outputs(module, generate_feeds(signature, 1, 0, low), signature)[0]
    b = eager_outputs(module, generate_feeds(signature, 1, 0, high), signature)[0]
    ins = [TensorSpec(s.name, s.dtype, tuple(s.shape)) for s in signature]
    outs = [
        TensorSpec(
            name, str(x.dtype), tuple(-1 if p != q else p for p, q in zip(x.shape, y.shape, strict=True))
        )
        for name, x, y in zip(output_names, a, b, strict=True)
    ]
    return ins, outs


def export_onnx(
    loaded: LoadedSource,
    signature: Sequence[InputSpec],
    example: Feed,
    out_path: Path,
    note: Callable[[str], None] = lambda _: None,
) -> tuple[Path, list[str]]:
    """Write the fp32 ONNX graph of the source to out_path; returns it and the output names. `note`
    hears of each change made to an ONNX source's working copy, or to how a module is traced."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if loaded.onnx_path is not None:
        return _check_onnx_source(loaded.onnx_path, signature, out_path, note)
    import torch

    module = loaded.module
    names = [s.name for s in signature]
    dynamic_axes: dict[str, dict[int, str]] = {
        s.name: {d.axis: d.name for d in s.dynamic_dims} for s in signature if s.dynamic_dims
    }
    output_names = names_for_outputs(len(eager_outputs(module, [example], signature)[0]), module, names)
    batch_axes = {d.axis: d.name for d in (leading(signature).dynamic_dims or []) if d.axis == 0}
    for name in output_names:
        if batch_axes:
            dynamic_axes[name] = dict(batch_axes)
    label = f"{loaded.label} (from {loaded.uri})"
    if loaded.exported is not None:
        return _export_program(loaded, example, signature, names, output_names, out_path, label, note)
    # Record tracer warnings rather than raising them: raised inside torch's C++ tracer they turn
    # into an opaque SystemError; recorded, they name the construct and its source line.
    with (
        eager_attention(module, note),  # first: its note goes to the reporter, not to export.log
        warnings.catch_warnings(record=True) as caught,
        output_to(out_path.parent / "export.log"),
    ):
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            torch.onnx.export(
                module,
                to_torch(example, signature),
                str(out_path),
                input_names=names,
                output_names=output_names,
                dynamic_axes=dynamic_axes or None,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        except (RuntimeError, TypeError, ValueError, torch.onnx.errors.OnnxExporterError) as err:
            raise ExportError(f"cannot export {label} to ONNX: {describe_failure(err)}") from None
    # Installed libraries (transformers' mask helpers) warn on shape arithmetic that the dynamic
    # axes cover; validation against eager still checks their graph. Value-dependent control flow
    # in the user's own model code is what a trace gets wrong silently: that one is refused.
    tracer = [
        w
        for w in caught
        if issubclass(w.category, torch.jit.TracerWarning) and not _in_installed_package(w.filename)
    ]
    dynamic = sorted({d.name for s in signature for d in s.dynamic_dims or []})
    # A size made a Python int is a constant in the trace: exactly right at static shapes.
    refused = [w for w in tracer if dynamic or _shape_text(w) is None]
    if refused:
        w = refused[0]
        out_path.unlink(missing_ok=True)
        at = f"{Path(w.filename).name}:{w.lineno}"
        size = _shape_text(w)
        if size is not None:
            raise ExportError(
                f"cannot export {label} to ONNX: {at}: int() of a size ({size}) is a Python number, "
                f"a constant in the graph, so the dynamic dim{'s' if len(dynamic) > 1 else ''} "
                f"{', '.join(dynamic)} would be fixed at the example's size. Use the size without "
                f"int() ({size}), x.flatten(1) or x.reshape(x.shape[0], -1), or make the input static."
            )
        raise ExportError(
            f"cannot export {label} to ONNX: {at}: {first_line(Exception(w.message))} "
            "This is Python control flow or a Python value computed from a tensor, which a graph cannot "
            "hold. Rewrite it with tensor ops (torch.where) or make it independent of input values."
        )
    return out_path, output_names


@contextlib.contextmanager
def eager_attention(module: Any, note: Callable[[str], None]) -> Iterator[None]:
    """Hugging Face models on SDPA attention (transformers' default), traced with their eager
    attention instead, the same math: the TorchScript exporter writes SDPA as a pattern no ONNX
    Runtime fusion matches, and eager attention as the one its Attention op fuses (all-MiniLM-L6-v2,
    batch 1, sequence 128: 19.6 ms unfused against 18.2 ms fused). Put back after the trace."""
    configs: dict[int, Any] = {}
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa":
            configs[id(config)] = config
    for config in configs.values():
        config._attn_implementation = "eager"
    if configs:
        note("traced with eager attention (the same math as SDPA, in the pattern ONNX Runtime fuses)")
    try:
        yield
    finally:
        for config in configs.values():
            config._attn_implementation = "sdpa"


def _shape_text(w: warnings.WarningMessage) -> str | None:
    """The size expression (h.shape[0], x.size(1)) a tracer warning's line turns into a Python
    number, None when the line converts anything else (a sum, an item(): values, not sizes)."""
    if "Python integer" not in str(w.message) and "Python index" not in str(w.message):
        return None
    line = linecache.getline(w.filename, w.lineno)
    if re.search(r"\.(item|sum|mean|max|min|any|all|argmax|nonzero|tolist)\(", line):
        return None
    size = re.search(r"[\w.]+\.(?:shape\[[^\]]+\]|size\([^)]*\))", line)
    return size.group(0) if size else None


def _in_installed_package(filename: str) -> bool:
    parts = Path(filename).parts
    return "site-packages" in parts or "dist-packages" in parts


def _export_program(
    loaded: LoadedSource,
    example: Feed,
    signature: Sequence[InputSpec],
    names: list[str],
    output_names: list[str],
    out_path: Path,
    label: str,
    note: Callable[[str], None],
) -> tuple[Path, list[str]]:
    """A torch.export archive already is a graph with its dynamic shapes: the dynamo exporter takes it
    as it is (re-tracing its GraphModule with TorchScript is not supported). Where it fails on the
    program as saved, the program's module is exported again with spec.inputs' dims, as inductor
    compiles it: torch 2.15 fails on a loaded program whose dims are multiples (h = 32*_h, what
    torch.export suggests for a strided model) and takes the same module re-exported."""
    import torch

    errors = (RuntimeError, TypeError, ValueError, torch.onnx.errors.OnnxExporterError)
    try:
        _program_to_onnx(loaded.exported, to_torch(example, signature), names, output_names, out_path)
        return out_path, output_names
    except errors as err:
        saved = describe_failure(err)
    try:
        shapes: tuple[Any, ...] | None = dynamic_shapes(signature)
        if shapes and getattr(loaded.module, "wraps_source", False):
            shapes = (shapes,)  # source_module.SourceModule takes its inputs as *tensors
        # At sizes of 2 or more: torch.export makes a dim traced at 1 a constant.
        args = to_torch(resize(example, signature, example_sizes(signature)), signature)
        with output_to(out_path.parent / "export.log"), torch.no_grad():
            program = torch.export.export(loaded.module, args, dynamic_shapes=shapes)
        _program_to_onnx(program, args, names, output_names, out_path)
    except (*errors, torch._dynamo.exc.UserError) as err:
        raise ExportError(
            f"cannot export {label} to ONNX: {saved} (exported again with spec.inputs' dims: "
            f"{describe_failure(err)})"
        ) from None
    note(f"{label}: torch.onnx failed on the program as saved ({saved}); exported it again with its dims")
    return out_path, output_names


def _program_to_onnx(
    program: Any, args: tuple[Any, ...], names: list[str], output_names: list[str], out_path: Path
) -> None:
    import torch

    written, dropped = _program_output_names(program, output_names)
    # The dynamo exporter prints progress on stdout, which belongs to `--json`; its warnings about
    # the outputs dropped below (a None "is ignored") are kompile's to handle, not the user's.
    with contextlib.redirect_stdout(sys.stderr), _exporter_warnings_quiet():
        torch.onnx.export(
            program,
            args,
            str(out_path),
            input_names=names,
            output_names=written,
            dynamo=True,
            external_data=False,
            verbose=False,  # its "[torch.onnx] ... ✅" lines: the pipeline says "exporting" once
        )
    if dropped:
        _drop_outputs(out_path, dropped)


def _program_output_names(program: Any, output_names: list[str]) -> tuple[list[str], set[str]]:
    """Names for each output the exporter writes, and those of the ones to drop after: a size or
    flag the program returns (a SymInt) is written as an output, though the eager reference, which
    keeps tensors only, has none; a None or constant is written as none."""
    from torch.export.graph_signature import ConstantArgument, OutputKind, TensorArgument

    user = [s.arg for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    tensors = iter(output_names)
    written: list[str] = []
    dropped: set[str] = set()
    for i, arg in enumerate(a for a in user if not isinstance(a, ConstantArgument)):
        if isinstance(arg, TensorArgument):
            written.append(next(tensors, f"output_{i}"))
        else:
            written.append(f"kompile_dropped_{i}")
            dropped.add(written[-1])
    return written, dropped


def _drop_outputs(path: Path, names: set[str]) -> None:
    import onnx

    model = onnx.load(str(path))
    kept = [o for o in model.graph.output if o.name not in names]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    onnx.save(model, str(path))


@contextlib.contextmanager
def _exporter_warnings_quiet() -> Iterator[None]:
    """The exporter's log, and torch's notices of its own deprecations (an LSTM's unrolled program
    printed ten `_check_is_size will be removed` FutureWarnings from torch's generated code): no
    user code runs while a traced program is exported, so none of them is the user's to act on."""
    import logging

    exporter = logging.getLogger("torch.onnx")
    level = exporter.level
    exporter.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        exporter.setLevel(level)


def _check_onnx_source(
    src: Path, signature: Sequence[InputSpec], out_path: Path, note: Callable[[str], None]
) -> tuple[Path, list[str]]:
    import onnx

    from kompile.compile_jobs.onnx_upgrade import in_order, unsorted, upgrade
    from kompile.compile_jobs.source_files import SourceError, check_onnx, read_onnx_graph

    def invalid(err: Exception) -> ExportError:
        msg = (
            str(err) if isinstance(err, SourceError) else f"{src}: not a valid ONNX model: {first_line(err)}"
        )
        return ExportError(msg)

    reordered = False
    try:
        model = read_onnx_graph(src)
        external = check_onnx(src, model)
        # By path, without loading the weights: the checker reads external data itself, and a model
        # over 2 GB cannot be checked as one in-memory protobuf.
        onnx.checker.check_model(str(src))
    except onnx.checker.ValidationError as err:
        if not unsorted(err):
            raise invalid(err) from None
        model, reordered = in_order(model), True  # checked below, once written in order
    except (OSError, ValueError) as err:
        raise invalid(err) from None
    graph_inputs = [
        i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
    ]
    declared = [s.name for s in signature]
    if graph_inputs != declared:
        raise ExportError(
            f"{src}: the model's inputs are {graph_inputs}, spec.inputs declares {declared}; "
            "make spec.inputs list the same names in the same order"
        )
    model, changes = upgrade(model)
    if reordered:
        changes.insert(
            0,
            "nodes put in topological order (a float16 converter's keep_io_types leaves its input "
            "Casts last; onnx's checker refuses that order)",
        )
    if changes:  # external weights stay references: written beside the graph below
        onnx.save_model(model, str(out_path))
        for change in changes:
            note(f"{src.name}: {change}")
    else:
        shutil.copyfile(src, out_path)
    # The weights travel with the graph, at the same relative locations, so that every backend
    # reading out_path finds them beside it.
    for name in external:
        dest = out_path.parent / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.parent / name, dest)
    if reordered:
        try:
            onnx.checker.check_model(str(out_path))
        except onnx.checker.ValidationError as err:
            raise invalid(err) from None
    return out_path, [o.name for o in model.graph.output]
