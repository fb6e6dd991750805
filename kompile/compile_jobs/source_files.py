"""What a model file holds, told from its bytes before a loader sees it: a wrong, empty, truncated or
mislabelled file becomes a SourceError that names the file, what kompile expected and what it found,
with what to do about it, instead of a loader's traceback.

Formats: ONNX (a protobuf ModelProto), a torch.export archive (.pt2: a zip with `archive_format`),
TorchScript (a zip with `constants.pkl` and `code/`), and what torch.save writes (a zip with
`data.pkl` only: a state_dict or a pickled object, neither of which carries loadable model code).
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickletools
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kompile.compile_jobs.user_code import first_line


class SourceError(ValueError):
    """The source cannot be fetched or loaded; the message says what to change."""


EXPECTED = {
    "onnx": "an ONNX model",
    "pt2": "a torch.export archive (.pt2, written by torch.export.save)",
    "torchscript": "TorchScript (written by torch.jit.save)",
}
FOUND = {
    "onnx": "an ONNX model",
    "pt2": "a torch.export archive (.pt2)",
    "torchscript": "TorchScript",
    "zip": "a zip archive that is no PyTorch format kompile knows",
}
_RENAME = {
    "onnx": "name it .onnx or set spec.source.format: onnx",
    "pt2": "name it .pt2 or set spec.source.format: pt2",
    "torchscript": "name it .pt or set spec.source.format: torchscript",
}
EXPORT_HINT = (
    "export the model instead: torch.export.save(torch.export.export(model, example_inputs), "
    "'model.pt2'), or point spec.source.uri at python://your_module:factory, a function that builds "
    "the model (and loads these weights)"
)


def json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object, {} where the file is missing, unreadable or holds no object: the
    optional side files of a model folder (preprocessor_config.json, sentence_bert_config.json)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _zip_members(path: Path) -> set[str] | None:
    """Member names without the archive's top folder, or None when the file is no zip."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1] if "/" in n else n for n in z.namelist()}


def sniff(path: Path) -> str:
    """empty, pt2, torchscript, torch.save, zip, onnx, or unknown."""
    if path.stat().st_size == 0:
        return "empty"
    members = _zip_members(path)
    if members is not None:
        if "archive_format" in members:
            return "pt2"
        if "constants.pkl" in members or any(m.startswith("code/") for m in members):
            return "torchscript"
        return "torch.save" if "data.pkl" in members else "zip"
    with path.open("rb") as f:
        head = f.read(1)
    # An ONNX ModelProto starts with field 1 (ir_version, a varint): tag byte 0x08.
    return "onnx" if head == b"\x08" else "unknown"


def check(path: Path, fmt: str) -> None:
    """Raise SourceError unless `path` holds what `fmt` (onnx, pt2, torchscript) expects."""
    kind = sniff(path)
    expected = EXPECTED[fmt]
    if kind == "empty":
        raise SourceError(f"{path}: is empty (0 bytes); expected {expected}")
    if kind == fmt:
        return
    if kind == "torch.save":
        raise SourceError(f"{path}: expected {expected}, found {_torch_save_content(path)}: {EXPORT_HINT}")
    if kind in _RENAME:
        raise SourceError(f"{path}: expected {expected}, but it holds {FOUND[kind]}: {_RENAME[kind]}")
    if fmt == "onnx":
        found = FOUND.get(kind, _bytes_found(path))
        raise SourceError(f"{path}: expected {expected}, found {found}")
    if kind == "zip":
        raise SourceError(f"{path}: expected {expected}, found {FOUND['zip']}")
    raise SourceError(f"{path}: expected {expected}, but it is not a zip archive: {_bytes_found(path)}")


def unreadable_model_hint(path: Path) -> str | None:
    """What a model file that `kompile init`/`run` cannot read the inputs of holds, and what to do
    instead (None when it is none of the formats kompile knows): the .pt files users have are
    most often weights or a pickle, whose model code kompile never runs."""
    try:
        kind = sniff(path) if path.is_file() else "absent"
    except (OSError, zipfile.BadZipFile):
        return None  # the caller's own message stands
    if kind == "torch.save":
        return f"{path}: holds {_torch_save_content(path)}: {EXPORT_HINT}"
    if kind == "torchscript":
        named = "" if path.suffix.lower() in (".pt", ".pth", ".ts") else ", format: torchscript"
        return (
            f"{path}: TorchScript, whose input shapes kompile cannot read: write a manifest with "
            f"spec.source.uri: {path.name}{named} and its spec.inputs (examples/small-cnn.yaml is one), or "
            "export the model to a .pt2 (torch.export.save), whose inputs `kompile init` reads"
        )
    if kind in _RENAME and path.suffix.lower() not in (".onnx", ".pt2"):
        return f"{path}: holds {FOUND[kind]}: name it .{'onnx' if kind == 'onnx' else 'pt2'}"
    return None


