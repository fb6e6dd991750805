"""A tenant cannot point the operator's credentials at its own host: a CompiledModel naming an
s3Endpoint or trackingUri that is neither the operator's nor allow-listed is refused before any Job,
Secret read or MLflow call (Ready=False, EndpointNotAllowed); an allow-listed foreign store needs the
CompiledModel's own Secret and never gets the operator's keys."""

from __future__ import annotations

from typing import Any

import pytest

from kompile.api.resource import parse_manifest
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings
from kompile.operator.store_access import NO_KEYS, store_access
from kompile.operator.tenancy import refusal
from tests.unit.test_reconcile_refusals import StatusOnlyKube

OWN = Settings(
    s3_endpoint="http://minio.kompile-system:9000", tracking_uri="http://mlflow.kompile-system:5000"
)


def _doc(**registry: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "namespace": "team-b", "uid": "u-2", "generation": 1},
        "spec": {
            "source": {"uri": "s3://models/m.onnx"},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime"}],
            "registry": registry,
        },
    }


@pytest.mark.parametrize(
    ("registry", "phrase"),
    [
        (
            {"trackingUri": "http://capture.evil.example:8080"},
            "trackingUri names host capture.evil.example:8080",
        ),
        ({"s3Endpoint": "http://169.254.169.254"}, "s3Endpoint names host 169.254.169.254"),
        ({"s3Endpoint": "file:///etc"}, "is not a network endpoint"),
    ],
)
def test_a_foreign_endpoint_is_refused_before_anything_is_called(
    registry: dict[str, str], phrase: str
) -> None:
    kube = StatusOnlyKube()  # any call beyond the status patch fails the test
    events: list[tuple[str, str, str]] = []
    outcome = reconcile(_doc(**registry), kube, OWN, lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    assert outcome.done
    (patch,) = kube.patches
    (ready,) = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "EndpointNotAllowed"
    assert phrase in ready["message"], ready["message"]
    assert events[-1][1] == "EndpointNotAllowed"


def test_the_operators_own_endpoints_and_allow_listed_ones_pass() -> None:
    own = parse_manifest(
        _doc(trackingUri="http://mlflow.kompile-system:5000", s3Endpoint="http://minio.kompile-system:9000")
    )
    assert refusal(own, OWN, env={}) is None
    allowed = Settings(s3_endpoint=OWN.s3_endpoint, allowed_endpoints=["s3.team-b.example"])
    foreign = parse_manifest(_doc(s3Endpoint="https://s3.team-b.example"))
    assert "name your own credentials in spec.registry.credentialsSecret" in (
        refusal(foreign, allowed, env={}) or ""
    )
    with_secret = parse_manifest(
        _doc(s3Endpoint="https://s3.team-b.example", credentialsSecret={"name": "team-b-s3"})
    )
    assert refusal(with_secret, allowed, env={}) is None


def test_an_allow_listed_mlflow_never_gets_the_operators_token() -> None:
    settings = Settings(tracking_uri=OWN.tracking_uri, allowed_endpoints=["mlflow.team-b.example"])
    cm = parse_manifest(_doc(trackingUri="https://mlflow.team-b.example"))
    assert refusal(cm, settings, env={}) is None
    assert "holds MLflow credentials" in (refusal(cm, settings, env={"MLFLOW_TRACKING_TOKEN": "t"}) or "")


def test_a_foreign_store_without_its_secret_gets_empty_keys_not_the_operators() -> None:
    from kubernetes.client.exceptions import ApiException

    class NoSecretKube:
        def secret_data(self, namespace: str, name: str) -> dict[str, str]:
            raise ApiException(status=404, reason="Not Found")

    settings = Settings(s3_endpoint=OWN.s3_endpoint, allowed_endpoints=["s3.team-b.example"])
    cm = parse_manifest(_doc(s3Endpoint="https://s3.team-b.example", credentialsSecret={"name": "gone"}))
    access = store_access(cm, NoSecretKube(), settings)  # type: ignore[arg-type]
    assert access.credentials == NO_KEYS  # boto3 would otherwise sign with the operator's own keys
    own = parse_manifest(_doc())
    assert store_access(own, NoSecretKube(), OWN).credentials is None  # type: ignore[arg-type]


def test_a_secret_outside_the_granted_ones_never_reaches_a_job() -> None:
    settings = Settings(s3_endpoint=OWN.s3_endpoint, allowed_secrets=["team-b-s3"])
    ok = parse_manifest(_doc(credentialsSecret={"name": "team-b-s3"}))
    assert refusal(ok, settings, env={}) is None
    other = parse_manifest(_doc(credentialsSecret={"name": "team-a-db-password"}))
    assert "'team-a-db-password' is not one the operator is allowed to use" in (
        refusal(other, settings, env={}) or ""
    )
    assert Settings.from_env(
        {"KOMPILE_ALLOWED_SECRETS": "a,b", "KOMPILE_ALLOWED_ENDPOINTS": "s3.x"}
    ).allowed_secrets == ["a", "b"]
