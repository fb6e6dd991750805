"""Thin side-effecting calls to the API server. Everything decided elsewhere; this only talks.

Uses the official client synchronously: Kopf runs sync handlers in its thread pool, so the event
loop never blocks on these calls.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kompile.api.resource import GROUP, PLURAL, VERSION

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
KSERVE_GROUP, KSERVE_VERSION, KSERVE_PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
REQUEST_TIMEOUT = 30
EVENT_MESSAGE_LIMIT = 1000
COMPONENT = "kompile-operator"
USER_AGENT = "kompile-operator"


def api_message(err: ApiException) -> str:
    """The API server's own message of a refusal (it names the field), else the HTTP reason."""
    try:
        message = json.loads(err.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{err.status} {err.reason}")


def load_config() -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def _raw(**kwargs: Any) -> dict[str, Any]:
    """Arguments for a list call answered as the API server's JSON: the client's typed models cost
    about ten times the CPU to build and turn back into dicts, on the reconcile's hot path."""
    return {**kwargs, "_preload_content": False, "_request_timeout": REQUEST_TIMEOUT}


def _items(response: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


class Kube:
    """The handful of API calls the operator makes."""

    def __init__(self) -> None:
        api = client.ApiClient()
        # One name for the operator's requests in the API server's audit log and request metrics.
        api.user_agent = USER_AGENT
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.api = api

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return _items(self.batch.list_namespaced_job(namespace, **_raw(label_selector=selector)))

    def create_job(self, namespace: str, job: dict[str, Any]) -> bool:
        """Create; False when it already exists (409): the deterministic name makes that safe."""
        try:
            self.batch.create_namespaced_job(namespace, job, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(
                name, namespace, propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list_pods(namespace, f"{JOB_NAME_LABEL}={job}")

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return _items(self.core.list_namespaced_pod(namespace, **_raw(label_selector=selector)))

    def post_event(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event about obj (what `kubectl describe` shows); reconcile workers post their
        own, outside Kopf's handler context."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).isoformat()
        body = {
            "metadata": {"generateName": "kompile-", "namespace": namespace},
            "type": kind,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "action": reason,
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "source": {"component": COMPONENT},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.core.create_namespaced_event(namespace, body, _request_timeout=REQUEST_TIMEOUT)

    def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's decoded data (store credentials); the values never leave the operator's memory."""
        secret = self.core.read_namespaced_secret(name, namespace, _request_timeout=REQUEST_TIMEOUT)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def get_compiled_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return obj

    def list_compiled_models(self) -> list[dict[str, Any]]:
        res: dict[str, Any] = self.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT
        )
        items: list[dict[str, Any]] = res.get("items", [])
        return items

    # -- KServe ------------------------------------------------------------------------------------

    def get_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                KSERVE_GROUP, KSERVE_VERSION, namespace, KSERVE_PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return obj

    def create_inference_service(self, namespace: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            KSERVE_GROUP, KSERVE_VERSION, namespace, KSERVE_PLURAL, body, _request_timeout=REQUEST_TIMEOUT
        )

    def patch_inference_service(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        # The client sends custom-object patches as JSON merge patches: null removes a field.
        self.custom.patch_namespaced_custom_object(
            KSERVE_GROUP,
            KSERVE_VERSION,
            namespace,
            KSERVE_PLURAL,
            name,
            patch,
            _request_timeout=REQUEST_TIMEOUT,
        )

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            cm = self.core.read_namespaced_config_map(name, namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status in (403, 404):  # no KServe config readable: the documented default applies
                return None
            raise
        out: dict[str, Any] = self.api.sanitize_for_serialization(cm)
        return out

    def create_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.core.create_namespaced_config_map(namespace, body, _request_timeout=REQUEST_TIMEOUT)

    def replace_config_map(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.core.replace_namespaced_config_map(name, namespace, body, _request_timeout=REQUEST_TIMEOUT)

    def get_crd(self, name: str) -> dict[str, Any] | None:
        try:
            crd = client.ApiextensionsV1Api(self.api).read_custom_resource_definition(
                name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status in (403, 404):
                return None
            raise
        out: dict[str, Any] = self.api.sanitize_for_serialization(crd)
        return out

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        # A merge patch replaces lists whole: the caller always sends the full rebuilt status.
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _request_timeout=REQUEST_TIMEOUT
        )
