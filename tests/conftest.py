"""Suite-wide plugins: the real S3 (versitygw) and MLflow servers, started on first use; MLflow's
process-wide tracking URI, put back after each test; and the operator's outage breaker, reset after
each test."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

from kompile.compile_jobs.tvm_database import ROOT_ENV as TUNING_DB_ENV

pytest_plugins = ["tests.support.fixtures"]

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_TRACKING_UTILS = "mlflow.tracking._tracking_service.utils"  # holds mlflow.set_tracking_uri's global


_RUN_FOLDERS: dict[str, str] = {}  # environment variable -> the folder this run made for it


def pytest_configure(config: pytest.Config) -> None:
    """Tests compile with Inductor in-process (and in compile-Job subprocesses, which inherit the
    environment): its default cache is /tmp/torchinductor_<user>, which no one removes, about 400 MB
    a run on a CI machine that keeps its /tmp. Give this run its own, removed at the end (random
    weights are frozen into the compiled code: a cache kept between runs would only grow). Set
    before collection: Inductor writes its default into the environment on first use.
    Likewise TVM's shared tuning databases: a tvm target whose test names no folder of its own
    would read and lock the user's ~/.cache/kompile/tuning-databases (a run left a .lock there)."""
    _pin_xdist_worker()
    for env, prefix in ((INDUCTOR_CACHE_ENV, "inductor"), (TUNING_DB_ENV, "tuning-databases")):
        if not os.environ.get(env):  # else the developer chose one
            _RUN_FOLDERS[env] = tempfile.mkdtemp(prefix=f"kompile-tests-{prefix}-")
            os.environ[env] = _RUN_FOLDERS[env]


# The files whose tests take minutes, heaviest first (seconds each took in a warm `make test` on 2
# cores, AVX2 AMD EPYC, 2026-12-07: setup, call and teardown summed from `--durations=0`; the
# command is in docs/development.md). `make test` hands files to its two workers in collection order
# (`--no-loadscope-reorder`; xdist's default orders them by how many tests they hold): these go
# first, so that no worker is left running one of them alone at the end while the other waits. The
# rest keep pytest-randomly's order, and each file's tests theirs.
LONG_FILES = (
    "tests/pipeline/test_tvm_backend.py",  # 866 s
    "tests/pipeline/test_pretrained.py",  # 422 s
    "tests/integration/test_chaos.py",  # 275 s
    "tests/integration/test_operator.py",  # 251 s
    "tests/pipeline/test_huggingface_folder.py",  # 159 s
    "tests/pipeline/test_detector_int8.py",  # 135 s
    "tests/pipeline/test_pt2_sources.py",  # 133 s
    "tests/integration/test_registry_e2e.py",  # 129 s
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: on every worker the same order (pytest-randomly shuffled with one seed).
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(LONG_FILES)))


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (`make test` runs two workers), give each worker its own share of the cores.

    Every runtime here sizes its thread pool to the cores the process may use (the affinity mask,
    as in a pinned compile Job). Unpinned, two workers each ran pools as wide as the machine: their
    spinning threads timed each other (2026-12-03, 2 cores, -n 2: the tvm tests took 699 s beside
    336 s alone). The worker's servers and subprocesses inherit its share. Nothing is pinned when
    there are fewer cores than workers, or without xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cores, workers, index = sorted(os.sched_getaffinity(0)), int(count), int(worker[2:])
    share = len(cores) // workers
    if share >= 1:
        os.sched_setaffinity(0, cores[index * share : (index + 1) * share])


def pytest_unconfigure(config: pytest.Config) -> None:
    for env, folder in _RUN_FOLDERS.items():
        os.environ.pop(env, None)
        shutil.rmtree(folder, ignore_errors=True)
    _RUN_FOLDERS.clear()


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


EXAMPLE_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture(autouse=True)
def _example_models_from_examples() -> Iterator[None]:
    """Tests import the example factories as `models.*` from examples/; a python:// run imports them
    afresh from its manifest's folder (a copy in tmp_path), which is removed when the test passes. A
    later `import models.pretrained` would then look in the removed copy: drop what a run imported
    from elsewhere, so the next import finds examples/ again."""
    yield
    found = sys.modules.get("models")
    where = getattr(found, "__file__", None) or ""
    if found is not None and not where.startswith(EXAMPLE_MODELS + os.sep):
        for name in [m for m in sys.modules if m == "models" or m.startswith("models.")]:
            del sys.modules[name]
        sys.path[:] = [p for p in sys.path if not p or os.path.isdir(p)]


@pytest.fixture(autouse=True)
def _fresh_outage_breaker() -> Iterator[None]:
    """The operator's per-endpoint breaker is process-wide: an outage one test made must not make
    a later test's MLflow or store calls wait out its backoff."""
    yield
    module = sys.modules.get("kompile.operator.outages")
    if module is not None:
        module.BREAKER.reset()
