"""Prometheus metrics of the operator (served on KOMPILE_METRICS_PORT at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("kompile_reconciles_total", "CompiledModel reconciles run.")
JOBS = Counter(
    "kompile_jobs_total", "Compile targets finished, by outcome (Succeeded, Failed, Cached).", ["outcome"]
)
COMPILE_SECONDS = Histogram(
    "kompile_compile_duration_seconds",
    "Compile time reported by compile Jobs.",
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600),
)
VALIDATION_SECONDS = Histogram("kompile_validation_duration_seconds", "Validation time reported by Jobs.")
SPEEDUP = Gauge(
    "kompile_target_speedup", "Speedup over eager of a target's artifact.", ["namespace", "name", "target"]
)
QUEUE_DEPTH = Gauge("kompile_workqueue_depth", "CompiledModels waiting for a reconcile worker now.")
QUEUE_DELAYED = Gauge(
    "kompile_workqueue_delayed", "CompiledModels with work in flight, to be looked at again."
)
RETRIES = Counter("kompile_reconcile_retries_total", "Reconciles that failed and were retried with backoff.")


def forget(namespace: str, name: str) -> None:
    """Drop a deleted CompiledModel's labelled series, so they do not outlive it."""
    for metric in SPEEDUP.collect():
        for sample in metric.samples:
            if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name:
                SPEEDUP.remove(namespace, name, sample.labels["target"])
