"""The generated CompiledModel CRD on a real API server.

What a unit test of the schema cannot show: that the API server accepts the CRD and the examples,
refuses each manifest of a corpus of invalid ones with a message naming the field (OpenAPI enums,
patterns, bounds, list-map keys, CEL rules, strict field validation), that `kompile run`'s pydantic
models refuse the same corpus, that `kubectl explain` and `kubectl get` show what the models say,
and that a full status written through the status subresource comes back with nothing pruned.

Each file in invalid_manifests/ starts with `# expect: <substring of the API server's error>`.
A `# known-gap: <api-server|pydantic>: <why>` line marks a manifest one side still accepts: that
case is a strict xfail, so it fails (XPASS) once the gap is closed and the line must go.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from devtools.devcluster import ControlPlane
from kompile.api import ManifestError, load_manifest, parse_manifest
from kompile.api.spec import CompiledModelSpec, RolloutGate, Source, Target
from kompile.api.status import (
    Artifact,
    Baseline,
    BestTarget,
    CandidateStatus,
    CompiledModelStatus,
    Condition,
    DetectionCheck,
    LatencyStats,
    LatestPointer,
    OutputCheck,
    RegistryStatus,
    RolloutStatus,
    SelectionStatus,
    TargetStatus,
    TaskAccuracy,
    Thresholds,
    ValidationResult,
)
from kompile.api.vocabulary import TargetPrecision

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID_DIR = Path(__file__).resolve().parent / "invalid_manifests"
NAMESPACE = "kompile-crd-test"
CRD_NAME = "compiledmodels.kompile.dev"
MIN_CORPUS = 22
SIDES = ("api-server", "pydantic")
PRINTER_COLUMNS = ["NAME", "READY", "TARGETS", "BEST", "SPEEDUP", "AGE"]


# -- the corpus of invalid manifests ----------------------------------------------------------------


@dataclass(frozen=True)
class InvalidManifest:
    path: Path
    expect: str  # a substring of the API server's error that names the field
    gaps: dict[str, str]  # side -> why that side still accepts the manifest

    @property
    def field(self) -> str:
        """The top-level field the error is about (spec.targets, metadata.name), which both sides name.

        pydantic reports a cross-field rule at the parent object (spec.inputs[0]) where CEL's
        fieldPath names the child (spec.inputs[0].shape), so only this prefix is held in common.
        """
        found = re.search(r"(spec|metadata)\.[A-Za-z]+", self.expect)
        return found.group(0) if found else "spec"


def _read_corpus_entry(path: Path) -> InvalidManifest:
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("# expect: "):
        raise ValueError(f"{path}: the first line must be `# expect: <substring of the error>`")
    gaps: dict[str, str] = {}
    for line in lines[1:]:
        if not line.startswith("#"):
            break  # the header comment ends where the manifest begins
        if line.startswith("# known-gap: "):
            side, _, why = line.removeprefix("# known-gap: ").partition(": ")
            if side not in SIDES:
                raise ValueError(f"{path}: known-gap side {side!r} is not one of {SIDES}")
            gaps[side] = why
    return InvalidManifest(path, lines[0].removeprefix("# expect: ").strip(), gaps)


CORPUS = [_read_corpus_entry(p) for p in sorted(INVALID_DIR.glob("*.yaml"))]


def _cases(side: str) -> list[Any]:
    """One pytest param per manifest; a known gap on this side is a strict xfail."""
    params = []
    for entry in CORPUS:
        marks = []
        if side in entry.gaps:
            marks.append(pytest.mark.xfail(strict=True, reason=f"{side} gap: {entry.gaps[side]}"))
        params.append(pytest.param(entry, id=entry.path.stem, marks=marks))
    return params


# -- helpers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    # Delete our objects first (no finalizers: no operator runs here), so an operator started by a
    # later test module never sees them; the namespace itself may finish terminating in the background.
    control_plane.kubectl("delete", "compiledmodels", "--all", "-n", NAMESPACE, "--wait=true")
    control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def _dry_run_apply(plane: ControlPlane, path: Path) -> tuple[int, str]:
    """`kubectl apply --dry-run=server` (strict field validation by default): exit status, output."""
    result = plane.kubectl("apply", "--dry-run=server", "-n", NAMESPACE, "-f", str(path), check=False)
    return result.returncode, result.stdout + result.stderr


def _eventually_kubectl(plane: ControlPlane, *args: str, timeout: float = 30.0) -> str:
    """kubectl's stdout once it succeeds: the CRD's OpenAPI is published a moment after Established."""
    deadline = time.monotonic() + timeout
    while True:
        result = plane.kubectl(*args, check=False)
        if result.returncode == 0:
            return result.stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"kubectl {' '.join(args)} kept failing: {result.stderr.strip()}")
        time.sleep(0.5)


def _squash(text: str) -> str:
    """Whitespace collapsed, so a description kubectl wrapped at 80 columns compares equal."""
    return " ".join(text.split())


def _get(plane: ControlPlane, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(
        plane.kubectl("get", "cmodel", name, "-n", NAMESPACE, "-o", "json").stdout
    )
    return obj


def _create(plane: ControlPlane, name: str) -> dict[str, Any]:
    """A CompiledModel created for real; suspended so that no operator ever builds it."""
    doc = yaml.safe_load((ROOT / "examples" / "resnet50.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    doc["spec"]["suspend"] = True
    plane.kubectl("create", "-f", "-", input=json.dumps(doc))
    return _get(plane, name)


def _patch_status(plane: ControlPlane, name: str, status: CompiledModelStatus) -> None:
    body = json.dumps({"status": status.to_wire()})
    plane.kubectl(
        "patch", "cmodel", name, "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", body
    )


def _latency(batch_size: int, p50_ms: float) -> list[LatencyStats]:
    return [
        LatencyStats(
            batch_size=batch_size,
            p50_ms=p50_ms,
            p90_ms=p50_ms * 1.1,
            p99_ms=p50_ms * 1.5,
            throughput=1000.0 * batch_size / p50_ms,
            spread=0.1,
            stable=False,  # so that `unsettled` is set too (it is only where a figure never settled)
            unsettled="its last 3 windows' medians differed by 14.2% (settleTolerance 10%)",
            busy_cores=0.02,
        )
    ]


def _condition(type_: str, reason: str, message: str) -> Condition:
    return Condition(
        type=type_,
        status="True",
        reason=reason,
        message=message,
        last_transition_time="2025-01-02T03:04:05Z",
        observed_generation=1,
    )


def _full_status() -> CompiledModelStatus:
    """A status with every field of every nested model set (checked by _unset_fields)."""
    validation = ValidationResult(
        passed=True,
        samples=4,
        outputs=[
            OutputCheck(
                name="logits",
                max_abs_error=0.0125,
                max_rel_error=0.003,
                scale=17.7,
                cosine=0.99987,
                top_k_agreement=1.0,
                top_k=5,
                agreement=1.0,  # set on an integer output only: here so that pruning it is caught
                lost_slices="along axis 1, slice 5 moves by up to 0.812 in the source and by at most 0",
                finite=True,
                worst_sample=3,
                detections=DetectionCheck(required=10, found=9, extra=1, agreement=0.818),
            )
        ],
        thresholds=Thresholds(
            max_abs_error=0.5,
            max_scaled_error=0.2,
            max_rel_error=0.1,
            min_cosine=0.99,
            min_top_k_agreement=0.9,
            top_k=5,
            max_accuracy_drop=1.0,
            min_detection_agreement=0.95,
            detection_score=0.25,
            detection_margin=0.05,
            detection_head="yolov5",
        ),
        failures=["maxRelError 0.003 above 0.001 (reported, not gating)"],
        checked_at=["sequence 16", "batch 4"],
        not_checked_at=["height 112: the source model's outputs there are NaN or Inf"],
        task_accuracy=TaskAccuracy(output="logits", labelled=360, reference=97.2, accuracy=96.9, drop=0.3),
    )
    target = TargetStatus(
        name="cpu-int8",
        backend="onnxruntime",
        precision="int8",
        phase="Succeeded",
        hardware_class="amd64-avx512",
        job="resnet50-cpu-int8-3f9a1c",
        node="kwok-cpu-0",
        cached=True,
        cache_key="sha256:" + "ab" * 32,
        artifact=Artifact(
            uri="s3://artifacts/kompile/resnet50/cpu-int8",
            digest="sha256:" + "cd" * 32,
            size_bytes=25_612_345,
        ),
        latency=_latency(1, 4.25),
        eager_latency=_latency(1, 13.5),
        speedup=3.18,
        speedup_stable=True,
        validation=validation,
        registered_version="7",
        compile_seconds=41.25,
        validation_seconds=3.5,
        reason="Validated",
        message="cosine 0.99987, top-5 agreement 1.0",
        candidates=[
            CandidateStatus(
                name="onnxruntime-int8",
                backend="onnxruntime",
                precision="int8",
                phase="Succeeded",
                reason="Validated",
                message="validated",
                selected=True,
                options={"quantization": "static"},
                compile_seconds=41.25,
                max_abs_error=0.0125,
                min_cosine=0.99987,
                accuracy=96.9,
                accuracy_drop=0.3,
                detection_agreement=0.818,
                latency=_latency(1, 4.25),
                speedup=3.18,
                speedup_stable=True,
                artifact_digest="sha256:" + "cd" * 32,
            )
        ],
        not_offered=["inductor: backend inductor supports ['bf16', 'fp16', 'fp32'], not int8"],
        selection=SelectionStatus(
            policy="maxThroughput",
            batch_size=1,
            latency_budget_ms=10.0,
            winner="onnxruntime-int8",
            message="highest throughput with p90 within 10 ms",
        ),
        conditions=[
            _condition("Compiled", "Built", "compiled in 41 s"),
            _condition("Validated", "Passed", ""),
        ],
    )
    return CompiledModelStatus(
        observed_generation=1,
        conditions=[_condition("Ready", "Validated", "1/1 targets validated")],
        targets=[target],
        targets_ready="1/1",
        best=BestTarget(target="cpu-int8", speedup=3.18, p50_ms=4.25),
        source_digest="sha256:" + "ef" * 32,
        baselines=[Baseline(name="torch.compile", latency=_latency(1, 9.75), compile_seconds=38.5)],
        registry=RegistryStatus(
            tracking_uri="http://mlflow.mlflow:5000",
            model_name="resnet50",
            run_id="0123456789abcdef",
            aliases={"amd64-avx512": "7"},
            pending_aliases=["amd64-avx2: version 6 (MlflowException: 503)"],
        ),
        rollouts=[
            RolloutStatus(
                hardware_class="amd64-avx512",
                phase="Canary",
                inference_service="resnet50-amd64-avx512",
                target="cpu-int8",
                storage_uri="s3://artifacts/kompile/resnet50/cpu-int8",
                deployment_mode="Serverless",
                canary_traffic_percent=10,
                previous_storage_uri="s3://artifacts/kompile/resnet50/cpu-fp32",
                started_at="2025-01-02T03:05:00Z",
                message="10% of traffic on version 7",
            )
        ],
        latest=[
            LatestPointer(
                hardware_class="amd64-avx512",
                uri="s3://artifacts/kompile/latest/default/resnet50/amd64-avx512.json",
                target="cpu-int8",
                digest="sha256:" + "ab" * 32,
            )
        ],
    )


def _unset_fields(model: BaseModel, path: str = "status") -> list[str]:
    """Paths of fields left None or empty, recursively: a field added to the status later must be
    filled in _full_status too, or the round-trip test would not notice the API server pruning it."""
    unset = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        here = f"{path}.{name}"
        if value is None or value == []:
            unset.append(here)
        elif isinstance(value, BaseModel):
            unset += _unset_fields(value, here)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    unset += _unset_fields(item, f"{here}[{i}]")
    return unset


# -- the CRD and the examples -----------------------------------------------------------------------


def test_crd_is_established(control_plane: ControlPlane) -> None:
    crd = json.loads(control_plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True", conditions
    assert conditions.get("NamesAccepted") == "True", conditions
    assert crd["status"]["acceptedNames"]["shortNames"] == ["cmodel"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_by_both(control_plane: ControlPlane, namespace: str, example: Path) -> None:
    code, output = _dry_run_apply(control_plane, example)
    assert code == 0, f"the API server refused {example.name}:\n{output}"
    load_manifest(example)  # and `kompile run` accepts it too (raises ManifestError otherwise)


def test_a_scalar_input_is_accepted_by_both(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """`shape: []` declares a 0-d input (Silero VAD's sample rate); the CRD said minItems 1."""
    doc = yaml.safe_load((ROOT / "examples" / "small-cnn.yaml").read_text())
    doc["spec"]["inputs"] = [
        {"name": "input", "shape": [1, 576]},
        {"name": "state", "shape": [2, 1, 128]},
        {"name": "sr", "dtype": "int64", "shape": [], "low": 16000, "high": 16001},
    ]
    path = tmp_path / "silero-vad.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, output = _dry_run_apply(control_plane, path)
    assert code == 0, f"the API server refused a scalar input:\n{output}"
    assert load_manifest(path).spec.inputs[2].shape == []


# -- the invalid corpus -----------------------------------------------------------------------------


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= MIN_CORPUS, f"only {len(CORPUS)} invalid manifests in {INVALID_DIR}"


@pytest.mark.parametrize("manifest", _cases("api-server"))
def test_api_server_refuses(control_plane: ControlPlane, namespace: str, manifest: InvalidManifest) -> None:
    code, output = _dry_run_apply(control_plane, manifest.path)
    assert code != 0, f"the API server accepted {manifest.path.name}:\n{output}"
    assert manifest.expect in output, f"expected {manifest.expect!r} in the API server's error:\n{output}"


@pytest.mark.parametrize("manifest", _cases("pydantic"))
def test_pydantic_refuses(manifest: InvalidManifest) -> None:
    doc = yaml.safe_load(manifest.path.read_text())
    with pytest.raises(ManifestError) as refused:
        parse_manifest(doc, manifest.path.name)
    assert manifest.field in str(refused.value), f"expected the error to name {manifest.field}"


# -- kubectl explain and get ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field_path", "model", "attribute"),
    [
        ("spec.targets.precision", Target, "precision"),
        ("spec.source.uri", Source, "uri"),
        ("spec.rollout.gate.requireValidation", RolloutGate, "require_validation"),
        ("status.targets.speedup", TargetStatus, "speedup"),
    ],
)
def test_explain_prints_the_models_description(
    control_plane: ControlPlane, field_path: str, model: type[BaseModel], attribute: str
) -> None:
    output = _eventually_kubectl(control_plane, "explain", f"compiledmodel.{field_path}")
    description = model.model_fields[attribute].description
    assert description and _squash(description) in _squash(output)


