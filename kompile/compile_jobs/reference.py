"""The reference for ONNX sources: the source graph on ONNX Runtime with every optimization off,
so validation measures what the compiler changed, not the runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.inputs import Feed


class OnnxReferenceRunner:
    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Errors only: its load-time advice (weights listed as inputs cannot be folded) is about
        # optimizing, which this session never does; the compiled working copy has it acted on.
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Feed) -> list[np.ndarray[Any, Any]]:
        outs = self.session.run(self.output_names, feeds)
        return [np.asarray(o, dtype=np.float32) for o in outs]
