"""The `iree` environment's steps (requirements/env-iree.txt: iree-base-compiler, iree-base-runtime,
onnx; no torch), served by kompile.compile_jobs.env_runner.

- compile: the pipeline's fp32 ONNX export with each input fixed at the shape the options give
  (`staticShapes`), shapes inferred again, imported to MLIR by IREE's ONNX importer, then
  `iree-compile` for `llvm-cpu` (or, with `halDevice` cuda, the device the flags name) with the
  flags the pipeline chose (`compileFlags`) into a `.vmfb`;
- load/run: the IREE runtime's `local-task` device with the given number of workers
  (`--task_topology_group_count`), or its `cuda` device; the module's `main_graph` function; a run
  is timed from the call to the outputs on the host.

Imports only the standard library, numpy and this environment's packages.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.env_protocol import StepFailed
from kompile.compile_jobs.envs import PROTOBUF_LIMIT, FeedCache, fix_input_dims, foreign_ops, write_arrays

Array = np.ndarray[Any, Any]
ENTRY_FUNCTION = "main_graph"
# An MLIR diagnostic's location and severity ("loc: error: ..."), the part a user can act on.
_ERROR = re.compile(r"error: (.*)")
_CCONV = re.compile(r"\((\w*)_(\w*)\)")
_ILLEGAL = re.compile(r"failed to legalize operation '([\w.]+)'[^\n]*")
_ONNX_OP = re.compile(r'name = "onnx\.(\w+)"')
_CRASH = re.compile(r"Error code: -(\d+)")


def _first_line(err: BaseException) -> str:
    return next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)


def compiler_error(text: str) -> str:
    """What iree-compile's diagnostics say a user can act on: the ONNX op (or torch op) it has no
    lowering for, else its first `error:`, else that it crashed."""
    illegal = _ILLEGAL.search(text)
    if illegal:
        onnx_op = _ONNX_OP.search(illegal.group(0))
        if onnx_op:
            return f"IREE has no lowering for the ONNX op {onnx_op.group(1)}"
        return f"IREE cannot lower the op {illegal.group(1)}"
    found = _ERROR.search(text)
    if found:
        return found.group(1).strip()[:400]
    crash = _CRASH.search(text)
    if crash:
        return f"iree-compile crashed (signal {crash.group(1)}) on this model"
    return next((ln for ln in text.splitlines() if ln.strip()), "no diagnostics")


def static_model(path: Path, shapes: dict[str, list[int]], scratch: Path) -> Any:
    """The ONNX model with each input fixed at `shapes` and every other shape inferred again (the
    export's dynamic axes would otherwise reach IREE as dynamic dimensions)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    foreign = foreign_ops(model)
    if foreign:
        # Its importer types their outputs as none, and iree-compile then blames the op after them.
        raise StepFailed(
            f"IREE's ONNX importer takes standard ONNX ops only, and the model has {', '.join(foreign)}: "
            "ops of another runtime (ONNX Runtime's transformer optimizer writes com.microsoft ones); "
            "compile the model as exported, before such an optimization, or use onnxruntime"
        )
    try:
        fix_input_dims(model, shapes)
    except ValueError as err:
        raise StepFailed(str(err)) from err
    # IREE names the function after the graph: the one name the runtime calls, whatever the
    # exporter called it (tf2onnx "tf2onnx", older torch "torch-jit-export").
    model.graph.name = ENTRY_FUNCTION
    del model.graph.value_info[:]
    for out in model.graph.output:
        for dim in out.type.tensor_type.shape.dim:
            dim.Clear()
    fixed, inferred = scratch / "static.onnx", scratch / "inferred.onnx"
    onnx.load_external_data_for_model(model, str(path.parent))
    large = model.ByteSize() > PROTOBUF_LIMIT
    onnx.save_model(model, str(fixed), save_as_external_data=large)
    # By path: in-memory inference stops at protobuf's 2 GB.
    onnx.shape_inference.infer_shapes_path(str(fixed), str(inferred), data_prop=True)
    result = onnx.load(str(inferred), load_external_data=False)
    onnx.load_external_data_for_model(result, str(scratch))
    return result


def import_onnx(model: Any, out: Path) -> None:
    """IREE's ONNX importer: the model as MLIR (torch dialect) bytecode."""
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    context = ir.Context()
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=context).operation
    try:
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    except (onnx_importer.OnnxImportError, ValueError, NotImplementedError) as err:
        raise StepFailed(f"IREE's ONNX importer cannot take the model: {_first_line(err)}") from err
    with out.open("wb") as f:
        module.write_bytecode(f)


