"""The CompiledModel API: typed spec and status, the single source of truth for the CRD."""

from kompile.api.resource import (
    API_VERSION,
    KIND,
    CompiledModel,
    ManifestError,
    load_manifest,
    parse_manifest,
)
from kompile.api.spec import CompiledModelSpec, InputSpec, Target
from kompile.api.status import CompiledModelStatus, TargetStatus

__all__ = [
    "API_VERSION",
    "KIND",
    "CompiledModel",
    "CompiledModelSpec",
    "CompiledModelStatus",
    "InputSpec",
    "ManifestError",
    "Target",
    "TargetStatus",
    "load_manifest",
    "parse_manifest",
]
