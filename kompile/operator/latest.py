"""The stable `latest` pointer per hardware class in the artifact store.

Artifacts live at content-addressed paths that never change in place; a device fleet (ExecuTorch
programs, which KServe does not serve) needs one path per class that it can poll. Once a generation
has settled, `<store>/latest/<namespace>/<modelName>/<class>.json` names that class's winner: the
artifact's URI and digest, its backend, precision, generation and validation summary. Pure apart
from `write_pointer`; the operator (kompile.operator.reconcile) and `kompile run` both call it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kompile.api.status import CompiledModelStatus, LatestPointer, TargetStatus
from kompile.artifact_store import Credentials, join, write_bytes

KIND = "kompile.dev/LatestArtifact/v1"
"""The pointer document's kind: a device reading it checks this before the fields."""


def pointer_uri(store_root: str, namespace: str, model_name: str, hardware_class: str) -> str:
    """Beside cache/ and under the namespace, so a store policy can scope a tenant to both."""
    return join(store_root, "latest", namespace, model_name, f"{hardware_class}.json")


def _p50(t: TargetStatus) -> float:
    return t.latency[0].p50_ms if t.latency else math.inf


def class_winners(targets: Sequence[TargetStatus]) -> dict[str, TargetStatus]:
    """Per class, its fastest validated artifact (ties to the name), whoever serves it: devices of
    a served class may run the same file. Unvalidated (Exported) artifacts never win."""
    out: dict[str, TargetStatus] = {}
    for t in sorted(targets, key=lambda t: (_p50(t), t.name)):
        valid = t.phase == "Succeeded" and t.validation is not None and t.validation.passed
        if valid and t.artifact is not None and t.hardware_class and t.hardware_class not in out:
            out[t.hardware_class] = t
    return out


def pointer_doc(
    t: TargetStatus, *, namespace: str, compiled_model: str, model_name: str, generation: int | None
) -> dict[str, Any]:
    """What a device reads: no timestamps, so writing the same winner again changes nothing."""
    assert t.artifact is not None and t.validation is not None
    outputs = t.validation.outputs
    return {
        "kind": KIND,
        "namespace": namespace,
        "compiledModel": compiled_model,
        "modelName": model_name,
        "hardwareClass": t.hardware_class,
        "generation": generation,
        "target": t.name,
        "backend": t.backend,
        "precision": t.precision,
        "uri": t.artifact.uri,
        # The model's files are in <uri>/<compiledModel>/1/ (the Triton layout every backend uses).
        "modelDir": join(t.artifact.uri, compiled_model, "1"),
        "digest": t.artifact.digest,
        "sizeBytes": t.artifact.size_bytes,
        "validation": {
            "passed": t.validation.passed,
            "samples": t.validation.samples,
            "minCosine": min((o.cosine for o in outputs), default=None),
            "maxAbsError": max((o.max_abs_error for o in outputs), default=None),
        },
        "p50Ms": t.latency[0].p50_ms if t.latency else None,
        "batchSize": t.latency[0].batch_size if t.latency else None,
        "speedup": t.speedup,
    }


def pointer_bytes(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def due(targets: Sequence[TargetStatus], written: Sequence[LatestPointer]) -> dict[str, TargetStatus]:
    """The class winners whose pointer this generation has not written yet."""
    done = {(p.hardware_class, p.digest) for p in written}
    return {
        cls: t
        for cls, t in class_winners(targets).items()
        if t.artifact is not None and (cls, t.artifact.digest) not in done
    }


def recorded(written: Sequence[LatestPointer], pointer: LatestPointer) -> list[LatestPointer]:
    """status.latest with `pointer` in its class's place, sorted by class."""
    rest = [p for p in written if p.hardware_class != pointer.hardware_class]
    return sorted([*rest, pointer], key=lambda p: p.hardware_class)


def write_pointer(
    uri: str,
    doc: Mapping[str, Any],
    endpoint: str | None = None,
    credentials: Credentials | None = None,
) -> None:
    """One PUT: readers see the old pointer or the new one, never a mix. StoreError on failure."""
    write_bytes(uri, pointer_bytes(doc), endpoint, credentials)


Put = Callable[[str, Mapping[str, Any]], None]
"""Writes one pointer document at a URI; raises when the store fails."""


def write_due(
    status: CompiledModelStatus,
    store_root: str,
    *,
    namespace: str,
    compiled_model: str,
    model_name: str,
    generation: int | None,
    put: Put,
) -> None:
    """Write each class winner's pointer not yet written, recording each in status.latest as soon
    as it is written: a store failure (raised by put) leaves the rest for the next attempt."""
    for cls, t in due(status.targets, status.latest).items():
        assert t.artifact is not None
        uri = pointer_uri(store_root, namespace, model_name, cls)
        put(
            uri,
            pointer_doc(
                t,
                namespace=namespace,
                compiled_model=compiled_model,
                model_name=model_name,
                generation=generation,
            ),
        )
        pointer = LatestPointer(hardware_class=cls, uri=uri, target=t.name, digest=t.artifact.digest)
        status.latest = recorded(status.latest, pointer)
