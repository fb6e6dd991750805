"""The `xla` environment's steps (requirements/env-xla.txt: torch 2.9, torchax 0.0.13, jax and
jaxlib 0.10.2 with its CUDA 12 plugin), served by kompile.compile_jobs.env_runner.

- compile: the torch.export program (saved by the pipeline at static shapes) is decomposed to the
  ATen ops torchax lowers, interpreted node by node into JAX (each node's failure names the node,
  its op and the source line), traced by `jax.jit` and serialized with `jax.export` (StableHLO in
  a flatbuffer). The weights are baked into the module as constants: one file, and XLA folds the
  weights' layout changes at compile time (ResNet-50 batch 1: 143 ms baked vs 416 ms with the
  weights passed as arguments, same run);
- load: `jax.export.deserialize`, then XLA compiles it for this host's CPU (the artifact is
  portable StableHLO; the machine code is made where it runs). The XLA CPU runtime sizes its thread
  pool from the process's CPU affinity, so `threads` is honoured by narrowing the affinity of this
  process (its own process: nothing else runs in it) before JAX starts its CPU client;
- on a GPU class (`device: cuda`) the module is exported for the `cuda` platform (lowering needs no
  GPU) and loaded by JAX's CUDA plugin, which XLA compiles it for the GPU with;
- run: one call with block_until_ready, timed in this process.

JAX runs without 64-bit types (its default): int64 inputs (token ids) run as int32; the compile
record says which dtypes the module takes. Imports only the standard library, numpy and this
environment's packages.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.env_protocol import StepFailed
from kompile.compile_jobs.envs import FeedCache, read_arrays, write_arrays

# CPU unless a load asks for cuda: JAX would otherwise probe its CUDA plugin at every start.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

Array = np.ndarray[Any, Any]


def _first_line(err: BaseException) -> str:
    return next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)


class Unlowered(Exception):
    """A node of the program that torchax could not turn into JAX."""


def _where(node: Any) -> str:
    """The node's source line (the last frame of its stack trace), else its module path."""
    trace = [ln.strip() for ln in (node.meta.get("stack_trace") or "").splitlines() if ln.strip()]
    frames = [ln for ln in trace if ln.startswith("File ")]
    if frames:
        return f" ({frames[-1]}: {trace[-1]})" if trace[-1] != frames[-1] else f" ({frames[-1]})"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        return f" (in module {path or '<root>'}: {getattr(kind, '__name__', kind)})"
    return ""


def _jax_function(program: Any) -> tuple[Any, list[Any]]:
    """A function of the user inputs (JAX arrays) with the program's weights baked in, and those
    weights as JAX arrays."""
    import torch
    import torchax
    from torch.export.graph_signature import InputKind
    from torchax.decompositions import DECOMPOSITIONS
    from torchax.export import JaxInterpreter

    program = program.run_decompositions().run_decompositions(DECOMPOSITIONS)
    sig = program.graph_signature
    known = {**program.state_dict, **program.constants}
    lifted: list[Any] = []
    for spec in sig.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            lifted.append(known[spec.target])
    weights = list(torchax.default_env().t2j_copy([torch.as_tensor(w) for w in lifted]))
    mutations = len(sig.buffers_to_mutate)

    class Naming(JaxInterpreter):  # type: ignore[misc]
        def run_node(self, n: Any) -> Any:
            try:
                return super().run_node(n)
            except Unlowered:
                raise
            except Exception as err:  # any error from an op's lowering: named with its node
                op = (
                    str(n.target)
                    if hasattr(n.target, "overloadpacket")
                    else getattr(n.target, "__name__", "?")
                )
                # torchax asserts that each ATen op it meets has a lowering.
                why = (
                    "torchax has no lowering for it" if isinstance(err, AssertionError) else _first_line(err)
                )
                raise Unlowered(f"node {n.name} ({op}){_where(n)}: {why}") from err

    def run(*inputs: Any) -> list[Any]:
        out = Naming(program.graph_module).run(*weights, *inputs, enable_io_processing=False)
        return list(out[mutations:])

    return run, weights


def _cuda_devices(jax: Any) -> list[Any]:
    """JAX's cuda devices, or StepFailed with the reason its CUDA plugin gave: where the plugin
    fails to start (no driver, no GPU), JAX only logs that error and then fails an assertion."""
    import logging

    failures: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            err = record.exc_info[1] if record.exc_info else None
            failures.append(_first_line(err) if err else record.getMessage())

    log = logging.getLogger("jax._src.xla_bridge")
    handler = Keep(logging.WARNING)
    log.addHandler(handler)
    try:
        return list(jax.devices("cuda"))
    except (RuntimeError, AssertionError) as err:
        why = failures[-1] if failures else _first_line(err)
        raise StepFailed(f"JAX has no cuda device here: {why}; run this target on a GPU node") from err
    finally:
        log.removeHandler(handler)


