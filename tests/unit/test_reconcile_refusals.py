"""What the operator refuses before any Job: a spec the typed models refuse (a bad backend option
value the CRD's key-only rule lets through) becomes Ready=False, reason InvalidSpec, with a message
naming the key, and no Job, Secret or Node is ever read."""

from __future__ import annotations

from typing import Any

import pytest

from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings


class StatusOnlyKube:
    """A stand-in for the Kubernetes API that records status patches and fails on anything else."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.patches.append(body)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"reconcile called kube.{name} for a spec it must refuse first")


def _doc(options: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 3},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime", "options": options}],
        },
    }


@pytest.mark.parametrize(
    ("options", "phrase"),
    [
        ({"optLevel": "fastest"}, "option optLevel='fastest': use one of ['extended', 'all', 'basic']"),
        ({"intraOpThreads": "four"}, "option intraOpThreads='four': use a non-negative integer"),
        ({"device": "cuda"}, "option device='cuda': onnxruntime builds for ['cpu']"),
    ],
)
def test_bad_option_is_an_invalid_spec_condition_before_any_job(options: dict[str, str], phrase: str) -> None:
    kube = StatusOnlyKube()
    events: list[tuple[str, str, str]] = []
    outcome = reconcile(_doc(options), kube, Settings(), lambda *e: events.append(e))  # type: ignore[arg-type]
    assert outcome.done
    (patch,) = kube.patches
    (ready,) = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.targets[0]" in ready["message"] and phrase in ready["message"], ready["message"]
    assert ready["observedGeneration"] == 3 and patch["observedGeneration"] == 3
