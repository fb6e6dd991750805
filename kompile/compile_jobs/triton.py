"""Triton model repository layout: `<root>/<model>/config.pbtxt` and `<root>/<model>/1/<file>`.

KServe's Triton runtime serves `storageUri` = `<root>`. The config builder is a pure function, tested
without files; `write_model_repository` is the thin side-effecting shell around it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_TRITON_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "bool": "TYPE_BOOL",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
}


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape (-1 for a dynamic dimension) of one model input or output."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def _tensor_block(kind: str, tensors: Sequence[TensorSpec], batched: bool) -> str:
    items = []
    for t in tensors:
        dims = t.shape[1:] if batched else t.shape
        dims_text = ", ".join(str(d) for d in dims) or "1"
        # Triton takes no empty dims: a 0-d tensor is [ 1 ] reshaped to the model's [ ].
        reshape = "\n    reshape: { shape: [ ] }" if not t.shape else ""
        items.append(
            f'  {{\n    name: "{t.name}"\n    data_type: {_TRITON_TYPES[t.dtype]}\n'
            f"    dims: [ {dims_text} ]{reshape}\n  }}"
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def config_pbtxt(
    model_name: str,
    platform: str | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_batch_size: int,
    instance_kind: str = "KIND_CPU",
    model_filename: str | None = None,
    *,
    backend: str | None = None,
    cc_model_filenames: Mapping[str, str] | None = None,
    cuda_graphs: bool = False,
    parameters: Mapping[str, str] | None = None,
) -> str:
    """Triton's config.pbtxt. With max_batch_size > 0 Triton owns axis 0, so dims omit it (0 where
    a tensor has no batch axis).

    `backend` is the Triton backend line where the platform needs one (the catalog's serving entry
    says: pytorch for AOTInductor packages). `cc_model_filenames` maps a compute capability ("8.6")
    to the plan built for it, when one model folder holds plans for several GPU classes;
    `cuda_graphs` turns on Triton's CUDA graphs for TensorRT plans (launch overhead matters at
    small batches). `parameters` go to the backend as string parameters (OpenVINO's take its
    runtime properties this way: PERFORMANCE_HINT, INFERENCE_PRECISION_HINT, ...); a backend
    without a platform (openvino) is named by `backend` alone.
    """
    # Triton batches along axis 0 of every input and output: where one has no batch axis (a
    # scalar, a fixed-size table), batching is off and each tensor is declared whole.
    batched = max_batch_size > 0 and all(t.shape and t.shape[0] == -1 for t in [*inputs, *outputs])
    max_batch_size = max_batch_size if batched else 0
    text = f'name: "{model_name}"\n'
    if platform:
        text += f'platform: "{platform}"\n'
    if backend:
        text += f'backend: "{backend}"\n'
    text += f"max_batch_size: {max_batch_size}\n"
    if model_filename:
        text += f'default_model_filename: "{model_filename}"\n'
    if cc_model_filenames:
        entries = []
        for cc, filename in sorted(cc_model_filenames.items()):
            if not re.fullmatch(r"\d+\.\d+", cc):
                raise ValueError(f"compute capability {cc!r} must read major.minor, for example 8.6")
            entries.append(f'  {{\n    key: "{cc}"\n    value: "{filename}"\n  }}')
        text += "cc_model_filenames [\n" + ",\n".join(entries) + "\n]\n"
    text += _tensor_block("input", inputs, batched)
    text += _tensor_block("output", outputs, batched)
    text += f"instance_group [\n  {{\n    count: 1\n    kind: {instance_kind}\n  }}\n]\n"
    if cuda_graphs:
        text += "optimization {\n  cuda {\n    graphs: true\n  }\n}\n"
    for key, value in (parameters or {}).items():
        text += f'parameters {{\n  key: "{key}"\n  value {{ string_value: "{value}" }}\n}}\n'
    return text


AOTI_PLATFORM = "torch_aoti"
_AOTI_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def aoti_io(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], precision: str
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Tensor names and types as Triton's torch_aoti platform sees a package: inputs ARGS[i] in
    signature order, outputs RESULT (one) or RESULT[i]; float tensors in the package's precision,
    since Triton does not cast and the package takes and returns its own dtype."""
    float_to = _AOTI_DTYPES.get(precision)

    def cast(dtype: str) -> str:
        return float_to if float_to and dtype == "float32" else dtype

    ins = [TensorSpec(f"ARGS[{i}]", cast(t.dtype), t.shape) for i, t in enumerate(inputs)]
    outs = [
        TensorSpec("RESULT" if len(outputs) == 1 else f"RESULT[{i}]", cast(t.dtype), t.shape)
        for i, t in enumerate(outputs)
    ]
    return ins, outs


def cc_plan_filename(compute_capability: str) -> str:
    """File name of the plan for one compute capability in a multi-class model folder: model_sm86.plan."""
    major, _, minor = compute_capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"compute capability {compute_capability!r} must read major.minor, for example 8.6")
    return f"model_sm{major}{minor}.plan"


def place(src: Path, dst: Path) -> None:
    """dst gets src's content: a hard link where both are on one filesystem (a multi-GB model is
    not on disk twice while the run holds its build), else a copy. The build folder is emptied
    before each build and removed after the run, so the shared file is never written over."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem (EXDEV), or one without hard links
        shutil.copyfile(src, dst)


def write_model_repository(
    root: Path, model_name: str, files: Sequence[tuple[Path, str]], config: str | None
) -> Path:
    """Lay out one model under root: each (built file, name) in `<model>/1/`, and config.pbtxt
    unless there is none (a backend Triton does not serve); returns the model's folder."""
    model_dir = root / model_name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    for path, name in files:
        place(path, version_dir / name)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def onnx_io(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX graph as TensorSpecs (symbolic dims become -1)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    init = {t.name for t in model.graph.initializer}

    def spec(v: onnx.ValueInfoProto) -> TensorSpec:
        tt = v.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        return TensorSpec(v.name, dtype, dims)

    return [spec(i) for i in model.graph.input if i.name not in init], [spec(o) for o in model.graph.output]
