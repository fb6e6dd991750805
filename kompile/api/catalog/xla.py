"""Catalog entry: XLA through JAX for CPUs and NVIDIA GPUs (compile_jobs/backends/xla.py): torchax
turns the torch program into StableHLO, `jax.export` serializes it, JAX's XLA runtime (CPU, or its
CUDA plugin) runs it. Built and run in the backend's own environment (requirements/env-xla.txt:
torchax 0.0.13 imports only with torch 2.9)."""

from __future__ import annotations

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count


class XlaOptions(BackendOptions):
    """XLA options."""

    intra_op_threads: Count = Field(
        default=0,
        description="Cores the XLA CPU runtime uses at validation and timing (its thread pool is sized "
        "from the process's CPU affinity); 0: the run's, else all cores.",
    )


ENTRY = BackendEntry(
    name="xla",
    summary="torchax + jax.export + JAX's XLA runtime: a serialized StableHLO module with the weights "
    "baked in; fp32. Converted at a static shape (the signature's opt). CPU classes run it on XLA's CPU "
    "runtime; NVIDIA GPU classes get it exported for the cuda platform, compiled at load by JAX's CUDA 12 "
    "plugin. Runs in its own environment (scripts/setup-backend-env.sh xla). No server runs jax.export "
    "artifacts: not rolled out.",
    devices=("cpu", "cuda"),
    precisions=frozenset({"fp32"}),
    consumes="torch",
    options=XlaOptions,
    extra="torch",
    version_from=("jax", "jaxlib", "torchax", "torch"),
    serving=None,
    environment="xla",
)
