"""What a CompiledModel may point the operator at. The CRD checks a URL's shape, not whose it is: a
tenant naming its own host as `trackingUri` or `s3Endpoint` would receive the operator's MLflow
token and S3 keys. So the operator's credentials go only to the endpoints its own settings name;
another endpoint must be on the allow-list (KOMPILE_ALLOWED_ENDPOINTS) and reached with the
CompiledModel's own Secret. Checked before any Job, Secret read or MLflow call."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from kompile.api.resource import CompiledModel
from kompile.operator.settings import Settings

# MLflow's client sends these from the process environment to whatever tracking URI it is given.
MLFLOW_CREDENTIAL_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def host_of(url: str) -> str:
    """host[:port] of a URL, lower case; '' for a URL without a network location (file:, sqlite:)."""
    parsed = urlparse(url)
    if not parsed.hostname:
        return ""
    return parsed.hostname.lower() + (f":{parsed.port}" if parsed.port else "")


def own_hosts(settings: Settings) -> set[str]:
    return {h for h in (host_of(settings.s3_endpoint or ""), host_of(settings.tracking_uri or "")) if h}


def refusal(cm: CompiledModel, settings: Settings, env: dict[str, str] | None = None) -> str | None:
    """Why the operator will not use the endpoints this CompiledModel names, or None."""
    registry = cm.spec.registry
    if registry is None:
        return None
    env = dict(os.environ) if env is None else env
    secret = registry.credentials_secret.name if registry.credentials_secret else None
    if secret and settings.allowed_secrets and secret not in settings.allowed_secrets:
        # envFrom would hand the compile pod any Secret of the namespace: only the granted ones.
        return (
            f"spec.registry.credentialsSecret {secret!r} is not one the operator is allowed to use "
            f"({', '.join(settings.allowed_secrets)}): ask its administrator to add it to the chart's "
            "artifactStore.credentialsSecrets"
        )
    own = own_hosts(settings)
    allowed = own | {h.lower() for h in settings.allowed_endpoints}
    for field, url in (("s3Endpoint", registry.s3_endpoint), ("trackingUri", registry.tracking_uri)):
        if not url:
            continue
        host = host_of(url)
        if not host:
            return (
                f"spec.registry.{field} {url!r} is not a network endpoint: the operator reaches stores and "
                "MLflow over the network only"
            )
        # An allow-list entry without a port allows the host on any port.
        if host not in allowed and host.rsplit(":", 1)[0] not in allowed:
            return (
                f"spec.registry.{field} names host {host}, which is neither the operator's own "
                f"({', '.join(sorted(own)) or 'none set'}) nor on its allow-list "
                "(KOMPILE_ALLOWED_ENDPOINTS): use the operator's endpoint or ask its administrator to "
                "allow this one"
            )
        if host in own:
            continue
        if field == "s3Endpoint" and registry.credentials_secret is None:
            return (
                f"spec.registry.s3Endpoint {host} is not the operator's store: name your own credentials "
                "in spec.registry.credentialsSecret (the operator's keys go only to its own store)"
            )
        if field == "trackingUri" and any(env.get(k) for k in MLFLOW_CREDENTIAL_ENV):
            return (
                f"spec.registry.trackingUri {host} is not the operator's MLflow and the operator holds "
                "MLflow credentials it would send there: use the operator's tracking URI"
            )
    return None
