"""Pipeline tests run the real pipeline (torch export, ONNX Runtime, MLflow on SQLite) on small models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from kompile.api.spec import InputSpec
from kompile.cli import app
from kompile.compile_jobs.backends.base import Feeds

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# The example factories (examples/models) are importable in tests as `models.*`, as in manifests.
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
# The small CNN's input (examples/models/small.py), batch dynamic at opt 1.
IMAGE = InputSpec.model_validate(
    {
        "name": "input",
        "shape": [-1, 3, 32, 32],
        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 16}],
    }
)


class RunResult:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @property
    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc


@pytest.fixture
def kompile_run(tmp_path: Path) -> Callable[..., RunResult]:
    """Run `kompile run --json` in-process with its stores under tmp_path."""

    def run(manifest: Path, *extra: str) -> RunResult:
        runner = CliRunner()
        res = runner.invoke(
            app,
            ["run", str(manifest), "--json", "--work-dir", str(tmp_path / ".kompile"), *extra],
            catch_exceptions=False,
        )
        return RunResult(res.exit_code, res.stdout, res.stderr)

    return run


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a manifest next to a copy of examples/models so python:// sources resolve."""
    shutil.copytree(EXAMPLES / "models", tmp_path / "models", dirs_exist_ok=True)

    def write(doc: dict[str, Any], name: str = "m.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc))
        return path

    return write


def small_cnn_doc(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "small"},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [
                {
                    "name": "input",
                    "shape": [-1, 3, 32, 32],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 16}],
                }
            ],
            "targets": [{"name": "cpu-fp32", "backend": "onnxruntime", "precision": "fp32"}],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
        },
    }
    doc["spec"].update(spec)
    return doc


def installed_module(tmp_path: Path, name: str, code: str) -> Path:
    """`code` as the module `name` in a site-packages folder (returned): installed code, whose
    tracer warnings the export lets pass."""
    folder = tmp_path / "site-packages"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(code)
    return folder


def torchscript_onnx(
    model: Any, feed: dict[str, Any], path: Path, dynamic: dict[str, dict[int, str]], output: str
) -> Path:
    """The example model exported with the TorchScript exporter (opset 17), as backend tests want
    a fixed ONNX file without running the pipeline's export stage."""
    import warnings

    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            model,
            tuple(torch.from_numpy(a) for a in feed.values()),
            str(path),
            input_names=list(feed),
            output_names=[output],
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    return path


