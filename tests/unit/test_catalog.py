"""The backend catalog (kompile.api.catalog) is the one place that says what a backend is: every
backend module has its entry and every entry its module, the versions that key the cache are the
pinned ones, and the places that used to restate backend facts now derive them."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

from kompile.api.catalog import (
    CATALOG,
    BackendOptions,
    OptionsError,
    auto_backends,
    auto_left_out,
    auto_summary,
    check_options,
    entry,
    options_for,
)
from kompile.api.toolchain import ENVIRONMENT_PINNED, IMAGE_PROVIDED, PINNED
from kompile.compile_jobs import backends as backend_pkg
from kompile.compile_jobs.backends.base import Backend, get_backend

ROOT = Path(__file__).resolve().parents[2]


def _backend_modules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(backend_pkg.__path__)} - {"base"}


def test_every_backend_module_has_an_entry_and_every_entry_a_module() -> None:
    assert _backend_modules() == set(CATALOG), "a backend is one module plus one catalog entry"


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_backend_class_reads_what_it_is_from_its_entry(name: str) -> None:
    backend = get_backend(name)
    e = CATALOG[name]
    assert isinstance(backend, Backend) and backend.name == name and backend.entry is e
    assert backend.precisions == e.precisions
    assert all(backend.supports_device(d) for d in e.devices)
    assert not backend.supports_device("tpu")
    # Nothing restated on the class: name is its only own attribute of what it is.
    own = {k for k in vars(type(backend)) if not k.startswith("_") and not callable(getattr(backend, k))}
    assert own <= {"name"}, own
    assert issubclass(e.options, BackendOptions)
    assert e.devices and set(e.auto_on) <= set(e.devices)
    assert e.extra in _pyproject_extras(), f"pip extra {e.extra!r} of {name} is not in pyproject.toml"
    if e.serving is not None:
        assert e.serving.files and all("." in f for f in e.serving.files)


def _pyproject_extras() -> set[str]:
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(doc["project"]["optional-dependencies"])


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_options_defaults_round_trip_through_the_wire_form(name: str) -> None:
    e = CATALOG[name]
    defaults = e.parse_options({})
    assert e.parse_options(defaults.record()) == defaults
    assert set(defaults.record()) <= set(e.options.wire_names())
    with pytest.raises(OptionsError, match=rf"unknown {name} option\(s\) \['noSuchOption'\]"):
        e.parse_options({"noSuchOption": "1"})


def _pin(dist: str) -> str | None:
    for path in ("requirements/lock.txt", "requirements/modelopt.txt", "requirements/edge.txt"):
        for line in (ROOT / path).read_text().splitlines():
            if line.lower().startswith(f"{dist.lower()}=="):
                return line.split("==", 1)[1].split(";")[0].strip()
    return None


def test_cache_key_versions_are_the_lock_files_pins() -> None:
    dists = {d for e in CATALOG.values() if not e.environment for d in e.version_from} - IMAGE_PROVIDED
    assert set(PINNED) == dists
    for dist in dists:
        assert PINNED[dist] == _pin(dist), (
            f"kompile/api/toolchain.py PINNED[{dist!r}] drifted from the lock files"
        )


def test_own_environments_key_with_their_own_pins() -> None:
    """A backend with its own environment keys the cache with requirements/env-<name>.txt's pins
    (litert's torch is 2.14.1, not the project's 2.15.0)."""
    from kompile.operator.settings import Settings

    envs = {e.environment for e in CATALOG.values() if e.environment}
    assert envs == set(ENVIRONMENT_PINNED)
    for e in (e for e in CATALOG.values() if e.environment):
        lines = (ROOT / "requirements" / f"env-{e.environment}.txt").read_text().splitlines()
        pins = {ln.split("==")[0].lower(): ln.split("==")[1] for ln in lines if "==" in ln}
        own = ENVIRONMENT_PINNED[e.environment or ""]
        assert set(own) == set(e.version_from)
        assert all(pins[d] == v for d, v in own.items()), f"env-{e.environment}.txt drifted from {own}"
        assert Settings().backend_versions[e.name] == e.version_string(own)
    assert Settings().backend_versions["litert"].endswith("+torch=2.14.1")


@pytest.mark.parametrize("name", ["onnxruntime", "inductor", "null"])
def test_installed_backend_version_is_the_one_the_operator_keys_with(name: str) -> None:
    from kompile.operator.settings import Settings

    assert get_backend(name).version() == Settings().backend_versions[name]


def test_tensorrt_version_comes_from_the_gpu_image_setting() -> None:
    from kompile.operator.settings import Settings

    versions = Settings.from_env({"KOMPILE_GPU_TENSORRT_VERSION": "10.13.3.9"}).backend_versions
    assert versions["tensorrt"] == f"10.13.3.9+nvidia-modelopt={PINNED['nvidia-modelopt']}"
    assert Settings.from_env({}).backend_versions["tensorrt"].startswith("unknown+")
    assert (
        Settings.from_env({"KOMPILE_BACKEND_VERSIONS": "inductor=9.9"}).backend_versions["inductor"] == "9.9"
    )


def test_auto_offers_each_device_its_candidates() -> None:
    # executorch and litert join only on arm64 CPU classes (edge boxes); on x86-64 servers the
    # winner stays one KServe can serve, and their int8 there was within noise of ONNX Runtime's.
    assert auto_backends("cpu", "amd64") == ("onnxruntime", "openvino", "inductor")
    assert auto_backends("cpu", "arm64") == ("onnxruntime", "openvino", "inductor", "executorch", "litert")
    assert auto_backends("cpu") == auto_backends("cpu", "arm64")  # unknown arch: any class's
    assert auto_backends("cuda", "arm64") == auto_backends("cuda") == ("tensorrt", "inductor")
    assert "null" not in auto_backends("cpu") + auto_backends("cuda")
    assert auto_summary("cpu") == "onnxruntime, openvino, inductor (and executorch on arm64, litert on arm64)"


def test_auto_says_why_a_backend_is_left_out_on_an_architecture() -> None:
    why = dict(auto_left_out("cpu", "amd64"))
    assert list(why) == ["executorch", "litert"]
    assert "arm64 CPU classes only" in why["executorch"] and "11.9 vs 12.5 ms" in why["executorch"]
    assert "12.3 vs 12.5 ms" in why["litert"]
    assert auto_left_out("cpu", "arm64") == [] and auto_left_out("cuda", "amd64") == []


def test_onnxruntime_model_types_are_the_optimizers() -> None:
    from typing import get_args

    from onnxruntime.transformers.optimizer import MODEL_TYPES

    from kompile.api.catalog.onnxruntime import OrtModelType

    assert set(get_args(OrtModelType)) == {"auto", "none", *MODEL_TYPES}


def test_auto_options_go_to_the_candidates_that_know_them() -> None:
    check_options("auto", {"intraOpThreads": "2", "optLevel": "all", "device": "cpu"})  # no tensorrt on cpu
    assert options_for("inductor", {"intraOpThreads": "2", "optLevel": "all"}) == {"intraOpThreads": "2"}
    with pytest.raises(OptionsError, match="candidate tensorrt gets these options too"):
        check_options("auto", {"optLevel": "all"})  # a cuda class would hand it to tensorrt
    with pytest.raises(OptionsError, match=r"unknown option\(s\) \['bogus'\] for backend auto"):
        check_options("auto", {"bogus": "1"})
    with pytest.raises(OptionsError, match="device='tpu'"):
        check_options("auto", {"device": "tpu"})
    with pytest.raises(OptionsError, match=r"onnxruntime builds for \['cpu'\]"):
        check_options("onnxruntime", {"device": "cuda"})
    with pytest.raises(ValueError, match="unknown backend 'mxnet'"):
        entry("mxnet")


def test_rollout_and_pipeline_derive_serving_facts_from_the_catalog() -> None:
    from kompile.operator import rollout

    served = {n: e.serving for n, e in CATALOG.items() if e.serving}
    assert {n: s.kserve_format for n, s in served.items()} == rollout.MODEL_FORMATS
    for s in served.values():
        for f in s.files:
            assert rollout.storage_uri(f"s3://b/root/m/1/{f}") == "s3://b/root"
    assert "null" not in rollout.MODEL_FORMATS


def test_the_crd_refuses_unknown_option_keys_per_backend() -> None:
    from kompile.api.crd import build_crd

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    target = schema["properties"]["spec"]["properties"]["targets"]["items"]
    rules = [r["rule"] for r in target["x-kubernetes-validations"] if "self.options.all" in r["rule"]]
    (rule,) = rules
    for name, e in CATALOG.items():
        assert f"self.backend == '{name}'" in rule
        assert all(f"'{k}'" in rule for k in e.options.wire_names())
    assert re.search(r"self\.backend == 'auto' \? \[[^\]]*'optLevel'", rule)
    assert target["properties"]["options"]["maxProperties"] == 32
    candidate = target["properties"]["candidates"]["items"]
    assert any("self.options.all" in r["rule"] for r in candidate["x-kubernetes-validations"])
    assert target["properties"]["backend"]["enum"] == ["auto", *CATALOG]


def test_edge_extras_pin_what_the_edge_requirements_pin() -> None:
    """requirements/edge.txt (the venv, --no-deps) and the executorch/coreml extras (images) agree on
    the edge packages, and the edge file changes no version that lock.txt or modelopt.txt pins."""
    import tomllib

    pins = {
        line.split("==")[0].lower(): line.split("==")[1]
        for line in (ROOT / "requirements" / "edge.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("executorch", "coreml"):
        for req in (r for r in extras[extra] if "==" in r):
            name, version = req.split("==")
            assert pins[name.lower()] == version, f"extra {extra} pins {req}, edge.txt {pins.get(name)}"
    for other in ("lock.txt", "modelopt.txt"):
        text = (ROOT / "requirements" / other).read_text().lower()
        assert not [p for p in pins if f"\n{p}==" in text], f"edge.txt restates a pin of {other}"
