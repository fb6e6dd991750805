"""Bring an ONNX source from an older exporter to the form the backends are built for.

Model-zoo files and older converters write opset 7-12 and IR version 3, where every weight is also a
graph input. Measured on such a file (the small CNN at opset 9): ONNX Runtime's static quantizer writes
per-channel DequantizeLinear nodes (an opset-13 attribute) into the opset-9 graph, which then does not
load; IREE's importer has no MaxPool below opset 12. Only the compile working copy is upgraded: the
reference stays the file as the user gave it, so validation holds the upgrade to it too.
"""

from __future__ import annotations

from typing import Any

from kompile.compile_jobs.envs import STANDARD_DOMAINS
from kompile.compile_jobs.export import OPSET

MIN_OPSET = 13
"""Below this the working copy is converted to OPSET (what kompile's own exports write)."""


def default_opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), OPSET)


def upgrade(model: Any) -> tuple[Any, list[str]]:
    """The model in a form every backend reads, and one note per change made; the model itself when
    nothing needs changing. Changes the ModelProto it is given (the caller's parsed copy)."""
    import onnx
    import onnx.version_converter

    notes: list[str] = []
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
