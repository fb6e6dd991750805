"""The XLA backend for real on a small CNN, in its own environment (scripts/setup-backend-env.sh xla;
`make test` builds it): torch.export here (torch 2.15), torchax and jax.export there (torch 2.9),
the module validated against eager and timed by JAX's XLA CPU runtime in that environment's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kompile.api.spec import Target
from kompile.compile_jobs.backends.base import BackendError, Feeds
from kompile.compile_jobs.benchmark import SelfTimed
from kompile.compile_jobs.build import compile_request
from tests.pipeline.conftest import (
    IMAGE,
    build_and_compare,
    cnn_feeds,
    compile_for_a_stood_in_gpu,
    require_environment,
    run_in_environment,
    run_static_target,
)


@pytest.fixture(scope="module", autouse=True)
def _xla_environment() -> None:
    require_environment("xla")


@pytest.fixture(scope="module")
def feeds() -> list[Feeds]:
    return cnn_feeds(4)


def test_fp32_module_matches_eager_and_is_timed_in_its_environment(
    feeds: list[Feeds], tmp_path: Path
) -> None:
    from models.small import small_cnn

    target = Target(name="cpu-xla", backend="xla", precision="fp32")
    artifact, runner, verdict = build_and_compare(target, small_cnn(), [IMAGE], feeds, tmp_path)
    try:
        assert verdict.passed, verdict.failures
        assert min(o.cosine for o in verdict.outputs) > 0.99999
        assert artifact.model_path.name == "model.xla" and artifact.serving is None
        o = artifact.options
        assert o["threads"] == "2" and o["converter"] == "torchax" and o["weights"] == "baked"
        assert o["exportedStatic"] == "input=[1, 3, 32, 32]" and o["xlaInputDtypes"] == "float32"
        assert o["xlaDevice"] == "cpu" and o["stablehloPlatforms"] == "cpu"
        assert artifact.toolchain["torch"] == "2.9.1" and artifact.toolchain["torchax"] == "0.0.13"
        assert artifact.toolchain["jaxlib"] == "0.10.2"
        assert runner.output_names == ["output"]
        timed = runner.timed(feeds[0])
        assert isinstance(timed, SelfTimed) and timed.ns > 0
        with pytest.raises(BackendError, match=r"exported at the static shapes \[\(1, 3, 32, 32\)\]"):
            runner.run({"input": np.zeros((2, 3, 32, 32), np.float32)})
    finally:
        runner.close()


class _Airy(torch.nn.Module):
    """A convolution, then an op torchax has no lowering for (aten.special_airy_ai)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.airy_ai(self.conv(x))


def test_an_op_torchax_cannot_lower_is_named_with_its_source_line(feeds: list[Feeds], tmp_path: Path) -> None:
    target = Target(name="cpu-xla", backend="xla", precision="fp32")
    with pytest.raises(BackendError) as err:
        build_and_compare(target, _Airy().eval(), [IMAGE], feeds, tmp_path)
    message = str(err.value)
    assert message.startswith("torchax could not lower the model to StableHLO at node special_airy_ai")
    assert "aten.special_airy_ai.default" in message and "test_xla_backend.py" in message


def test_kompile_run_validates_and_times_an_xla_target(kompile_run: Any, write_manifest: Any) -> None:
    run_static_target(kompile_run, write_manifest, "xla", "fp32")


def _cuda_request(feeds: list[Feeds], out: Path) -> Any:
    from models.small import small_cnn

    target = Target(name="gpu-xla", backend="xla", precision="fp32")
    return compile_request(
        target, module=small_cnn(), out_dir=out, signature=[IMAGE], feeds=feeds[:1], device="cuda"
    )


def test_a_cuda_module_is_exported_for_the_cuda_platform(
    feeds: list[Feeds], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JAX lowers for the cuda platform without a GPU; XLA compiles the module for the GPU where it is
    # loaded.
    refused = r"JAX has no cuda device here: .+; run this target on a GPU node"
    artifact = compile_for_a_stood_in_gpu("xla", _cuda_request(feeds, tmp_path), monkeypatch, refused)
    o = artifact.options
    assert (o["xlaDevice"], o["computeCapability"], o["stablehloPlatforms"]) == ("cuda", "9.0", "cuda")
    # Full fp32 asked of every convolution and matmul: XLA's default runs them in TF32 on NVIDIA
    # GPUs, which put MobileNetV2's logits 0.0185 off on an H100 (the fp32 gate allows 1e-3).
    assert o["matmulPrecision"] == "highest"
    assert _precisions(artifact.model_path) == {"HIGHEST"}


def _precisions(module: Path) -> set[str]:
    """The precisions the serialized module's convolutions and dot products ask for."""
    code = (
        "import re, sys, jax\n"
        "text = jax.export.deserialize(bytearray(open(sys.argv[1], 'rb').read())).mlir_module()\n"
        "kinds = ('stablehlo.convolution', 'stablehlo.dot_general')\n"
        "ops = [ln for ln in text.splitlines() if any(k in ln for k in kinds)]\n"
        "assert ops, 'no convolution or dot'\n"
        "print(' '.join(sorted({p for ln in ops for p in re.findall(r'(DEFAULT|HIGH|HIGHEST)\\b', ln)} "
        "| ({'NONE'} if any('precision' not in ln for ln in ops) else set()))))\n"
    )
    return set(
        run_in_environment("xla", ["-c", code, str(module)], module.parent, JAX_PLATFORMS="cpu").split()
    )