def _bytes_found(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(16)
    return f"{path.stat().st_size} bytes of unrecognised data starting {head!r}"


def _torch_save_content(path: Path) -> str:
    """A state_dict (with its size) or a pickled object (with its class, read without unpickling)."""
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, OSError, EOFError, AttributeError, ImportError):
        obj = None  # weights_only refuses code: a pickled module or other object
    if _is_state_dict(obj):
        return f"a state_dict ({len(obj)} tensors saved with torch.save): weights without the model's code"
    held = [k for k, v in obj.items() if _is_state_dict(v)] if isinstance(obj, dict) else []
    if held:
        # The layout PyTorch's tutorials save: the state_dict beside the epoch, optimizer, loss.
        keys = ", ".join(repr(k) for k in held)
        return (
            f"a training checkpoint (a dict with {len(obj)} entries) whose state_dict is under {keys}: "
            "weights without the model's code"
        )
    cls = _first_class(path)
    what = f" ({cls})" if cls else ""
    return f"a pickled Python object{what} saved with torch.save, which kompile does not unpickle"


def _is_state_dict(obj: object) -> bool:
    import torch

    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _first_class(path: Path) -> str | None:
    """The first class a torch.save pickle names (its top object), read from the opcodes."""
    with zipfile.ZipFile(path) as z:
        name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
        data = z.read(name) if name else b""
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                return arg.replace(" ", ".")
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") and isinstance(arg, str):
                strings.append(arg)
            if op.name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
    except ValueError:
        return None
    return None


# -- ONNX -------------------------------------------------------------------------------------------


def _onnx_tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph holds: its initializers and the constants in node attributes, subgraphs
    (If, Loop, Scan bodies) included, since any of them may keep its bytes in external data."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _onnx_tensors(attr.g)
            for sub in attr.graphs:
                yield from _onnx_tensors(sub)


def onnx_external_files(model: Any) -> list[str]:
    """The external data files a ModelProto (loaded without them) names, relative to its folder."""
    from onnx.external_data_helper import uses_external_data

    return sorted(
        {
            entry.value
            for tensor in _onnx_tensors(model.graph)
            if uses_external_data(tensor)
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )


# Operators of a graph someone quantized already (QDQ pairs, QOperator and integer kernels, 4-bit
# weight-only MatMuls): another int8 pass would quantize it twice.
_QUANTIZED_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "MatMulNBits",
    "QGemm",
    "QAttention",
    "MatMulIntegerToFloat",
}


def is_quantized_op(op: str) -> bool:
    """Whether an ONNX op type is one only a quantized graph holds."""
    return op in _QUANTIZED_OPS or op.startswith(("QLinear", "DynamicQuantize")) or op.endswith("Integer")


