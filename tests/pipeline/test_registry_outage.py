"""MLflow going away while the operator registers a generation: each attempt is bounded in time,
the outage is the Registered condition (not a silent Event), the endpoint is left alone for a
backoff, one Warning is posted however long it lasts, and once MLflow is back the generation is
recorded once. Real MLflow server behind a TCP proxy that refuses or blackholes on demand."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

import pytest

from kompile.api.resource import parse_manifest
from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus, Thresholds, ValidationResult
from kompile.operator import lineage
from kompile.operator.outages import Breaker, bound_calls
from kompile.operator.settings import Settings
from tests.pipeline.conftest import small_cnn_doc
from tests.support.faulty_proxy import FaultyProxy
from tests.support.servers import MlflowServer

TIMEOUT = 2.0


def _settled() -> CompiledModelStatus:
    targets = [
        TargetStatus(
            name=name,
            backend="onnxruntime",
            precision="fp32",
            phase="Succeeded",
            hardware_class=name,
            artifact=Artifact(uri=f"s3://art/outage/{name}", digest="sha256:" + "c" * 64),
            validation=ValidationResult(
                passed=True, samples=1, thresholds=Thresholds(min_cosine=0.99, top_k=1)
            ),
        )
        for name in ("cpu-amd64", "cpu-arm64")
    ]
    return CompiledModelStatus(targets=targets, observed_generation=1)


def _registered(status: CompiledModelStatus) -> tuple[str, str]:
    cond = next(c for c in status.conditions if c.type == lineage.REGISTERED)
    return cond.status, cond.reason


def test_an_mlflow_outage_is_bounded_shown_and_recovered_once(
    mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = urlparse(mlflow_server.tracking_uri)
    proxy = FaultyProxy((upstream.hostname or "127.0.0.1", upstream.port or 80)).start()
    settings = Settings(call_timeout_seconds=TIMEOUT)
    env: dict[str, str] = {}
    bound_calls(settings, env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    breaker = Breaker(first=1.0, cap=2.0)
    monkeypatch.setattr(lineage, "BREAKER", breaker)
    doc = small_cnn_doc(registry={"trackingUri": proxy.url, "modelName": "outage-small"})
    doc["metadata"] |= {"namespace": "team-o", "uid": "uid-outage", "generation": 1}
    cm = parse_manifest(doc)
    status = _settled()
    events: list[tuple[str, str, str]] = []
    try:
        proxy.set_mode("blackhole")
        began = time.monotonic()
        lineage.register_generation(cm, status, settings, lambda *e: events.append(e))
        took = time.monotonic() - began
        # Two tries of TIMEOUT each and MLflow's one backoff: not MLflow's default minutes.
        assert took < 4 * TIMEOUT + 5, took
        assert _registered(status) == ("False", "RegistryUnavailable")
        assert status.registry is None
        assert not lineage.settle_registered(cm, status, settings)
        assert _registered(status) == ("False", "RegistryUnavailable")  # settling keeps the failure

        # Inside the backoff: no call at all, the condition says when the next one is.
        began = time.monotonic()
        lineage.register_generation(cm, status, settings, lambda *e: events.append(e))
        assert time.monotonic() - began < 0.5
        message = next(c.message for c in status.conditions if c.type == lineage.REGISTERED)
        assert "next attempt in" in (message or "")

        proxy.set_mode("refuse")
        time.sleep(2.1)
        began = time.monotonic()
        lineage.register_generation(cm, status, settings, lambda *e: events.append(e))
        assert time.monotonic() - began < 2 * TIMEOUT + 3
        assert _registered(status) == ("False", "RegistryUnavailable")
        # One Warning for the whole outage, whatever the number of attempts.
        assert [e[1] for e in events] == ["RegistryUnavailable"]

        proxy.set_mode("forward")
        time.sleep(2.1)
        lineage.register_generation(cm, status, settings, lambda *e: events.append(e))
        assert status.registry is not None and status.registry.run_id
        assert lineage.settle_registered(cm, status, settings)
        assert _registered(status) == ("True", "Registered")
        assert [e[1] for e in events] == ["RegistryUnavailable", "Registered"]
    finally:
        proxy.stop()

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.tracking_uri)
    versions = client.search_model_versions("name='outage-small'")
    assert sorted(v.tags["kompile.target"] for v in versions) == ["cpu-amd64", "cpu-arm64"]
    exp = client.get_experiment_by_name("kompile/team-o/small")
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`kompile.run` = 'generation'")
    assert len(parents) == 1


def test_a_refused_registration_backs_off_only_its_own_model(
    mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow refusing one CompiledModel's record (403 where an MLflow with auth keeps that model
    from the operator's account) is an answer, not an outage: that model waits out a backoff of its
    own, and another model's registration at the same MLflow goes ahead at once. The refusal is
    stood in for at the record() edge; the other model registers with the real server."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    from kompile import registry

    monkeypatch.setattr(lineage, "BREAKER", Breaker(first=60.0))
    monkeypatch.setattr(lineage, "REFUSED", Breaker(first=60.0))
    real_record, calls = registry.record, []

    def record(cm, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(cm.metadata.name)
        if cm.metadata.uid == "uid-refused":
            raise MlflowException("no permission on model 'refused-small'", error_code=PERMISSION_DENIED)
        return real_record(cm, *args, **kwargs)

    monkeypatch.setattr(registry, "record", record)
    settings = Settings(call_timeout_seconds=TIMEOUT)

    def cm_for(name: str) -> Any:
        doc = small_cnn_doc(
            registry={"trackingUri": mlflow_server.tracking_uri, "modelName": f"{name}-small"}
        )
        doc["metadata"] |= {"name": name, "namespace": "team-r", "uid": f"uid-{name}", "generation": 1}
        return parse_manifest(doc)

    refused, other = cm_for("refused"), cm_for("other")
    refused_status, other_status = _settled(), _settled()
    lineage.register_generation(refused, refused_status, settings, lambda *e: None)
    assert _registered(refused_status) == ("False", "RegistryFailed")
    lineage.register_generation(other, other_status, settings, lambda *e: None)
    assert other_status.registry is not None and other_status.registry.run_id, other_status.conditions
    lineage.register_generation(refused, refused_status, settings, lambda *e: None)
    message = next(c.message for c in refused_status.conditions if c.type == lineage.REGISTERED)
    assert _registered(refused_status) == ("False", "RegistryFailed") and "next attempt in" in (message or "")
    assert calls == ["refused", "other"]  # the refused model waited out its own backoff