def test_explain_lists_precision_enum(control_plane: ControlPlane) -> None:
    output = _eventually_kubectl(control_plane, "explain", "compiledmodel.spec.targets.precision")
    enum = output.split("ENUM:", 1)[1].split("DESCRIPTION:", 1)[0].split()
    assert enum == list(get_args(TargetPrecision))  # a target may ask for precision auto


def test_explain_spec_lists_every_field(control_plane: ControlPlane) -> None:
    output = _eventually_kubectl(control_plane, "explain", "compiledmodel.spec")
    # Field lines look like "  source\t<Object> -required-".
    listed = {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+)\t<[^>]+>(.*)$", output, re.M)}
    fields = CompiledModelSpec.model_fields
    assert set(listed) == {f.alias for f in fields.values()}
    required = {f.alias for f in fields.values() if f.is_required()}
    assert {name for name, rest in listed.items() if "-required-" in rest} == required


def test_get_shows_printer_columns(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, "printer-columns")
    _patch_status(control_plane, "printer-columns", _full_status())
    table = control_plane.kubectl("get", "cmodel", "printer-columns", "-n", NAMESPACE).stdout
    header, row = (line.split() for line in table.strip().splitlines())
    assert header == PRINTER_COLUMNS
    assert row[:-1] == ["printer-columns", "True", "1/1", "cpu-int8", "3.18"]