def contrib_attention_request(tmp_path: Path, backend: str, **options: str) -> Any:
    """A compile request for a graph with ONNX Runtime's com.microsoft Attention, as its transformer
    optimizer writes it into BERT exports (one fused node per layer): ONNX Runtime runs it (the
    reference), other compilers may not know it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from kompile.api.spec import Target
    from kompile.compile_jobs.build import compile_request

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32), "qkv_weight"),
        numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "qkv_bias"),
        # Each sequence's length: the 1-D mask the optimizer's EmbedLayerNormalization hands on.
        numpy_helper.from_array(np.array([8], np.int32), "mask_index"),
    ]
    node = helper.make_node(
        "Attention",
        ["input", "qkv_weight", "qkv_bias", "mask_index"],
        ["output"],
        domain="com.microsoft",
        num_heads=2,
    )
    graph = helper.make_graph(
        [node],
        "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 16])],
        initializer=weights,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    path = tmp_path / "attention.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), path)
    spec = InputSpec.model_validate({"name": "input", "shape": [1, 8, 16]})
    target = Target(name=f"cpu-{backend}", backend=backend, options=options or None)
    feed = {"input": rng.standard_normal((1, 8, 16)).astype(np.float32)}
    return compile_request(target, onnx_path=path, out_dir=tmp_path, signature=[spec], feeds=[feed])


def bert_tiny_case(
    out: Path, seq: int = 16, batch: int = 2, samples: int = 4
) -> tuple[Any, Path, list[Any], list[Any]]:
    """The 2-layer BERT exported with dynamic batch and sequence, reference feeds whose later rows
    are right-padded (the attention mask must be honoured), and its signature: (module, ONNX path,
    feeds, signature)."""
    import numpy as np
    from models.transformer import bert_tiny  # type: ignore[import-not-found]

    from kompile.api.spec import InputSpec

    rng = np.random.default_rng(0)
    feeds = []
    for i in range(samples):
        mask = np.ones((batch, seq), dtype=np.int64)
        mask[1:, seq // 2 + i :] = 0
        feeds.append(
            {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64), "attention_mask": mask}
        )
    model = bert_tiny()
    dyn = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "last_hidden_state")}
    path = torchscript_onnx(model, feeds[0], out / "bert_tiny.onnx", dyn, "last_hidden_state")
    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": batch, "max": 8},
        {"axis": 1, "name": "seq", "min": 1, "opt": seq, "max": 128},
    ]
    sig = [
        InputSpec.model_validate({"name": n, "dtype": "int64", "shape": [-1, -1], "dynamicDims": dims})
        for n in ("input_ids", "attention_mask")
    ]
    return model, path, feeds, sig


def require_environment(name: str) -> None:
    """A backend's own environment, which `make test` builds: run by hand without it, each test
    fails saying how to build it (a skip would let CI pass without ever running the backend)."""
    from kompile.compile_jobs.environments import EnvironmentMissing, find_environment

    try:
        find_environment(name)
    except EnvironmentMissing as missing:
        pytest.fail(str(missing))


def run_benchmark(script: Path, *args: str, **env: str) -> dict[str, Any]:
    """A script under benchmarks/ run as a user runs it (this interpreter, the repository on
    PYTHONPATH, `env` added): its JSON report, the test failing with its stderr's tail otherwise."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), **env},
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def fresh_kompile(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kompile *args` in a fresh process, as a user's shell runs it (what a package prints as it
    is first imported shows there, not in this test process that imported it already)."""
    return subprocess.run(
        [sys.executable, "-m", "kompile.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=600,
    )


def run_in_environment(name: str, args: list[str], scratch: Path, **env: str) -> str:
    """`python *args` run by environment `name`'s python as its steps run (kompile importable beside
    the environment's own packages, nothing of the project venv's), with `env` added; its stdout,
    the test failing with its stderr tail where it fails."""
    from kompile.compile_jobs.environments import _kompile_only_path, find_environment

    done = subprocess.run(
        [str(find_environment(name) / "bin" / "python"), *args],
        env={**os.environ, "PYTHONPATH": str(_kompile_only_path(scratch)), "PYTHONNOUSERSITE": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def build_and_compare(
    target: Any,
    module: Any,
    signature: list[InputSpec],
    feeds: list[Any],
    out: Path,
    onnx_path: Path | None = None,
) -> tuple[Any, Any, Any]:
    """Compile a target with its backend (2 threads), load the artifact back and compare its
    outputs on the feeds with eager's under the precision's thresholds: (artifact, runner, verdict)."""
    from kompile.compile_jobs import run_results
    from kompile.compile_jobs.backends.base import get_backend
    from kompile.compile_jobs.build import compile_request
    from kompile.compile_jobs.validate import resolve_thresholds

    request = compile_request(
        target, module=module, out_dir=out, signature=signature, feeds=feeds, threads=2, onnx_path=onnx_path
    )
    backend = get_backend(target.backend)
    artifact = backend.compile(request)
    runner = backend.load(artifact, threads=2)
    name = f"{target.backend}-{target.precision}"
    outputs = request.reference.with_outputs(name, [runner.run(f) for f in feeds])
    verdict = run_results.compare(request.reference, outputs, resolve_thresholds(target.precision))
    return artifact, runner, verdict


def run_static_target(
    kompile_run: Callable[..., RunResult],
    write_manifest: Callable[[dict[str, Any]], Path],
    backend: str,
    precision: str = "fp32",
) -> dict[str, Any]:
    """`kompile run` of the small CNN with one target on a backend that exports at the signature's
    opt shape (batch 1): it succeeds, validated and stored, says so, and is timed only at batch 1
    (left out of batch 2's rounds). The target's status, for the caller's own checks."""
    doc = small_cnn_doc(targets=[{"name": f"cpu-{backend}", "backend": backend, "precision": precision}])
    doc["spec"]["benchmark"]["batchSizes"] = [1, 2]
    res = kompile_run(write_manifest(doc))
    target: dict[str, Any] = res.status["targets"][0]
    assert target["phase"] == "Succeeded", target
    assert target["validation"]["passed"] and target["artifact"]["uri"].startswith("file://")
    assert target["message"].startswith("exported at static shapes input=[1, 3, 32, 32]")
    assert [s["batchSize"] for s in target["latency"]] == [1]
    assert target["speedup"] > 0
    return target


def cnn_feeds(count: int) -> list[Feeds]:
    """`count` seeded random images at the small CNN's batch-1 shape (1, 3, 32, 32)."""
    rng = np.random.default_rng(0)
    return [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(count)]


def compile_for_a_stood_in_gpu(
    name: str,
    request: Any,
    monkeypatch: pytest.MonkeyPatch,
    refused: str,
    capability: tuple[int, int] = (9, 0),
) -> Any:
    """Backend `name` compiling `request` (device cuda) with the node's GPU probe stood in (an H100's
    compute capability 9.0 by default): the compile steps need no GPU. Returns the artifact; where no
    GPU exists, also checks that loading it fails with a message matching `refused` (tests/gpu
    validates it on a GPU)."""
    import importlib

    import torch

    from kompile.compile_jobs.backends.base import BackendError, get_backend

    module = importlib.import_module(f"kompile.compile_jobs.backends.{name}")
    monkeypatch.setattr(module, "local_cuda_capability", lambda: capability)
    backend = get_backend(name)
    artifact = backend.compile(request)
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match=refused):
            backend.load(artifact)
    return artifact


def run_compile_job(
    monkeypatch: pytest.MonkeyPatch,
    doc: dict[str, Any],
    target: Any,
    root: Path,
    source_dir: Path,
    prefix: str | None = None,
    **told: Any,
) -> tuple[int, Any]:
    """`kompile-job` in-process as a pod runs it: the artifact store under root/store, the pod's
    emptyDir root/scratch (also its HOME and TMPDIR, holding the termination log as in the kubelet
    stand-in), unless `prefix` names another artifact prefix; `told`: more JobSpec fields. Its exit
    code and the status its termination message carries (None where it wrote none)."""
    from kompile.api.job_contract import JobSpec, parse_compact
    from kompile.compile_jobs import job

    scratch = root / "scratch"
    scratch.mkdir(exist_ok=True)
    spec = JobSpec(
        compiled_model={**doc, "metadata": {"name": "small", "uid": "u", "generation": 1}},
        target=target,
        hardware_class="cpu-x86-64-avx2",
        device="cpu",
        artifact_prefix=prefix or (root / "store" / "cache" / "k").as_uri(),
        work_dir=str(scratch),
        **told,
    )
    for item in spec.to_env():
        monkeypatch.setenv(item["name"], item["value"])
    monkeypatch.setenv("KOMPILE_SOURCE_DIR", str(source_dir))
    monkeypatch.setenv("KOMPILE_TERMINATION_LOG", str(scratch / "termination-log"))
    monkeypatch.setenv("HOME", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    with pytest.raises(SystemExit) as exited:
        job.main()
    log = scratch / "termination-log"
    status = parse_compact(log.read_text())[0] if log.exists() else None  # none: an exit to retry
    return int(exited.value.code or 0), status