class Steps:
    def __init__(self) -> None:
        self.compiled: Any = None
        self.avals: list[Any] = []
        self.feeds = FeedCache()

    def op_compile(self, req: dict[str, Any]) -> dict[str, Any]:
        import jax
        import torch

        try:
            program = torch.export.load(req["program"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise StepFailed(
                f"torch {torch.__version__} in the xla environment cannot read the exported program "
                f"{Path(req['program']).name}: {_first_line(err)}"
            ) from err
        example = read_arrays(req["example"])
        # The platform the module is lowered for: this CPU-only JAX lowers for cuda too (XLA compiles
        # it for the GPU where it is loaded).
        platform = (req.get("options") or {}).get("device", "cpu")
        try:
            run, _ = _jax_function(program)
            shapes = [jax.ShapeDtypeStruct(a.shape, jax.dtypes.canonicalize_dtype(a.dtype)) for a in example]
            # Full fp32 in every convolution and matmul: XLA's default precision runs them in TF32 on
            # NVIDIA GPUs (MobileNetV2 on an H100: max abs error 0.0185 against the fp32 gate's 1e-3);
            # CPUs compute fp32 either way.
            with jax.default_matmul_precision("highest"):
                exported = jax.export.export(jax.jit(run), platforms=[platform])(*shapes)
        except Unlowered as err:
            # torch.fx appends the graph around the node on more lines: the first says it all.
            raise StepFailed(f"torchax could not lower the model to StableHLO at {_first_line(err)}") from err
        Path(req["out"]).write_bytes(exported.serialize())
        return {
            "record": {
                "converter": "torchax",
                "weights": "baked",
                "matmulPrecision": "highest",
                "xlaInputDtypes": ",".join(str(a.dtype) for a in exported.in_avals),
                "stablehloPlatforms": ",".join(exported.platforms),
            }
        }

    def op_load(self, req: dict[str, Any]) -> dict[str, Any]:
        threads, device = int(req["threads"]), req.get("device", "cpu")
        cores = sorted(os.sched_getaffinity(0))
        if device == "cuda":
            # Before JAX starts: its CUDA plugin (jax-cuda12-plugin) makes the only client.
            os.environ["JAX_PLATFORMS"] = "cuda"
        elif 0 < threads < len(cores):
            # Before JAX makes its CPU client: XLA sizes its thread pool from this affinity.
            os.sched_setaffinity(0, cores[:threads])
        import jax

        if device == "cuda":
            _cuda_devices(jax)

        try:
            exported = jax.export.deserialize(bytearray(Path(req["model"]).read_bytes()))
        except (ValueError, TypeError, RuntimeError) as err:
            name = Path(req["model"]).name
            raise StepFailed(f"jax.export cannot read {name}: {_first_line(err)}; rebuild it") from err
        self.avals = list(exported.in_avals)
        try:
            self.compiled = jax.jit(exported.call).lower(*self.avals).compile()
        except Exception as err:  # XLA's compile errors carry no narrower type
            raise StepFailed(f"XLA could not compile the module: {_first_line(err)}") from err
        self.feeds.clear()
        count = len(exported.out_avals)
        return {"inputs": [str(i) for i in range(len(self.avals))], "outputs": [str(i) for i in range(count)]}

    def _static_feed(self, arrays: list[Array]) -> list[Array]:
        shapes = [tuple(a.shape) for a in self.avals]
        if [a.shape for a in arrays] != shapes:
            raise StepFailed(
                f"the XLA module was exported at the static shapes {shapes} and runs only those, "
                f"not {[a.shape for a in arrays]}"
            )
        return [np.asarray(a, dtype=v.dtype) for a, v in zip(arrays, self.avals, strict=True)]

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        import jax

        if self.compiled is None:
            raise StepFailed("no model loaded")
        arrays = self.feeds.get(req["feeds"], self._static_feed)
        start = time.perf_counter_ns()
        result = jax.block_until_ready(self.compiled(*arrays))
        outs = [np.asarray(o) for o in jax.tree_util.tree_leaves(result)]
        ns = time.perf_counter_ns() - start
        if req["out"]:
            write_arrays(req["out"], outs)
        return {"ns": ns}
