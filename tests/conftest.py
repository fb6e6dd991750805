"""Suite-wide plugins: the real S3 (versitygw) and MLflow servers, started on first use; MLflow's
process-wide tracking URI, put back after each test; and the operator's outage breaker, reset after
each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.support.fixtures"]

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_TRACKING_UTILS = "mlflow.tracking._tracking_service.utils"  # holds mlflow.set_tracking_uri's global


@pytest.fixture(autouse=True)
def _restore_mlflow_tracking_uri() -> Iterator[None]:
    """mlflow.set_tracking_uri (called by tests that log a source model) sets a module global and
    MLFLOW_TRACKING_URI in os.environ, which `kompile run` reads as its --tracking-uri: left set, a
    later test would register into this test's store. Put both back as they were. Imports nothing:
    a test that never loaded mlflow has nothing to undo."""
    env = os.environ.get(TRACKING_URI_ENV)
    module = sys.modules.get(MLFLOW_TRACKING_UTILS)
    saved = getattr(module, "_tracking_uri", None)
    yield
    module = sys.modules.get(MLFLOW_TRACKING_UTILS)
    if module is not None and hasattr(module, "_tracking_uri"):
        module._tracking_uri = saved
    if env is None:
        os.environ.pop(TRACKING_URI_ENV, None)
    else:
        os.environ[TRACKING_URI_ENV] = env


@pytest.fixture(autouse=True)
def _fresh_outage_breaker() -> Iterator[None]:
    """The operator's per-endpoint breaker is process-wide: an outage one test made must not make
    a later test's MLflow or store calls wait out its backoff."""
    yield
    module = sys.modules.get("kompile.operator.outages")
    if module is not None:
        module.BREAKER.reset()
