"""Catalog entry: the null backend, a STAND-IN (compile_jobs/backends/null.py).

It "compiles" instantly to a copy of the source that runs eagerly, with knobs to fail the compile
or the validation or to be slow, so the orchestration around compilers (candidates, skips, failure
isolation, selection, the cache, registration) is tested in seconds, and a cluster's wiring (Jobs,
store, MLflow) can be dry-run without compiling anything. Never offered by auto, never served.
"""

from __future__ import annotations

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag


class NullOptions(BackendOptions):
    """Knobs of the null stand-in."""

    fail_compile: Flag = Field(default=False, description="The compile fails (CompileFailed).")
    perturb: float = Field(
        default=0.0,
        ge=0,
        description="Noise of this relative size added to every output (fails validation when large).",
    )
    latency_ms: Count = Field(default=0, description="Sleep this long in every run (a slow artifact).")
    drift_ms: Count = Field(
        default=0, description="Each run sleeps this much longer than the one before (figures never settle)."
    )
    compile_ms: Count = Field(default=0, description="Sleep this long in the compile.")


ENTRY = BackendEntry(
    name="null",
    summary="Stand-in for tests and dry runs: the source run eagerly; never offered by auto, never served.",
    devices=("cpu", "cuda"),
    precisions=frozenset({"fp32", "fp16", "bf16", "int8"}),
    consumes="torch",
    options=NullOptions,
    extra="torch",
    version_from=("torch",),
    serving=None,
    stand_in=True,
)