def quantized_ops(model: Any) -> str:
    """The quantized operators of a ModelProto's main graph, counted by type ("6 QuantizeLinear,
    6 DequantizeLinear"), or "" for a float model."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if is_quantized_op(node.op_type):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read_onnx_graph(path: Path) -> Any:
    """The ModelProto without its external data; a file that is no ONNX model is a SourceError."""
    import onnx
    from google.protobuf.message import DecodeError

    check(path, "onnx")
    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError) as err:
        raise SourceError(
            f"{path}: expected {EXPECTED['onnx']}, found {path.stat().st_size} bytes that cannot be "
            f"parsed as one (truncated or corrupt?): {first_line(err)}"
        ) from None


def external_files(path: Path, model: Any) -> list[str]:
    """The external data files of the graph at `path` (parsed as `model`), relative to its folder;
    a location outside that folder is a SourceError (nothing is ever read or fetched there)."""
    files = onnx_external_files(model)
    outside = [f for f in files if Path(f).is_absolute() or ".." in Path(f).parts]
    if outside:
        raise SourceError(
            f"{path}: its external data location(s) {outside} point outside the model's folder, which "
            "ONNX Runtime refuses: save the model with locations relative to it "
            "(onnx.save_model(..., save_as_external_data=True, location='model.onnx.data'))"
        )
    return files


def check_beside(path: Path, files: list[str]) -> None:
    """Each external data file is there, beside the graph."""
    missing = [f for f in files if not (path.parent / f).is_file()]
    if missing:
        raise SourceError(
            f"{path}: its weights are in external data file(s) {missing} that are not beside it in "
            f"{path.parent}: copy them next to the .onnx file (a model over 2 GB keeps its weights "
            "outside the protobuf)"
        )


def _kind(type_proto: Any) -> str:
    """What an ONNX value type is, in words ("a sequence of maps")."""
    field = type_proto.WhichOneof("value")
    if field == "sequence_type":
        return f"a sequence of {_kind(type_proto.sequence_type.elem_type).removeprefix('a ')}s"
    if field == "optional_type":
        return f"an optional {_kind(type_proto.optional_type.elem_type).removeprefix('a ')}"
    return {"map_type": "a map", "sparse_tensor_type": "a sparse tensor"}.get(field or "", "a tensor")


_ONNX_STRING = 8  # TensorProto.STRING


def check_tensor_io(path: Path, model: Any) -> None:
    """Every input and output of the graph is a (dense) tensor, what every backend, the validation
    and the Triton layout take; a classifier from skl2onnx ends in a ZipMap, a sequence of maps."""
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            kind = value.type.WhichOneof("value")
            if kind == "tensor_type" and value.type.tensor_type.elem_type == _ONNX_STRING:
                raise SourceError(
                    f"{path}: {role} {value.name!r} is a tensor of strings (class labels?); kompile "
                    "validates numeric tensors: train the classifier on integer labels (0..n-1) and map "
                    "them to names where the predictions are used"
                )
            if kind in (None, "tensor_type"):
                continue
            zipmap = any(n.op_type == "ZipMap" and value.name in n.output for n in model.graph.node)
            hint = (
                "it is a ZipMap node's, as skl2onnx writes classifiers by default: convert the model "
                "again with the option zipmap False (options={type(model): {'zipmap': False}}), which "
                "gives the probabilities as a tensor"
                if zipmap
                else "kompile compiles graphs whose inputs and outputs are tensors: export it with "
                "tensors there"
            )
            raise SourceError(f"{path}: {role} {value.name!r} is {_kind(value.type)}, not a tensor; {hint}")


def read_onnx_source(path: Path) -> tuple[Any, str]:
    """An ONNX source's graph (without its external data), checked to take and give tensors, and its
    quantized operators (quantized_ops)."""
    model = read_onnx_graph(path)
    check_tensor_io(path, model)
    return model, quantized_ops(model)


def check_onnx(path: Path, model: Any | None = None) -> list[str]:
    """Parse the graph (without its weights' external data) unless given, and check every external
    data file; returns their locations, relative to the model's folder."""
    files = external_files(path, read_onnx_graph(path) if model is None else model)
    check_beside(path, files)
    return files


# -- torch.export archives --------------------------------------------------------------------------


def check_pt2_schema(path: Path) -> None:
    """A .pt2 whose export schema this torch cannot read names the torch that wrote it."""
    from torch._export.serde.schema import SCHEMA_VERSION

    with zipfile.ZipFile(path) as z:
        name = next((n for n in z.namelist() if n.endswith(".json") and "/models/" in n), None)
        try:
            doc: dict[str, Any] = json.loads(z.read(name)) if name else {}
        except ValueError:
            return  # the loader reports what it finds
    version = doc.get("schema_version") or {}
    major = version.get("major")
    if isinstance(major, int) and major != SCHEMA_VERSION[0]:
        import torch

        raise SourceError(
            f"{path}: comes from torch {doc.get('torch_version', 'unknown')} (export schema "
            f"{major}.{version.get('minor', 0)}); this torch {torch.__version__} reads schema "
            f"{SCHEMA_VERSION[0]}.x: export it again with torch.export.save under torch "
            f"{torch.__version__}, or run kompile with the torch that wrote it"
        )


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # with its traceback: torch logs the cause as one


@contextlib.contextmanager
def quiet_torch_loading() -> Iterator[list[str]]:
    """torch's loaders print their own stack traces as warnings and log lines; kompile reports one
    message instead. The log lines are kept (yielded): torch.export.load's error says only to
    "check the warnings above", where the cause is."""
    kept = _Kept()
    # torch's own logging setup gives some of its loggers (torch.export's) handlers of their own:
    # each one that has is pointed at `kept` for the while, as is "torch" for the rest.
    loggers = [logging.getLogger("torch")] + [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and logger.handlers
    ]
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        lg.handlers[:] = [kept]
        lg.propagate = False
    loggers[0].setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield kept.lines
    finally:
        for lg, (level, propagate, handlers) in zip(loggers, before, strict=True):
            lg.setLevel(level)
            lg.propagate = propagate
            lg.handlers[:] = handlers


_UNRESOLVED_OP = re.compile(r"failed to resolve torch\.ops\.(\w+)\.(\w+)(?:\.\w+)? to an operator")


def pt2_load_failure(path: Path, err: BaseException, logged: list[str]) -> str | None:
    """What a .pt2 that torch.export.load refused lacks, when its log names it: a custom operator
    (torch.library) that no imported code registers. None otherwise."""
    found = next((m for line in logged if (m := _UNRESOLVED_OP.search(line))), None)
    if found is None:
        return None
    op = f"{found.group(1)}::{found.group(2)}"
    return (
        f"{path}: the program calls the operator {op}, which nothing here registers: a custom op "
        "is registered by the code that defines it (torch.library), and a .pt2 is read without "
        "running any. Give the model as a python:// factory from a module that imports the op's "
        "definition, or export it without the custom op"
    )
