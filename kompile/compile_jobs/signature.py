"""A model file's input signature, read from the file itself: the ONNX graph's inputs, or the user
inputs of a torch.export program. Dynamic dimensions come back with their range: the program's own
(torch.export records each symbol's bounds), else a guess a user can override (`--dim`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kompile.compile_jobs import source_files
from kompile.compile_jobs.source_files import SourceError

# ONNX TensorProto element types and torch dtypes kompile can generate reference inputs for.
_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32", 2: "uint8", 9: "bool"}
_TORCH_DTYPES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int64": "int64",
    "torch.int32": "int32",
    "torch.uint8": "uint8",
    "torch.bool": "bool",
}
_SEQUENCE_LIKE = re.compile(r"seq|len|time|token|step|frame", re.IGNORECASE)
_SPATIAL_LIKE = re.compile(r"height|width|^[hw]$", re.IGNORECASE)


@dataclass
class Dim:
    """A dynamic dimension: its name (shared names share a size) and range, or None where unknown."""

    name: str
    min: int | None = None
    max: int | None = None


@dataclass
class Input:
    name: str
    dtype: str
    shape: list[int | Dim]
    low: int | None = None
    high: int | None = None
    """Integer inputs: the reference values' range [low, high) where the model says (a vocabulary)."""


def default_range(
    name: str, axis: int, spatial: bool = False, audio: bool = False, video: str | None = None
) -> tuple[int, int, int]:
    """(min, opt, max) where the model says nothing: a batch of 1 to 32, sequences up to 512 tokens
    optimized for 128, an image's height and width 32 to 512 optimized for 224 (timed at an image
    size; 32 the least a network downsampling 32x runs at), a waveform 400 samples (a 25 ms window
    at 16 kHz, what wav2vec2's first layers span) to 10 s optimized for 1 s, other dims up to 256
    optimized for 16. A video clip (`video` names the axis: _video_axis) is 1 to 32 frames
    optimized for 16, what video models are trained on, in batches up to 8: a clip is 16 images,
    and at the sequence guess (128 frames) r3d_18 took 9 s an inference on 2 cores, while 32 clips
    of 16 frames at 224x224 took 5.9 GB in one ONNX Runtime session (three runtimes holding that
    at once were killed for memory on a 24 GiB machine)."""
    if video == "batch":
        return 1, 1, 8
    if video == "frames":
        return 1, 16, 32
    if axis == 0:
        return 1, 1, 32
    if audio:
        return 400, 16000, 160000
    if spatial or _SPATIAL_LIKE.search(name):
        return 32, 224, 512
    if _SEQUENCE_LIKE.search(name):
        return 1, 128, 512
    return 1, 16, 256


def _image_axis(item: Input, axis: int) -> bool:
    """Height or width of an image batch: a 4-D input of floats or bytes with 1 or 3 channels,
    first (NCHW: axes 2 and 3) or last (NHWC: axes 1 and 2)."""
    shape = item.shape
    if len(shape) != 4 or item.dtype.startswith("int") or item.dtype == "bool":
        return False
    return (shape[1] in (1, 3) and axis in (2, 3)) or (shape[3] in (1, 3) and axis in (1, 2))


def _video_axis(item: Input, axis: int) -> str | None:
    """What that axis of a video clip batch holds ("batch", "frames" or "spatial"): a 5-D input of
    floats or bytes with 1 or 3 channels on axis 1 (NCTHW, torchvision's video models), 2 (NTCHW,
    Hugging Face's VideoMAE) or 4 (NTHWC); None for any other axis or input."""
    shape = item.shape
    if len(shape) != 5 or item.dtype.startswith("int") or item.dtype == "bool":
        return None
    for channels, frames, spatial in ((1, 2, (3, 4)), (2, 1, (3, 4)), (4, 1, (2, 3))):
        if shape[channels] in (1, 3):
            kinds = {0: "batch", frames: "frames", spatial[0]: "spatial", spatial[1]: "spatial"}
            return kinds.get(axis)
    return None


