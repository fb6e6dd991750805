"""The `litert` environment's steps (requirements/env-litert.txt: torch 2.14, litert-torch,
ai-edge-quantizer, ai-edge-litert), served by kompile.compile_jobs.env_runner.

- compile: the torch.export program (saved by the pipeline at static shapes) through
  `litert_torch.convert` into an fp32 `.tflite`; int8 through ai-edge-quantizer: static is
  full-integer (`static_wi8_ai8`: int8 weights and activations, int8 inputs and outputs), calibrated
  on the reference inputs; dynamic is `dynamic_wi8_afp32` (int8 weights, activations quantized at
  run time);
- load/run: the LiteRT interpreter with its default XNNPACK delegate and the given thread count.
  Quantized inputs and outputs are converted with the model's own scales, as a device app would,
  inside the timed call.

Imports only the standard library, numpy and this environment's packages.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.env_protocol import StepFailed
from kompile.compile_jobs.envs import FeedCache, read_arrays, write_arrays

Array = np.ndarray[Any, Any]
SIGNATURE = "serving_default"


def _ordered(names: list[str]) -> list[str]:
    """args_0, args_1, ..., args_10 (not args_10 before args_2)."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])


def _quantize(x: Array, detail: dict[str, Any]) -> Array:
    scale, zero = detail["quantization"]
    dtype = detail["dtype"]
    if not scale or not np.issubdtype(dtype, np.integer):
        return np.asarray(x, dtype=dtype)
    info = np.iinfo(dtype)
    quantized: Array = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)
    return quantized


def _dequantize(y: Array, detail: dict[str, Any]) -> Array:
    scale, zero = detail["quantization"]
    if not scale or not np.issubdtype(y.dtype, np.integer):
        return y
    real: Array = ((y.astype(np.float32) - zero) * scale).astype(np.float32)
    return real


def _first_line(err: BaseException) -> str:
    return next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)


class Steps:
    def __init__(self) -> None:
        self.runner: Any = None
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.in_details: dict[str, Any] = {}
        self.out_details: dict[str, Any] = {}
        self.feeds = FeedCache()

    def op_compile(self, req: dict[str, Any]) -> dict[str, Any]:
        import litert_torch
        import torch

        out = Path(req["out"])
        program = torch.export.load(req["program"])
        args = tuple(torch.from_numpy(a) for a in read_arrays(req["example"]))
        float_path = out if req["precision"] == "fp32" else out.with_name(out.stem + "-fp32.tflite")
        try:
            litert_torch.convert(program.module(), args).export(str(float_path))
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            raise StepFailed(f"litert-torch could not convert the model: {_first_line(err)}") from err
        record: dict[str, str] = {"converter": "litert-torch"}
        if req["precision"] == "int8":
            record.update(self._quantize(float_path, out, req))
            float_path.unlink()
        return {"record": record}

    def _quantize(self, float_path: Path, out: Path, req: dict[str, Any]) -> dict[str, str]:
        from ai_edge_quantizer import quantizer, recipe

        static = req["quantization"] != "dynamic"
        chosen = recipe.static_wi8_ai8() if static else recipe.dynamic_wi8_afp32()
        qt = quantizer.Quantizer(str(float_path), chosen)
        calibration: Any = None
        samples: list[dict[str, Array]] = []
        if qt.need_calibration:
            details = self._signature_inputs(float_path)
            names = _ordered(list(details))
            # In the converted model's own dtypes: LiteRT takes token ids as int32, not torch's int64.
            samples = [
                {
                    n: np.asarray(a, dtype=details[n]["dtype"])
                    for n, a in zip(names, read_arrays(f), strict=True)
                }
                for f in req["calibration"]
            ]
        try:
            if samples:
                calibration = qt.calibrate({SIGNATURE: samples}, num_threads=2)
            qt.quantize(calibration, enable_progress_bar=False).export_model(str(out), overwrite=True)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            raise StepFailed(f"ai-edge-quantizer could not quantize the model: {_first_line(err)}") from err
        record = {
            "quantization": "ai-edge-quantizer-" + ("static-wi8-ai8" if static else "dynamic-wi8-afp32"),
            "calibrationSamples": str(len(req["calibration"]) if static else 0),
            "integerIo": str(static).lower(),
        }
        if not static:
            record["int8Weights"] = str(self._int8_weights(out))
        return record

    @staticmethod
    def _int8_weights(path: Path) -> int:
        """How many int8 tensors the dynamic recipe left in the model (its weights; activations
        stay float). Zero: the recipe found no op it quantizes (it takes the weights of
        convolutions, fully connected layers and the like), and the model is fp32 under an int8
        label, which the tournament must not see."""
        from ai_edge_litert import interpreter

        it = interpreter.Interpreter(model_path=str(path))
        count = sum(1 for t in it.get_tensor_details() if t["dtype"] == np.int8)
        if count == 0:
            ops = sorted({o["op_name"] for o in it._get_ops_details()})
            raise StepFailed(
                "ai-edge-quantizer's dynamic recipe (int8 weights, float activations) quantized no "
                f"weight of this model (its ops: {', '.join(ops)}): it would run as fp32; use "
                "quantization: static (int8 activations too) or precision fp32"
            )
        return count

    @staticmethod
    def _signature_inputs(path: Path) -> dict[str, Any]:
        """Each input of the model's signature: its details (dtype, shape, quantization)."""
        from ai_edge_litert import interpreter

        runner = interpreter.Interpreter(model_path=str(path)).get_signature_runner(SIGNATURE)
        return dict(runner.get_input_details())

    def op_load(self, req: dict[str, Any]) -> dict[str, Any]:
        from ai_edge_litert import interpreter

        try:
            it = interpreter.Interpreter(model_path=req["model"], num_threads=int(req["threads"]))
        except ValueError as err:
            raise StepFailed(f"LiteRT cannot load {Path(req['model']).name}: {err}; rebuild it") from err
        self.runner = it.get_signature_runner(SIGNATURE)
        self.in_details = self.runner.get_input_details()
        self.out_details = self.runner.get_output_details()
        self.inputs, self.outputs = _ordered(list(self.in_details)), _ordered(list(self.out_details))
        self.feeds.clear()
        return {"inputs": self.inputs, "outputs": self.outputs}

    def _static_feed(self, arrays: list[Array]) -> list[Array]:
        details = [self.in_details[n] for n in self.inputs]
        shapes = [tuple(int(n) for n in d["shape"]) for d in details]
        if [a.shape for a in arrays] != shapes:
            raise StepFailed(
                f"the .tflite was converted at the static shapes {shapes} and runs only those, not "
                f"{[a.shape for a in arrays]}"
            )
        return arrays

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.runner is None:
            raise StepFailed("no model loaded")
        # Timed: the call as a device app makes it, float in and out (integer I/O converted with
        # the model's scales), after the feed file was read.
        arrays = self.feeds.get(req["feeds"], self._static_feed)
        start = time.perf_counter_ns()
        feed = {n: _quantize(a, self.in_details[n]) for n, a in zip(self.inputs, arrays, strict=True)}
        result = self.runner(**feed)
        outs = [_dequantize(result[n], self.out_details[n]) for n in self.outputs]
        ns = time.perf_counter_ns() - start
        if req["out"]:
            write_arrays(req["out"], outs)
        return {"ns": ns}
