"""The reference for ONNX sources: the source graph on ONNX Runtime with every optimization off,
so validation measures what the compiler changed, not the runtime."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.inputs import Feed
from kompile.compile_jobs.source_files import SourceError
from kompile.compile_jobs.user_code import first_line


class OnnxReferenceRunner:
    def __init__(self, path: Path, threads: int, shown: Path | None = None) -> None:
        """`shown`: the file to name in an error when `path` is a copy of it."""
        import onnxruntime as ort
        from onnxruntime.capi.onnxruntime_pybind11_state import (
            Fail,
            InvalidArgument,
            InvalidGraph,
            NotImplemented,
        )

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Fatal only: its load-time advice (weights listed as inputs cannot be folded) is about
        # optimizing, which this session never does; the compiled working copy has it acted on. A
        # failed run's error line comes as the exception too (said once, with what to change).
        opts.log_severity_level = 4
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except (Fail, InvalidGraph, NotImplemented, InvalidArgument) as err:
            # Its graph as given (an operator of a domain no runtime here has, a type it lacks):
            # the user's to change, not kompile's bug.
            said = first_line(err)
            said = said.rpartition(" failed:")[2] or said
            # Without its source location and C++ signature ("/onnxruntime_src/...h:46 void f(...)").
            said = re.sub(r"^\s*/\S+:\d+ [^(]*\([^)]*\)\s*", "", said)
            fix = (
                "export it with standard ONNX operators only (ai.onnx, ai.onnx.ml, com.microsoft)"
                if "is not a registered function/op" in said
                else "save it as a model this ONNX Runtime loads"
            )
            raise SourceError(
                f"{shown or path}: ONNX Runtime {ort.__version__} cannot load it, so kompile has no "
                f"reference to validate against: {said}; {fix}"
            ) from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Feed) -> list[np.ndarray[Any, Any]]:
        try:
            raw = self.session.run(self.output_names, feeds)
        except Exception as err:  # noqa: BLE001 - ONNX Runtime's own classes derive from Exception
            # Its first line, without the node's C++ location: what the graph refused of the inputs.
            said = first_line(err)
            raise RuntimeError(re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", said)) from None
        outs = [np.asarray(o) for o in raw]
        # Integer and boolean outputs (labels, masks) stay so: validation holds them to equality.
        return [
            o if o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer) else o.astype(np.float32)
            for o in outs
        ]
