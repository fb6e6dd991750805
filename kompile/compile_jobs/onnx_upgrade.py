"""Bring an ONNX source from an older exporter to the form the backends are built for.

Model-zoo files and older converters write opset 7-12 and IR version 3, where every weight is also a
graph input. Measured on such a file (the small CNN at opset 9): ONNX Runtime's static quantizer writes
per-channel DequantizeLinear nodes (an opset-13 attribute) into the opset-9 graph, which then does not
load; IREE's importer has no MaxPool below opset 12. Only the compile working copy is upgraded: the
reference stays the file as the user gave it, so validation holds the upgrade to it too.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

from kompile.compile_jobs.envs import STANDARD_DOMAINS
from kompile.compile_jobs.export import OPSET
from kompile.compile_jobs.source_files import onnx_external_files

MIN_OPSET = 13
"""Below this the working copy is converted to OPSET (what kompile's own exports write)."""


def default_opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), OPSET)


def _loads(ir_version: int, opset: int) -> bool:
    """Whether this ONNX Runtime loads a one-node graph stamped with these versions."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", io[:1], io[1:])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Fail:
        return False
    return True


# The `onnx` package writes newer versions than its ONNX Runtime reads (IR 14 and opset 28 against
# 13 and 26 in the pinned pair: `helper.make_model` stamps its newest), and ONNX Runtime publishes
# no constant for either: each is found once by loading a one-node graph.
@functools.cache
def ort_max_ir_version() -> int:
    """The newest ONNX IR version this ONNX Runtime loads."""
    import onnx

    return next((v for v in range(onnx.IR_VERSION, 7, -1) if _loads(v, MIN_OPSET)), 7)


@functools.cache
def ort_max_opset() -> int:
    """The newest default-domain opset this ONNX Runtime loads."""
    from onnx import defs

    newest = defs.onnx_opset_version()
    return next((v for v in range(newest, OPSET, -1) if _loads(ort_max_ir_version(), v)), OPSET)


def within_ort(model: Any) -> tuple[Any, list[str]]:
    """The model stamped with versions ONNX Runtime loads, and a note per change: a newer IR version
    written as its newest (the graph unchanged), a newer opset converted down by onnx's version
    converter (for most graphs only the stamp changes). The model itself when both are within."""
    import onnxruntime as ort

    notes: list[str] = []
    runtime = f"ONNX Runtime {ort.__version__}"
    if model.ir_version > ort_max_ir_version():
        notes.append(
            f"IR version {model.ir_version} written as {ort_max_ir_version()}, the newest {runtime} "
            "reads (the graph is unchanged)"
        )
        model.ir_version = ort_max_ir_version()
    opset, top = default_opset(model), ort_max_opset()
    if opset > top:
        converted, reason = _converted(model, top)
        if converted is None:
            notes.append(
                f"kept at opset {opset}, newer than {runtime} reads ({top}): onnx's version converter "
                f"cannot lower it ({reason}); export the model at opset {top}"
            )
        else:
            converted.ir_version = min(converted.ir_version, ort_max_ir_version())
            model = converted
            notes.append(f"opset {opset} converted to {top}, the newest {runtime} reads")
    return model, notes


def _converted(model: Any, opset: int) -> tuple[Any | None, str]:
    """The model converted to `opset` by onnx's version converter, or None and why it cannot."""
    import onnx
    import onnx.version_converter

    try:
        return onnx.version_converter.convert_version(model, opset), ""
    except (RuntimeError, ValueError, onnx.checker.ValidationError) as err:
        return None, (str(err).strip().splitlines() or [type(err).__name__])[0]


def readable_copy(path: Path, model: Any, folder: Path) -> Path:
    """`path` when ONNX Runtime loads its versions; otherwise a copy in `folder` stamped within
    them (within_ort), its external data files linked at their relative locations. For the
    reference, which is the file as given: only the version stamps differ (the working copy's
    notes tell the user)."""
    import onnx

    if model.ir_version <= ort_max_ir_version() and default_opset(model) <= ort_max_opset():
        return path
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy, _ = within_ort(copy)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    onnx.save_model(copy, str(folder / path.name))
    for name in onnx_external_files(model):
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:  # a hard link: ONNX Runtime refuses a symbolic one that leads out of the folder
            os.link(path.parent / name, dest)
        except OSError:  # another file system: the weights are copied
            shutil.copyfile(path.parent / name, dest)
    return folder / path.name


def unsorted(err: Exception) -> bool:
    """Whether onnx's checker refused the graph only for the order of its nodes."""
    return "must be topologically sorted" in str(err)


def in_order(model: Any) -> Any:
    """The model with its nodes, and its subgraphs', in topological order (onnx_ir's sort; weights
    kept where they are, external data still referenced). ONNX Runtime's float16 converter with
    keep_io_types appends the Casts of the inputs it keeps float32 at the end of the node list:
    ONNX Runtime and OpenVINO load that graph, onnx's checker and the converters built on it do not."""
    import onnx_ir as ir

    graph = ir.from_proto(model)
    graph.graph.sort()
    return ir.to_proto(graph)


def upgrade(model: Any) -> tuple[Any, list[str]]:
    """The model in a form every backend reads, and one note per change made; the model itself when
    nothing needs changing. Changes the ModelProto it is given (the caller's parsed copy)."""
    model, notes = within_ort(model)
    weights = {t.name for t in model.graph.initializer}
    as_inputs = [i for i in model.graph.input if i.name in weights]
    opset = default_opset(model)
    if not as_inputs and opset >= MIN_OPSET:
        return model, notes
    if as_inputs:
        # An input may be fed at run time, so no runtime folds or fuses it; kompile's signature never
        # feeds one. IR 4 is the first that allows an initializer outside graph.input.
        keep = [i for i in model.graph.input if i.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        model.ir_version = max(model.ir_version, 4)
        notes.append(f"{len(as_inputs)} weight(s) also listed as graph inputs are taken as constants")
    if opset < MIN_OPSET:
        converted, reason = _converted(model, OPSET)
        if converted is None:
            notes.append(
                f"kept at opset {opset}: onnx's version converter cannot upgrade it ({reason}); "
                f"int8 ONNX Runtime and IREE need opset {MIN_OPSET} and may refuse it: re-export the "
                f"model at opset {OPSET} to use them"
            )
        else:
            model = converted
            notes.append(
                f"upgraded from opset {opset} to {OPSET} (ONNX Runtime's int8 and IREE need {MIN_OPSET}); "
                "validation still compares every artifact with the file as given"
            )
    return model, notes
