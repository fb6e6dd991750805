"""Suite-wide plugins: the real S3 (versitygw) and MLflow servers, started on first use; MLflow's
process-wide tracking URI, put back after each test; and the `scale` tests, run only with --scale."""

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--scale",
        action="store_true",
        help="also run the tests marked scale (the operator under load: many minutes, own control plane)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Deselected, not skipped: without --scale they are not part of the run at all.
    if config.getoption("--scale"):
        return
    dropped = [item for item in items if item.get_closest_marker("scale")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("scale")]