# -- the status subresource -------------------------------------------------------------------------


def test_full_status_round_trips_unpruned(control_plane: ControlPlane, namespace: str) -> None:
    status = _full_status()
    assert _unset_fields(status) == [], "fill these in _full_status so pruning them would be caught"
    generation = _create(control_plane, "status-round-trip")["metadata"]["generation"]

    _patch_status(control_plane, "status-round-trip", status)
    stored = _get(control_plane, "status-round-trip")
    assert stored["status"] == status.to_wire()
    assert CompiledModelStatus.model_validate(stored["status"]) == status
    assert stored["metadata"]["generation"] == generation, "a status write must not bump the generation"


def test_a_new_compiled_model_reads_in_progress_before_the_operator_looks(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Between `kubectl apply` and the operator's first status write a CompiledModel had no status,
    which kstatus (Flux's health check) reads as Current: a Kustomization with `wait: true` could
    pass before anything compiled. The CRD defaults status.observedGeneration to 0, behind any
    generation, so it reads InProgress until the operator writes its own."""
    from tests.support.kstatus import kstatus

    created = _create(control_plane, "not-yet-looked-at")
    stored = _get(control_plane, "not-yet-looked-at")
    assert stored["status"] == {"observedGeneration": 0}, stored.get("status")
    assert created["metadata"]["generation"] == 1
    status, message = kstatus(stored)
    assert status == "InProgress" and "observed generation is 0" in message, (status, message)


def test_spec_update_keeps_status(control_plane: ControlPlane, namespace: str) -> None:
    status = _full_status()
    before = _create(control_plane, "spec-update")
    _patch_status(control_plane, "spec-update", status)

    # A spec change through the main resource, carrying a status too: with the status subresource
    # enabled the API server ignores the status part and keeps the stored one.
    changed = copy.deepcopy(status)
    changed.targets_ready = "0/1"
    patch = {"spec": {"benchmark": {"iterations": 30}}, "status": changed.to_wire()}
    control_plane.kubectl(
        "patch", "cmodel", "spec-update", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
    )

    after = _get(control_plane, "spec-update")
    assert after["spec"]["benchmark"]["iterations"] == 30
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert after["status"] == status.to_wire()