_AUDIO_LIKE = re.compile(r"input_values|audio|wav|speech|signal", re.IGNORECASE)


def _audio_axis(item: Input, axis: int) -> bool:
    """The samples of a waveform batch: the last axis of a 2-D float input named like audio
    (input_values is what Hugging Face's audio models take)."""
    floats = item.dtype.startswith(("float", "bfloat"))
    return floats and len(item.shape) == 2 and axis == 1 and bool(_AUDIO_LIKE.search(item.name))


# Dim names a converter made up, not a person: tf2onnx's unk__12, torch's exporter's s0 / s77.
_GENERATED_DIM = re.compile(r"^(unk__\d+|s\d+)$")


def _dim_name(raw: str, fallback: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw).strip("_")
    return name if name and not name[0].isdigit() else fallback


def read_signature(path: Path, fmt: str) -> list[Input]:
    """The inputs of an .onnx or .pt2 file, in call order."""
    if fmt == "onnx":
        return _declarable(path, _onnx_inputs(path))
    if fmt == "pt2":
        return _declarable(path, _pt2_inputs(path))
    if fmt == "huggingface":
        return _folder_inputs(path)
    raise SourceError(
        f"{path}: kompile reads signatures from .onnx and .pt2 files and Hugging Face model folders; "
        "write spec.inputs by hand"
    )


def _declarable(path: Path, inputs: list[Input]) -> list[Input]:
    """`inputs`, or a SourceError for the first that spec.inputs cannot declare: a name it cannot
    hold."""
    from kompile.api.spec import INPUT_NAME_PATTERN

    for item in inputs:
        if not re.fullmatch(INPUT_NAME_PATTERN, item.name):
            raise SourceError(
                f"{path}: input {item.name!r} has a name kompile cannot carry (it takes letters, digits "
                "and _ . : / -): rename it where the model is exported (torch.onnx.export's "
                "input_names) or in the graph (onnx.utils, onnx-graphsurgeon)"
            )
    return inputs


def _folder_inputs(path: Path) -> list[Input]:
    from kompile.compile_jobs import huggingface

    out: list[Input] = []
    for doc in huggingface.signature(path):
        # A dim is (name, max) or (name, max, min).
        shape = [
            s if isinstance(s, int) else Dim(s[0], s[2] if len(s) > 2 else None, s[1]) for s in doc["shape"]
        ]
        out.append(Input(doc["name"], doc["dtype"], shape, doc.get("low"), doc.get("high")))
    return out


def _onnx_inputs(path: Path) -> list[Input]:

    model = source_files.read_onnx_graph(path)
    source_files.check_onnx(path, model)
    weights = {t.name for t in model.graph.initializer}
    generated: dict[str, str] = {}
    out: list[Input] = []
    for vi in model.graph.input:
        if vi.name in weights:
            continue
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":  # a sequence or map (ONNX-ML), or no type at all
            raise SourceError(
                f"{path}: input {vi.name!r} is {kind.removesuffix('_type') if kind else 'untyped'}, not a "
                "tensor: kompile feeds tensors"
            )
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise SourceError(
                f"{path}: input {vi.name!r} has no shape in the graph (its rank is unknown): write its "
                "shape in spec.inputs of a manifest (examples/small-cnn.yaml is one)"
            )
        dtype = _ONNX_DTYPES.get(tt.elem_type)
        if dtype is None:
            import onnx

            try:
                named = onnx.TensorProto.DataType.Name(tt.elem_type).lower()
                named = named.replace("double", "double (float64)")
            except ValueError:
                named = f"element type {tt.elem_type}"
            raise SourceError(_unfed(path, vi.name, named))
        shape: list[int | Dim] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
            else:
                batch_like = axis == 0 or _state_batch_axis(vi.name, list(tt.shape.dim), axis)
                fallback = "batch" if batch_like else f"{_dim_name(vi.name, 'input')}_dim{axis}"
                if not d.dim_param:
                    shape.append(Dim(fallback))
                elif _GENERATED_DIM.match(d.dim_param):  # one readable name per symbol: inputs stay tied
                    if d.dim_param not in generated and fallback in generated.values():
                        fallback = f"{_dim_name(vi.name, 'input')}_dim{axis}"  # another symbol is batch
                    shape.append(Dim(generated.setdefault(d.dim_param, fallback)))
                else:
                    shape.append(Dim(_dim_name(d.dim_param, fallback)))
        vocab = _onnx_vocabulary(model.graph, vi.name) if dtype.startswith("int") else None
        out.append(Input(vi.name, dtype, shape, *((0, vocab) if vocab else (None, None))))
    return out


