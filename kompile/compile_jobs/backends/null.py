"""The null backend: a STAND-IN for a compiler, for tests and dry runs (catalog entry
kompile/api/catalog/null.py).

"Compiling" writes a copy of the source module (`torch.save` of the module) in milliseconds; its
runner loads that copy and runs it eagerly, so it validates like a perfect compiler unless told
otherwise. Knobs (options) make it fail the compile, add noise to its outputs (a failed
validation), or sleep in every run (a slow artifact), so the orchestration around compilers
(candidates, skips, failure isolation, selection, cache, registration) is tested in seconds
without a real compiler. Never offered by auto, never served.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kompile.api.catalog.null import NullOptions
from kompile.api.spec import InputSpec
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    Remedy,
    options_of,
)
from kompile.compile_jobs.export import eager_outputs

Array = np.ndarray[Any, Any]
_SIGNATURE = "signature.json"


class NullRunner:
    """Runs the saved copy eagerly, plus the knobs' noise and delay."""

    def __init__(
        self, path: Path, signature: Sequence[InputSpec], perturb: float, latency_ms: int, drift_ms: int = 0
    ) -> None:
        self.module = torch.load(path, weights_only=False).eval()
        self.signature = list(signature)
        self.input_names = [s.name for s in signature]
        self.output_names: list[str] = []
        self.perturb, self.latency_ms, self.drift_ms = perturb, latency_ms, drift_ms
        self._rng = np.random.default_rng(0)
        self._calls = 0

    def run(self, feeds: Feeds) -> list[Array]:
        self._calls += 1
        delay_ms = self.latency_ms + self.drift_ms * self._calls
        if delay_ms:
            time.sleep(delay_ms / 1000)
        outs = eager_outputs(self.module, [feeds], self.signature)[0]
        if self.perturb:
            outs = [
                o + self.perturb * (np.abs(o).mean() + 1e-6) * self._rng.standard_normal(o.shape)
                for o in outs
            ]
        return [np.asarray(o, dtype=np.float32) if o.dtype.kind == "f" else o for o in outs]


class NullBackend(Backend):
    name = "null"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        opts = options_of(request, NullOptions)
        if opts.compile_ms:
            time.sleep(opts.compile_ms / 1000)
        if opts.fail_compile:
            raise BackendError(
                f"target {request.target.name!r}: the null stand-in was told to fail (failCompile)"
            )
        if request.module is None:
            raise BackendError(f"target {request.target.name!r}: the null stand-in copies a PyTorch source")
        request.out_dir.mkdir(parents=True, exist_ok=True)
        path = request.out_dir / "model.null.pt"
        try:
            torch.save(request.module, path)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise BackendError(f"the null stand-in cannot copy this module: {err}") from err
        (request.out_dir / _SIGNATURE).write_text(
            "[" + ",".join(s.model_dump_json(by_alias=True) for s in request.signature) + "]"
        )
        record = {"standIn": "null", **opts.record(), "precision": request.target.precision}
        return CompiledArtifact(
            backend=self.name, model_path=path, options=record, toolchain={"torch": torch.__version__}
        )

    def remedies(self, failed: CompiledArtifact) -> list[Remedy]:
        """Stand-in remedies for the orchestration tests: the noise cut to a tenth, then to nothing."""
        perturb = float(failed.options.get("perturb", "0"))
        if perturb == 0:
            return []
        return [
            Remedy("calmer", "the stand-in with a tenth of the noise", {"perturb": f"{perturb / 10:g}"}),
            Remedy("still", "the stand-in without noise", {"perturb": "0"}),
        ]

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> NullRunner:
        from pydantic import TypeAdapter

        signature = TypeAdapter(list[InputSpec]).validate_json(
            (artifact.model_path.parent / _SIGNATURE).read_text()
        )
        perturb = float(artifact.options.get("perturb", "0"))
        opts = artifact.options
        latency, drift = int(opts.get("latencyMs", "0")), int(opts.get("driftMs", "0"))
        return NullRunner(artifact.model_path, signature, perturb, latency, drift)


BACKEND = NullBackend()
