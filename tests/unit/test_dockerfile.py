"""The Dockerfile, checked without a Docker engine: hadolint (scripts/install-tools.sh installs it), and
every install it does is one CI exercises otherwise (the extras exist, versions come from the lock CI
builds its venv from, the operator image's dependency closure holds no torch or compiler)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from fnmatch import fnmatch
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
STAGES = {
    "operator": ["kompile", "operator"],
    "compile-cpu": ["kompile-job"],
    "compile-litert": ["kompile-job"],
    "compile-iree": ["kompile-job"],
    "compile-tvm": ["kompile-job"],
    "compile-xla": ["kompile-job"],
    "compile-envs": ["kompile-job"],
    "compile-gpu": ["kompile-job"],
    "compile-gpu-envs": ["kompile-job"],
}
ENV_STAGES = {"compile-litert": "litert", "compile-iree": "iree", "compile-tvm": "tvm", "compile-xla": "xla"}
"""Stages that add a backend's own environment to the CPU image (no pip install of their own)."""
ALL_ENVS_STAGE = "compile-envs"
"""The stage that adds every own environment (for targets whose candidates need several)."""
GPU_ENVS_STAGE = "compile-gpu-envs"
"""The GPU image plus the own environments of the backends that also build for cuda."""
HEAVY = {"torch", "torchvision", "onnxruntime", "onnxruntime-gpu", "tensorrt", "onnx"}


@cache
def hadolint() -> Path:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-tools.sh")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"scripts/install-tools.sh failed:\n{result.stderr}"
    return Path(result.stdout.strip().splitlines()[-1]) / "hadolint"


def instructions() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) for each instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: list[tuple[str, str, str]] = []
    stage = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            stage = args.split(" AS ")[-1].strip() if " AS " in args else ""
        out.append((stage, op.upper(), args.strip()))
    return out