# An RNN's carried state: LSTM/GRU h and c, "state" (Silero VAD), "hidden".
_STATE_LIKE = re.compile(r"state|hidden|^[hc]0?$|^[hc]_?in$", re.IGNORECASE)


def _state_batch_axis(name: str, dims: list[Any], axis: int) -> bool:
    """Axis 1 of an RNN state [layers, batch, hidden] left unnamed in the graph (Silero VAD's
    [2, ?, 128]): the batch, as ONNX's LSTM and GRU lay their states out. Only where the layers and
    hidden axes are fixed and the input is named as a state."""
    fixed = [d.HasField("dim_value") and d.dim_value > 0 for d in dims]
    return axis == 1 and len(dims) == 3 and fixed[0] and fixed[2] and bool(_STATE_LIKE.search(name))


# Ops between an integer input and the embedding lookup that leave its values as they are.
_VALUE_KEEPING = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def _onnx_vocabulary(graph: Any, name: str) -> int | None:
    """The rows of the embedding table an integer input indexes (a Gather on axis 0 of a weight,
    perhaps after a Cast): its token ids must stay below that."""
    tables = {t.name: list(t.dims) for t in graph.initializer}
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in graph.node:
            if current not in node.input:
                continue
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if node.op_type == "Gather" and list(node.input)[1:2] == [current] and axis == 0:
                dims = tables.get(node.input[0])
                if dims:
                    return int(dims[0])
            elif node.op_type in _VALUE_KEEPING and node.input[0] == current:
                frontier += [o for o in node.output if o not in seen]
    return None


def _pt2_inputs(path: Path) -> list[Input]:
    import torch

    source_files.check(path, "pt2")
    source_files.check_pt2_schema(path)
    with source_files.quiet_torch_loading() as logged:
        try:
            program = torch.export.load(str(path))
        except (RuntimeError, ValueError, OSError) as err:
            raise SourceError(
                source_files.pt2_load_failure(path, err, logged)
                or f"{path}: cannot be loaded as a torch.export archive: {err}"
            ) from None
    ranges: dict[str, Any] = {str(k): v for k, v in program.range_constraints.items()}
    names: dict[str, str] = {}
    user = set(program.graph_signature.user_inputs)
    out: list[Input] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        value = node.meta.get("val")
        dtype = _TORCH_DTYPES.get(str(getattr(value, "dtype", "")))
        if value is None or not hasattr(value, "dtype"):
            raise SourceError(f"{path}: input {node.name!r} is not a tensor kompile can feed ({value!r})")
        if dtype is None:
            raise SourceError(_unfed(path, node.name, str(value.dtype).removeprefix("torch.")))
        shape: list[int | Dim] = []
        for axis, size in enumerate(value.shape):
            if isinstance(size, int):
                shape.append(size)
                continue
            symbol = str(size.node.expr)
            name = names.setdefault(
                symbol, "batch" if axis == 0 and "batch" not in names.values() else f"{node.name}_dim{axis}"
            )
            bounds = ranges.get(symbol)
            low, high = (int(bounds.lower), bounds.upper) if bounds is not None else (1, None)
            shape.append(Dim(name, max(1, low), int(high) if high is not None and high.is_finite else None))
        vocab = _pt2_vocabulary(node) if dtype.startswith("int") else None
        out.append(Input(node.name, dtype, shape, *((0, vocab) if vocab else (None, None))))
    return out


