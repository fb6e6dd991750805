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


@functools.cache
def ort_max_ir_version() -> int:
    """The newest ONNX IR version this ONNX Runtime loads, found by loading a one-node graph: the
    `onnx` package writes a newer one than its ONNX Runtime reads (IR 14 against 13 in the pinned
    pair), and ONNX Runtime publishes no constant for it."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", io[:1], io[1:])
    for version in range(onnx.IR_VERSION, 7, -1):
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=version)
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        except Fail:
            continue
        return version
    return 7


def _ir_note(was: int) -> str:
    import onnxruntime as ort

    return (
        f"IR version {was} written as {ort_max_ir_version()}, the newest ONNX Runtime "
        f"{ort.__version__} reads (the graph is unchanged)"
    )


def readable_copy(path: Path, model: Any, folder: Path) -> tuple[Path, str | None]:
    """`path` when ONNX Runtime loads its IR version; otherwise a copy in `folder` that says the
    newest one it reads, its external data files linked at their relative locations, and a note
    (the working copy's note says it to the user). For the reference, which is the file as given:
    only the version number differs."""
    import onnx

    if model.ir_version <= ort_max_ir_version():
        return path, None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = ort_max_ir_version()
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
    return folder / path.name, f"{path.name}: {_ir_note(model.ir_version)}"


def upgrade(model: Any) -> tuple[Any, list[str]]:
    """The model in a form every backend reads, and one note per change made; the model itself when
    nothing needs changing. Changes the ModelProto it is given (the caller's parsed copy)."""
    import onnx
    import onnx.version_converter

    notes: list[str] = []
    weights = {t.name for t in model.graph.initializer}
    as_inputs = [i for i in model.graph.input if i.name in weights]
    opset = default_opset(model)
    newer = model.ir_version > ort_max_ir_version()
    if not as_inputs and opset >= MIN_OPSET and not newer:
        return model, notes
    if newer:
        notes.append(_ir_note(model.ir_version))
        model.ir_version = ort_max_ir_version()
    if as_inputs:
        # An input may be fed at run time, so no runtime folds or fuses it; kompile's signature never
        # feeds one. IR 4 is the first that allows an initializer outside graph.input.
        keep = [i for i in model.graph.input if i.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        model.ir_version = max(model.ir_version, 4)
        notes.append(f"{len(as_inputs)} weight(s) also listed as graph inputs are taken as constants")
    if opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, OPSET)
        except (RuntimeError, ValueError, onnx.checker.ValidationError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            notes.append(
                f"kept at opset {opset}: onnx's version converter cannot upgrade it ({reason}); "
                f"int8 ONNX Runtime and IREE need opset {MIN_OPSET} and may refuse it: re-export the "
                f"model at opset {OPSET} to use them"
            )
        else:
            notes.append(
                f"upgraded from opset {opset} to {OPSET} (ONNX Runtime's int8 and IREE need {MIN_OPSET}); "
                "validation still compares every artifact with the file as given"
            )
    return model, notes