class Steps:
    def __init__(self) -> None:
        self.context: Any = None
        self.function: Any = None
        self.device: Any = None
        self.outputs: list[str] = []
        self.feeds = FeedCache()

    def op_compile(self, req: dict[str, Any]) -> dict[str, Any]:
        from iree.compiler import tools

        options = req.get("options", {})
        shapes: dict[str, list[int]] = json.loads(options.get("staticShapes", "{}"))
        flags = options.get("compileFlags", "").split()
        # A GPU's device and target come in the flags (--iree-hal-target-device=cuda).
        backends = ["llvm-cpu"] if options.get("halDevice", "local-task") == "local-task" else []
        out = Path(req["out"])
        with tempfile.TemporaryDirectory(prefix="iree-", dir=out.parent) as tmp:
            scratch = Path(tmp)
            started = time.perf_counter()
            import_onnx(static_model(Path(req["program"]), shapes, scratch), scratch / "model.mlirbc")
            imported = time.perf_counter()
            try:
                tools.compile_file(
                    str(scratch / "model.mlirbc"),
                    target_backends=backends,
                    extra_args=flags,
                    output_file=str(out),
                )
            except tools.CompilerToolError as err:
                raise StepFailed(
                    f"iree-compile failed: {compiler_error(str(err))}; replace that construct in the "
                    "model, change the flags (options flags, extraFlags) or use another backend"
                ) from err
        done = time.perf_counter()
        return {
            "record": {
                "importer": "iree-import-onnx",
                "importSeconds": f"{imported - started:.1f}",
                "compileSeconds": f"{done - imported:.1f}",
            }
        }

    def op_load(self, req: dict[str, Any]) -> dict[str, Any]:
        import iree.runtime as rt

        threads, name = int(req["threads"]), req.get("device", "local-task")
        if name == "local-task":
            # Process-wide flags read when the device is made: this process serves one module.
            rt.flags.parse_flags(f"--task_topology_group_count={threads}")
        try:
            self.device = rt.get_device(name, cache=False)
        except (RuntimeError, ValueError) as err:
            raise StepFailed(f"the IREE runtime has no {name} device here: {_first_line(err)}") from err
        self.context = rt.SystemContext(config=rt.Config(device=self.device))
        try:
            module = rt.VmModule.mmap(self.context.instance, req["model"])
        except (RuntimeError, ValueError) as err:
            raise StepFailed(f"IREE cannot load {Path(req['model']).name}: {err}; rebuild it") from err
        self.context.add_vm_module(module)
        self.function = self.context.modules[module.name][ENTRY_FUNCTION]
        # The calling convention ("0rr_r": arguments _ results) says how many results it has.
        cconv = _CCONV.search(repr(module.lookup_function(ENTRY_FUNCTION)))
        count = len(cconv.group(2)) if cconv else 1
        self.outputs = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
        self.feeds.clear()
        return {"inputs": [], "outputs": self.outputs}

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        import iree.runtime as rt

        if self.function is None:
            raise StepFailed("no model loaded")
        args = self.feeds.get(req["feeds"], lambda arrays: [rt.asdevicearray(self.device, a) for a in arrays])
        # Timed: the call and its outputs on the host, after the feed is on the device.
        start = time.perf_counter_ns()
        try:
            result = self.function(*args)
        except (RuntimeError, ValueError) as err:
            raise StepFailed(f"the IREE module refused the inputs: {_first_line(err)}") from err
        results = result if isinstance(result, list | tuple) else [result]
        outs = [np.asarray(r.to_host()) for r in results]
        ns = time.perf_counter_ns() - start
        if req["out"]:
            write_arrays(req["out"], outs)
        return {"ns": ns}