def _pt2_vocabulary(node: Any) -> int | None:
    """The rows of the embedding table an integer input indexes (aten.embedding's weight)."""
    for user in node.users:
        if "embedding" in str(user.target) and len(user.args) > 1 and user.args[1] is node:
            value = getattr(user.args[0], "meta", {}).get("val")
            if value is not None and len(value.shape) == 2 and isinstance(value.shape[0], int):
                return int(value.shape[0])
    return None


def _unfed(path: Path, name: str, dtype: str) -> str:
    """An input of a dtype kompile cannot feed, with what it feeds and what to do."""
    fix = (
        "convert the model to float32 (model.float(), and float32 example inputs) and export it again"
        if dtype.startswith(("double", "float64"))
        else "export the model with inputs of one of those (cast inside forward() where it needs another)"
    )
    feeds = ", ".join(sorted(set(_TORCH_DTYPES.values())))
    return f"{path}: input {name!r} is {dtype}, which kompile cannot feed (it feeds {feeds}): {fix}"


def token_range(name: str, vocab: int = 100) -> tuple[int, int]:
    """[low, high) for an integer input the model says nothing of: what a tokenizer writes for the
    usual names (a mask of ones, token types of zeros), else ids in the vocabulary (a small one
    when it is unknown)."""
    lowered = name.lower()
    if lowered.endswith("mask"):
        return 1, 2
    if lowered.endswith(("type_ids", "segment_ids")):
        return 0, 1
    return 0, vocab


def _guessed(item: Input, axis: int, size: Dim) -> tuple[int, int, int]:
    """(min, opt, max) of one dynamic dim: the model's own bounds, else the default guess."""
    video = _video_axis(item, axis)
    spatial = _image_axis(item, axis) or video == "spatial"
    lo, opt, hi = default_range(size.name, axis, spatial, _audio_axis(item, axis), video)
    lo = max(lo, size.min or lo)
    hi = size.max if size.max is not None else hi
    if lo > hi:  # the model's bound is below the guess's least: its own range
        lo = min(size.min or 1, hi)
    return lo, min(max(opt, lo), hi), hi


def input_specs(inputs: list[Input], overrides: dict[str, tuple[int, int, int]]) -> list[dict[str, Any]]:
    """spec.inputs entries (wire form): each dynamic dim with its range, an override by name first,
    then the model's own bounds, then the default guess. A name several inputs share gets one
    range: the guess where it is an axis 0 (the batch of an RNN's tokens, not of its state
    [layers, batch, hidden]), else where it is first."""
    ranges: dict[str, tuple[int, int, int]] = {}
    for axis0 in (True, False):
        for item in inputs:
            for axis, size in enumerate(item.shape):
                if isinstance(size, Dim) and (axis == 0) == axis0 and size.name not in ranges:
                    ranges[size.name] = overrides.get(size.name) or _guessed(item, axis, size)
    docs: list[dict[str, Any]] = []
    for item in inputs:
        dims = []
        for axis, size in enumerate(item.shape):
            if isinstance(size, Dim):
                lo, opt, hi = ranges[size.name]
                dims.append({"axis": axis, "name": size.name, "min": lo, "opt": opt, "max": hi})
        doc: dict[str, Any] = {
            "name": item.name,
            "dtype": item.dtype,
            "shape": [-1 if isinstance(s, Dim) else s for s in item.shape],
        }
        if dims:
            doc["dynamicDims"] = dims
        if item.low is not None and item.high is not None:
            doc |= {"low": item.low, "high": item.high}
        elif item.dtype == "uint8":  # image bytes: the whole range
            doc |= {"low": 0, "high": 256}
        elif item.dtype in ("int64", "int32"):
            doc |= dict(zip(("low", "high"), token_range(item.name), strict=True))
        docs.append(doc)
    return docs
