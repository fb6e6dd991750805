"""MLflow model names are global, CompiledModels are namespaced: a registered model belongs to the
namespace whose CompiledModel created it (tag kompile.namespace), and a CompiledModel of another
namespace naming it is refused (Registered=False and Ready=False, reason ModelNameTaken) before any
run or version is added. Real MLflow (its SQLite store), no stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kompile.api.resource import parse_manifest
from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus, Thresholds, ValidationResult
from kompile.operator.lineage import register_generation
from kompile.operator.settings import Settings
from tests.pipeline.conftest import small_cnn_doc


def _status() -> CompiledModelStatus:
    target = TargetStatus(
        name="cpu-fp32",
        backend="onnxruntime",
        precision="fp32",
        phase="Succeeded",
        artifact=Artifact(uri="s3://bucket/small/cpu-fp32", digest="sha256:" + "a" * 64),
        validation=ValidationResult(passed=True, samples=1, thresholds=Thresholds(min_cosine=0.99, top_k=1)),
    )
    return CompiledModelStatus(targets=[target], source_digest="sha256:" + "b" * 64)


def _register(
    namespace: str, uri: str, events: list[tuple[str, str, str]], generation: int = 1
) -> CompiledModelStatus:
    doc = small_cnn_doc(registry={"modelName": "shared"})
    doc["metadata"] |= {"namespace": namespace, "uid": f"uid-{namespace}", "generation": generation}
    status = _status()
    register_generation(parse_manifest(doc), status, Settings(tracking_uri=uri), lambda *e: events.append(e))
    return status


def _condition(status: CompiledModelStatus, type_: str) -> Any:
    return next((c for c in status.conditions if c.type == type_), None)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A database store without a server keeps run artifacts in ./mlruns of the working directory.
    monkeypatch.chdir(tmp_path)


def test_a_model_name_of_another_namespace_is_refused_before_any_version(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    events: list[tuple[str, str, str]] = []
    owner = _register("team-a", uri, events)
    assert owner.registry is not None and owner.targets[0].registered_version == "1"
    assert client.get_registered_model("shared").tags["kompile.namespace"] == "team-a"

    intruder = _register("team-b", uri, events)
    assert intruder.registry is None and intruder.targets[0].registered_version is None
    for type_ in ("Registered", "Ready"):
        cond = _condition(intruder, type_)
        assert cond is not None and cond.status == "False" and cond.reason == "ModelNameTaken"
        assert "belongs to namespace team-a" in cond.message and "spec.registry.modelName" in cond.message
    assert [str(v.version) for v in client.search_model_versions("name='shared'")] == ["1"]
    assert client.get_experiment_by_name("kompile/team-b/small") is None  # no run either
    assert events[-1][:2] == ("Warning", "ModelNameTaken")

    # The owner's next generation still registers.
    assert _register("team-a", uri, events, generation=2).targets[0].registered_version == "2"


def test_a_model_kompile_did_not_create_is_refused(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_registered_model("shared")  # made by hand in the MLflow UI
    status = _register("team-a", uri, [])
    cond = _condition(status, "Registered")
    assert cond is not None and cond.reason == "ModelNameTaken"
    assert "kompile.namespace=team-a" in cond.message  # how its owner claims it


def test_the_refusal_holds_still_across_reconciles(tmp_path: Path) -> None:
    """Each reconcile summarizes Ready from the targets (True: all validated) before the registry
    refuses (False): the condition's lastTransitionTime must not move every time."""
    import time

    from mlflow import MlflowClient

    from kompile.operator.jobs import ANNOTATION_PREFIX
    from kompile.operator.reconcile import reconcile
    from tests.unit.test_tenant_isolation import RecordingKube, _validated_entry, doc

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_registered_model("m")  # made by hand: not team-a's
    settings = Settings(artifact_store=(tmp_path / "store").as_uri(), tracking_uri=uri)
    first = RecordingKube()
    reconcile(doc("team-a", "u-a"), first, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    _validated_entry(first.jobs[0]["metadata"]["annotations"][ANNOTATION_PREFIX])

    def ready_after(status: dict[str, Any] | None) -> dict[str, Any]:
        kube = RecordingKube()
        again = doc("team-a", "u-a2") | {"status": status or {}}
        reconcile(again, kube, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
        # A status equal to the one read is not written: what is stored stands.
        return kube.patches[-1] if kube.patches else (status or {})

    status = ready_after(None)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModelNameTaken"
    time.sleep(1.1)
    again = next(c for c in ready_after(status)["conditions"] if c["type"] == "Ready")
    assert again["reason"] == "ModelNameTaken"
    assert again["lastTransitionTime"] == ready["lastTransitionTime"]