def args_defaults() -> dict[str, str]:
    return dict(a.split("=", 1) for s, op, a in instructions() if op == "ARG" and not s and "=" in a)


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [str(hadolint()), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert json.loads(result.stdout or "[]") == [] and result.returncode == 0, result.stdout + result.stderr


def test_base_images_are_pinned() -> None:
    froms = {s: a.split(" AS ")[0] for s, op, a in instructions() if op == "FROM"}
    assert set(froms) == set(STAGES)
    images = {s: args_defaults().get(f.strip("${}"), f) for s, f in froms.items()}
    # Exact Python patch release and Debian release: a rebuild cannot move either silently.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", images["operator"]), images
    assert images["compile-cpu"] == images["operator"]
    assert images["compile-litert"] == images["compile-xla"] == "compile-cpu"  # CPU image + environment
    assert images["compile-iree"] == images["compile-tvm"] == images["compile-envs"] == "compile-cpu"
    # A monthly NGC release; TensorRT plans are tied to its TensorRT version.
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:\d{2}\.\d{2}-py3", images["compile-gpu"]), images


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_runs_as_non_root_with_its_entrypoint(stage: str) -> None:
    own = [(op, a) for s, op, a in instructions() if s == stage]
    assert ("USER", "65532:65532") in own
    assert any(op == "WORKDIR" for op, _ in own)
    (entry,) = [json.loads(a) for op, a in own if op == "ENTRYPOINT"]
    assert entry == STAGES[stage]
    # USER comes after every RUN: nothing runs as root at run time, installs happen at build time.
    last_run = max(i for i, (op, _) in enumerate(own) if op == "RUN")
    assert own.index(("USER", "65532:65532")) > last_run


_PIP = r'pip install --no-cache-dir -c (\S+) "\.\[([a-z0-9,]+)\]"'
_ON_AMD64 = re.compile(r'if \[ "\$\{TARGETARCH\}" = "amd64" \];\s*then\s+(.*?);\s*fi')


def pip_installs(amd64_only: bool = False) -> dict[str, tuple[str, set[str]]]:
    """stage -> (constraints file, extras) of its `pip install` for every architecture, or with
    amd64_only of the one inside `if [ "${TARGETARCH}" = "amd64" ]` (stages that have one)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for stage, op, args in instructions():
        if op == "RUN" and "pip install" in args:
            guarded = " ".join(_ON_AMD64.findall(args))
            rest = _ON_AMD64.sub("", args)
            assert "pip install" not in guarded or re.search(_PIP, guarded), f"{stage}: {guarded}"
            m = re.search(_PIP, guarded if amd64_only else rest)
            if m is None and amd64_only:
                continue
            assert m, f"{stage}: pip install must use the lock as constraints and name extras: {args}"
            out[stage] = (m.group(1), set(m.group(2).split(",")))
    return out


def test_installs_use_existing_extras_and_ci_lock() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = pip_installs()
    assert set(installs) == set(STAGES) - set(ENV_STAGES) - {ALL_ENVS_STAGE, GPU_ENVS_STAGE}
    setup_venv = (ROOT / "scripts" / "setup-venv.sh").read_text()
    for stage, (lock, wanted) in installs.items():
        assert wanted <= set(extras), f"{stage}: extras {wanted - set(extras)} not in pyproject.toml"
        # The same lock CI's venv is installed from: images run the versions the tests ran.
        assert f"lock={lock}" in setup_venv and (ROOT / lock).is_file()
    assert installs["operator"][1] == {"operator", "s3", "mlflow"}
    assert {"torch", "onnxruntime"} <= installs["compile-cpu"][1]


AMD64_ONLY = {"coremltools"}
"""Pinned distributions with Linux wheels for x86_64 only (coremltools 9.0; checked on PyPI)."""


def test_compile_cpu_builds_for_amd64_and_arm64() -> None:
    """One multi-arch tag (buildx --platform linux/amd64,linux/arm64): the stage reads TARGETARCH,
    installs amd64-only wheels only there, and arm64's image carries every backend auto offers on
    arm64 CPU classes."""
    from kompile.api.catalog import CATALOG, auto_backends

    text = DOCKERFILE.read_text()
    assert "--platform linux/amd64,linux/arm64 --target compile-cpu" in text
    own = [(op, a) for s, op, a in instructions() if s == "compile-cpu"]
    assert ("ARG", "TARGETARCH=amd64") in own
    assert own.index(("ARG", "TARGETARCH=amd64")) < next(i for i, (op, _) in enumerate(own) if op == "RUN")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def dists(names: set[str]) -> set[str]:
        return {canonicalize_name(Requirement(r).name) for n in names for r in extras[n]}

    everywhere = pip_installs()["compile-cpu"][1]
    lock, amd64 = pip_installs(amd64_only=True)["compile-cpu"]
    assert lock == pip_installs()["compile-cpu"][0] and amd64 == {"coreml"}
    assert not dists(everywhere) & AMD64_ONLY  # an arm64 build would fail on it
    assert dists(amd64) & AMD64_ONLY  # nothing installed only on amd64 without need
    arm64_auto = dists({CATALOG[b].extra for b in auto_backends("cpu", "arm64")})
    assert arm64_auto <= dists(everywhere), arm64_auto - dists(everywhere)
    # The GPU and operator images stay single-arch: no per-arch install there.
    assert set(pip_installs(amd64_only=True)) == {"compile-cpu"}


def _closure(names: set[str]) -> set[str]:
    """Installed distributions reachable from names (markers evaluated, extras not followed)."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_operator_image_holds_no_torch_or_compiler() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = [project["dependencies"], *(extras[g] for g in pip_installs()["operator"][1])]
    closure = _closure({Requirement(r).name for group in groups for r in group})
    # The walk reached the installed dependencies (a broken walk would pass vacuously).
    assert {"kopf", "kubernetes", "boto3", "mlflow", "sqlalchemy"} <= closure
    assert not closure & HEAVY, closure & HEAVY


@pytest.mark.parametrize("stage", sorted(ENV_STAGES))
def test_environment_stages_build_the_pinned_environment_the_pipeline_finds(stage: str) -> None:
    from kompile.compile_jobs.env_protocol import env_var
    from kompile.operator.settings import Settings

    name = ENV_STAGES[stage]
    own = [(op, a) for s, op, a in instructions() if s == stage]
    assert ("COPY", f"requirements/env-{name}.txt requirements/env-{name}.txt") in own
    assert any(op == "RUN" and f"scripts/setup-backend-env.sh {name}" in a for op, a in own)
    envs = [a for op, a in own if op == "ENV"]
    assert any(a.startswith(f"{env_var(name)}=") for a in envs)
    assert Settings().env_images[name].split("/")[-1].startswith(f"{stage}:")


def test_the_all_environments_stage_builds_every_pinned_environment_where_the_pipeline_looks() -> None:
    from kompile.api.catalog import CATALOG
    from kompile.compile_jobs.environments import ENVS_DIR
    from kompile.operator.settings import Settings

    own = [(op, a) for s, op, a in instructions() if s == ALL_ENVS_STAGE]
    assert ("COPY", "requirements/env-*.txt requirements/") in own
    run = next(a for op, a in own if op == "RUN")
    assert "for pins in requirements/env-*.txt" in run and "scripts/setup-backend-env.sh" in run
    assert f"{ENVS_DIR}=/opt/kompile/envs" in [a for op, a in own if op == "ENV"]
    # Every catalog environment has its pinned file, so the loop builds it.
    for name in {e.environment for e in CATALOG.values() if e.environment}:
        assert (ROOT / "requirements" / f"env-{name}.txt").is_file(), name
    assert Settings().envs_image.split("/")[-1].startswith(f"{ALL_ENVS_STAGE}:")


def test_the_gpu_environments_stage_builds_each_environment_a_cuda_backend_needs() -> None:
    from kompile.api.catalog import CATALOG
    from kompile.compile_jobs.environments import ENVS_DIR
    from kompile.operator.settings import Settings

    own = [(op, a) for s, op, a in instructions() if s == GPU_ENVS_STAGE]
    assert ("FROM", "compile-gpu AS compile-gpu-envs") in own
    cuda = sorted({e.environment for e in CATALOG.values() if e.environment and "cuda" in e.devices})
    assert cuda == ["iree", "tvm", "xla"]
    copied = next(a for op, a in own if op == "COPY" and a.startswith("requirements/"))
    assert copied.split()[:-1] == [f"requirements/env-{name}.txt" for name in cuda]
    run = next(a for op, a in own if op == "RUN")
    assert f"for name in {' '.join(cuda)}; do" in run and "scripts/setup-backend-env.sh" in run
    assert f"{ENVS_DIR}=/opt/kompile/envs" in [a for op, a in own if op == "ENV"]
    assert Settings().gpu_envs_image.split("/")[-1].startswith(f"{GPU_ENVS_STAGE}:")


def test_dockerignore_lets_in_what_is_copied_and_nothing_secret() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert next(line for line in ignore if not line.startswith("#")) == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for stage, op, args in instructions():
        if op == "COPY" and "--from" not in args:
            *sources, _ = args.split()
            for src in sources:
                found = list(ROOT.glob(src)) if "*" in src else [ROOT / src]
                assert found and all(p.exists() for p in found), f"{stage}: COPY {src}: no such path"
                let_in = src.rstrip("/") in allowed or any(fnmatch(src, a) for a in allowed if "*" in a)
                assert let_in, f"{stage}: COPY {src} is excluded by .dockerignore"
