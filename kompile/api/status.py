"""CompiledModel status: typed, so the API server never prunes what the operator writes.

The same document is what `kompile run --json` prints, so a local run and a cluster run can be
compared field for field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from kompile.api.base import ApiModel
from kompile.api.vocabulary import DetectionHead

ConditionStatus = Literal["True", "False", "Unknown"]
# Exported: built by an export-only backend (Core ML on Linux) that nothing here can run; recorded,
# never validated, so never selected or served. A phase of its own, not Succeeded without a
# verdict: every check of "Succeeded" keeps meaning "validated".
TargetPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Skipped", "Exported"]

# Condition types the operator and the local pipeline write.
COMPILED = "Compiled"
VALIDATED = "Validated"
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
"""kstatus' two conditions (Flux's health checks, cli-utils): written from Ready by progress_conditions."""


# What status holds per target: the tournament builds no more (kompile.compile_jobs.build).
CANDIDATES_MAX = 24
# Targets status holds: more are refused before any Job (kompile.operator.spec_limits).
TARGETS_MAX = 64


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type, for example Ready, Compiled, Validated.", max_length=316)
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="CamelCase reason for the condition's last transition.",
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
    )
    message: str = Field(default="", description="Human-readable details.", max_length=32768)
    last_transition_time: str = Field(
        description="When status last changed (RFC 3339); unchanged when only the message changes."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this condition was computed from."
    )


class LatencyStats(ApiModel):
    """Latency of one runtime at one batch size."""

    batch_size: int = Field(description="Batch size timed.", ge=1)
    p50_ms: float = Field(description="Median latency in milliseconds.")
    p90_ms: float = Field(description="90th percentile latency in milliseconds.")
    p99_ms: float = Field(description="99th percentile latency in milliseconds.")
    throughput: float = Field(description="Samples per second at this batch size.")
    spread: float | None = Field(
        default=None, description="(p90 - p50) / p50: how widely the timed calls scattered."
    )
    stable: bool | None = Field(
        default=None,
        description="False when the figure never settled: the medians of consecutive timing windows "
        "kept differing by more than benchmark.settleTolerance, other processes kept using more "
        "than half a core meanwhile (a busy machine), or the calls ran at two speeds (p90 over twice "
        "p50, or p50 over twice p10). `unsettled` says which.",
    )
    unsettled: str | None = Field(
        default=None,
        description="Why the figure never settled (stable false), each failed check in words with its "
        "figures: how far the last windows' medians differed, the cores other processes kept busy, or "
        "the two speeds the calls ran at.",
    )
    busy_cores: float | None = Field(
        default=None, description="CPU cores other processes used while this figure was timed (mean)."
    )


class DetectionCheck(ApiModel):
    """How an artifact's detections agree with the source's (spec.validation.task detection): each
    image's output decoded as a YOLO head (non-maximum suppression within a class), detections of
    the same class overlapping by IoU 0.5 matched, over every reference sample."""

    required: int = Field(description="The source's detections scored above detectionScore + margin.")
    found: int = Field(
        description="Of those, how many the artifact finds at a score above detectionScore - margin."
    )
    extra: int = Field(
        description="The artifact's detections above detectionScore + margin the source does not make "
        "(above detectionScore - margin)."
    )
    agreement: float = Field(description="found / (required + extra); 1 when both are 0.")


class OutputCheck(ApiModel):
    """Validation figures for one model output."""

    name: str = Field(description="Output name.")
    max_abs_error: float = Field(description="Largest absolute difference seen.")
    max_rel_error: float = Field(description="Largest relative difference seen.")
    scale: float | None = Field(
        default=None,
        description="max(1, the largest |value| of the source's output): maxScaledError is per unit "
        "of it (unset for integer and boolean outputs).",
    )
    cosine: float = Field(description="Smallest per-sample cosine similarity seen.")
    worst_sample: int | None = Field(
        default=None,
        description="Index of the reference sample the smallest cosine was seen in (a failure names "
        "it, and says where static int8 held it out of calibration).",
    )
    top_k_agreement: float | None = Field(
        default=None,
        description="Share of samples whose source top-1 class is among the artifact's top-k (or "
        "within fp32's resolution, 1e-3 per unit of scale, of the k-th: a near-tie) (classifier outputs).",
    )
    top_k: int | None = Field(
        default=None,
        description="k used for this output's agreement: the threshold's, capped at classes - 1.",
    )
    agreement: float | None = Field(
        default=None,
        description="Share of values equal to the source's, for integer and boolean outputs "
        "(predicted labels, masks), held to minTopKAgreement instead of the float bounds.",
    )
    lost_slices: str | None = Field(
        default=None,
        description="Slices of the output (along axis 1 or its last axis, in a sample) whose values "
        "move in the source by more than fp32's resolution of the output (1e-3 per unit of scale) and "
        "by under a tenth of that in the artifact, or that the artifact holds at two values wrong "
        "somewhere by a quarter of that (along a softmax's axis, only classes given a tenth of the "
        "mass somewhere are judged): a part of the output the artifact lost, which "
        "cosine over the whole output cannot see when that part's values are much smaller than the "
        "rest's (a detector's class probabilities beside box coordinates in pixels). Fails the output.",
    )
    finite: bool = Field(description="False when the artifact produced NaN or Inf.")
    detections: DetectionCheck | None = Field(
        default=None,
        description="spec.validation.task detection: the output decoded as a YOLO head and the "
        "detections of artifact and source matched.",
    )


class Thresholds(ApiModel):
    """The thresholds a verdict was held to (precision defaults merged with overrides)."""

    max_abs_error: float | None = Field(default=None, description="Largest allowed absolute difference.")
    max_scaled_error: float | None = Field(
        default=None,
        description="Largest allowed absolute difference per unit of an output's scale (OutputCheck.scale).",
    )
    max_rel_error: float | None = Field(default=None, description="Largest allowed relative difference.")
    min_cosine: float = Field(description="Smallest allowed cosine similarity.")
    min_top_k_agreement: float | None = Field(default=None, description="Smallest allowed top-k agreement.")
    top_k: int = Field(description="k for top-k agreement.")
    max_accuracy_drop: float | None = Field(
        default=None, description="Largest allowed task accuracy drop, in points (labelled data only)."
    )
    min_detection_agreement: float | None = Field(
        default=None, description="Smallest allowed detection agreement (task detection only)."
    )
    detection_score: float | None = Field(
        default=None, description="Class score a detection needs (task detection only)."
    )
    detection_margin: float | None = Field(
        default=None, description="Borderline band each side of detectionScore (task detection only)."
    )
    detection_head: DetectionHead | None = Field(
        default=None, description="How the YOLO head was read: yolov8 or yolov5 (task detection only)."
    )


class TaskAccuracy(ApiModel):
    """Task accuracy on labelled reference data: the source model's and the artifact's."""

    output: str = Field(description="Output read as class scores (its argmax is the prediction).")
    labelled: int = Field(description="Number of labelled samples.")
    reference: float = Field(description="The source model's accuracy, in percent.")
    accuracy: float = Field(
        description="The artifact's accuracy, in percent (a near-tie it breaks the other way, scores "
        "within 1e-3 per unit of the output's scale, read as the source's answer)."
    )
    drop: float = Field(description="reference - accuracy, in percentage points.")


class ValidationResult(ApiModel):
    """The verdict of comparing an artifact's outputs with the source model's."""

    passed: bool = Field(description="True when every output met every threshold.")
    samples: int = Field(description="Number of reference samples compared.")
    outputs: list[OutputCheck] = Field(default_factory=list, description="Figures per output.")
    thresholds: Thresholds = Field(description="Thresholds the figures were held to.")
    failures: list[str] = Field(default_factory=list, description="Which thresholds were missed.")
    checked_at: list[str] = Field(
        default_factory=list,
        description=(
            "Sizes besides the reference inputs' where the outputs were held to the same thresholds "
            "and met them: another benchmark batch or the batch max ('batch 4'), half a dynamic dim's opt "
            "('sequence 16'), "
            "its min and max ('sequence 1', 'sequence 512')."
        ),
    )
    not_checked_at: list[str] = Field(
        default_factory=list,
        description=(
            "Sizes a dynamic dim allows that the outputs could not be held at, and why: the source model "
            "itself fails there or gives NaN or Inf ('sequence 8: the source model ... failed on ...'), "
            "or they lie past the growth the check at the max allows."
        ),
    )
    task_accuracy: TaskAccuracy | None = Field(
        default=None, description="Accuracy against the labels, when the reference data has them."
    )

    def detection_agreement(self) -> float | None:
        """The agreement of the output judged as detections (task detection), if any."""
        return next((o.detections.agreement for o in self.outputs if o.detections), None)

    def worst_float_figures(self) -> tuple[float | None, float | None]:
        """The largest max abs error and the smallest cosine over the float outputs, for a summary:
        an integer or boolean output (a label) is judged by its equal values instead."""
        floats = [o for o in self.outputs if o.agreement is None]
        return (
            max((o.max_abs_error for o in floats), default=None),
            min((o.cosine for o in floats), default=None),
        )


class Artifact(ApiModel):
    """Where a compiled artifact is stored."""

    uri: str = Field(description="URI of the model repository entry (Triton layout).")
    digest: str = Field(description="sha256 of the compiled model file, as sha256:<hex>.")
    size_bytes: int | None = Field(default=None, description="Size of the compiled model file.")


class CandidateStatus(ApiModel):
    """One candidate of a target: how it built, validated and timed, and whether it won."""

    name: str = Field(description="Candidate name.")
    backend: str = Field(description="Backend that built it.")
    precision: str = Field(description="Its precision.")
    phase: TargetPhase = Field(
        description="Succeeded (validated), Failed, Skipped, or Exported (built, not validated)."
    )
    reason: str | None = Field(default=None, description="CamelCase reason when Failed or Skipped.")
    message: str | None = Field(default=None, description="Details.")
    selected: bool = Field(default=False, description="True for the winner.")
    options: dict[str, str] | None = Field(default=None, description="Options the backend used.")
    compile_seconds: float | None = Field(default=None, description="Time the compile took.")
    max_abs_error: float | None = Field(default=None, description="Largest absolute error seen.")
    min_cosine: float | None = Field(default=None, description="Smallest cosine similarity seen.")
    accuracy: float | None = Field(
        default=None, description="Task accuracy on the labelled reference data, in percent."
    )
    accuracy_drop: float | None = Field(
        default=None, description="The source model's accuracy minus this one's, in points."
    )
    detection_agreement: float | None = Field(
        default=None,
        description="spec.validation.task detection: the share of detections it and the source "
        "agree on (validation.outputs[].detections).",
    )
    latency: list[LatencyStats] = Field(default_factory=list, description="Latency per batch size.")
    speedup: float | None = Field(default=None, description="Eager p50 / candidate p50, first batch size.")
    speedup_stable: bool | None = Field(
        default=None, description="False when eager's or this candidate's first-batch p50 never settled."
    )
    artifact_digest: str | None = Field(default=None, description="sha256 of its compiled file.")


class SelectionStatus(ApiModel):
    """Why the winner won."""

    policy: str = Field(description="minLatency or maxThroughput.")
    batch_size: int | None = Field(default=None, description="Batch size the decision was made at.")
    latency_budget_ms: float | None = Field(default=None, description="maxThroughput's p90 budget.")
    winner: str | None = Field(default=None, description="Name of the selected candidate.")
    message: str = Field(default="", description="The figures that decided it.")


class TargetStatus(ApiModel):
    """Observed state of one target."""

    name: str = Field(description="Target name (from spec.targets or the hardware class).")
    backend: str = Field(description="Backend that built the artifact.")
    precision: str = Field(description="Precision of the artifact.")
    phase: TargetPhase = Field(
        description="Pending, Running, Succeeded (validated), Failed, Skipped, or Exported (built by "
        "an export-only backend, not validated: never selected or served)."
    )
    hardware_class: str | None = Field(default=None, description="Hardware class the target is for.")
    job: str | None = Field(default=None, description="Name of the compile Job.")
    node: str | None = Field(default=None, description="Node the compile ran on.")
    cached: bool = Field(default=False, description="True when a cached artifact was reused.")
    cache_key: str | None = Field(default=None, description="Content address of the compile.")
    artifact: Artifact | None = Field(default=None, description="The compiled artifact.")
    latency: list[LatencyStats] = Field(default_factory=list, description="Artifact latency per batch size.")
    eager_latency: list[LatencyStats] = Field(
        default_factory=list, description="Eager source model latency per batch size, same run."
    )
    speedup: float | None = Field(
        default=None, description="Eager p50 / artifact p50 at the first batch size."
    )
    speedup_stable: bool | None = Field(
        default=None,
        description="False when a figure behind the speedup (eager's or the artifact's p50 at the "
        "first batch size) never settled: read the speedup as unreliable.",
    )
    validation: ValidationResult | None = Field(default=None, description="Validation verdict.")
    registered_version: str | None = Field(default=None, description="MLflow model version.")
    compile_seconds: float | None = Field(default=None, description="Time the compile took.")
    validation_seconds: float | None = Field(default=None, description="Time the validation took.")
    reason: str | None = Field(
        default=None, description="CamelCase reason when the phase is Failed, Skipped or Exported."
    )
    message: str | None = Field(default=None, description="Details, for example the tail of the error.")
    candidates: list[CandidateStatus] = Field(
        default_factory=list,
        # Eight listed candidates, or a precision ladder with its int8 remedies.
        max_length=CANDIDATES_MAX,
        description="Every candidate compiled for this target (empty with a single backend).",
    )
    not_offered: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Candidates backend or precision auto did not offer or try for this target, each "
        "with why (precision, device, source kind, no fast bf16 on this CPU, or the ladder stopped).",
    )
    selection: SelectionStatus | None = Field(
        default=None, description="How the winner among the candidates was chosen."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Per-target conditions (Compiled, Validated).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class BestTarget(ApiModel):
    """The fastest validated target."""

    target: str = Field(description="Name of the best target.")
    speedup: float | None = Field(default=None, description="Its speedup over eager.")
    p50_ms: float | None = Field(default=None, description="Its median latency at the first batch size.")


class Baseline(ApiModel):
    """A reference runtime timed beside the artifacts (eager PyTorch, torch.compile)."""

    name: str = Field(description="Baseline name: eager or torch.compile.")
    latency: list[LatencyStats] = Field(default_factory=list, description="Latency per batch size.")
    compile_seconds: float | None = Field(default=None, description="Time spent compiling, if any.")


class RegistryStatus(ApiModel):
    """Where the run was recorded."""

    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI used.")
    model_name: str | None = Field(default=None, description="Registered model name.")
    run_id: str | None = Field(default=None, description="MLflow parent run id.")
    aliases_set: bool = Field(default=False, description="Per-class aliases were moved for this generation.")
    aliases: dict[str, str] = Field(
        default_factory=dict, description="Per-class aliases moved, class -> registered version."
    )
    pending_aliases: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Alias moves that failed and are retried at each reconcile until they succeed, "
        "each with why.",
    )


RolloutPhase = Literal[
    "Pending", "Blocked", "Progressing", "Canary", "Ready", "RolledBack", "Written", "Failed"
]


class RolloutStatus(ApiModel):
    """Observed state of the KServe rollout for one hardware class."""

    hardware_class: str = Field(description="Hardware class served.")
    phase: RolloutPhase = Field(
        description="Pending, Blocked (gate refused), Progressing, Canary, Ready, RolledBack, Written "
        "(GitOps mode) or Failed."
    )
    inference_service: str | None = Field(default=None, description="InferenceService name.")
    target: str | None = Field(default=None, description="Target whose artifact serves (or would).")
    storage_uri: str | None = Field(default=None, description="storageUri of the serving model.")
    deployment_mode: str | None = Field(default=None, description="KServe deployment mode in effect.")
    canary_traffic_percent: int | None = Field(default=None, description="Traffic on the new revision.")
    previous_storage_uri: str | None = Field(default=None, description="What served before this rollout.")
    started_at: str | None = Field(default=None, description="When the current step began (RFC 3339).")
    message: str | None = Field(default=None, description="Details.")


class LatestPointer(ApiModel):
    """A class's `latest` pointer in the artifact store, as this generation wrote it."""

    hardware_class: str = Field(description="Hardware class the pointer is for.")
    uri: str = Field(description="The pointer: <store>/latest/<namespace>/<modelName>/<class>.json.")
    target: str = Field(description="Target whose artifact it names.")
    digest: str = Field(description="Digest of the artifact it names (sha256:<hex>).")


class CompiledModelStatus(ApiModel):
    """Observed state of a CompiledModel."""

    observed_generation: int | None = Field(default=None, description="Generation last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Summary conditions: Compiled, Validated, Ready, and kstatus' Reconciling and Stalled "
        "(Flux's health checks); Registered (MLflow) and StoreReachable (artifact store) when they apply.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    targets: list[TargetStatus] = Field(
        default_factory=list,
        max_length=TARGETS_MAX,
        description="One entry per target.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    targets_ready: str | None = Field(default=None, description="Validated targets / all targets, e.g. 2/3.")
    best: BestTarget | None = Field(default=None, description="The fastest validated target.")
    source_digest: str | None = Field(default=None, description="sha256 of the source model.")
    baselines: list[Baseline] = Field(
        default_factory=list, max_length=8, description="Reference runtimes timed in the same run."
    )
    registry: RegistryStatus | None = Field(default=None, description="Registry results.")
    rollouts: list[RolloutStatus] = Field(
        default_factory=list,
        max_length=64,
        description="Rollout per hardware class.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["hardwareClass"]},
    )
    latest: list[LatestPointer] = Field(
        default_factory=list,
        max_length=64,
        description="Per hardware class, the stable pointer to its winner in the artifact store, written "
        "once the generation has settled (devices poll it; see docs/operations.md, Device fleets).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["hardwareClass"]},
    )


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> list[Condition]:
    """Return conditions with `type_` set; lastTransitionTime moves only when status changes."""
    previous = next((c for c in conditions if c.type == type_), None)
    when = previous.last_transition_time if previous and previous.status == status else now_rfc3339()
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
    return [c for c in conditions if c.type != type_] + [new]


def summarize(status: CompiledModelStatus, generation: int | None = None) -> CompiledModelStatus:
    """Derive targetsReady, best and the summary conditions from the per-target results."""
    targets = status.targets
    done = [t for t in targets if t.phase in ("Succeeded", "Failed", "Skipped", "Exported")]
    valid = [t for t in targets if t.phase == "Succeeded" and t.validation and t.validation.passed]
    # Exported artifacts have no verdict: they neither count toward Ready nor hold it back.
    exported = [t for t in targets if t.phase == "Exported"]
    considered = [t for t in targets if t.phase not in ("Skipped", "Exported")]
    status.targets_ready = f"{len(valid)}/{len(considered)}"
    timed = [t for t in valid if t.latency]
    if timed:
        best = min(timed, key=lambda t: t.latency[0].p50_ms)
        status.best = BestTarget(target=best.name, speedup=best.speedup, p50_ms=best.latency[0].p50_ms)
    else:
        status.best = None

    conds = status.conditions
    compiled = [t for t in considered if t.artifact is not None]
    if len(done) < len(targets):
        conds = set_condition(conds, COMPILED, "Unknown", "Compiling", "targets still compiling", generation)
        conds = set_condition(conds, VALIDATED, "Unknown", "Compiling", "", generation)
        # A target held up (a pod that cannot be scheduled, an image that cannot be pulled) is named:
        # Ready's message is what kubectl get and Argo CD show.
        held = [f"{t.name}: {t.reason}" for t in targets if t not in done and t.reason]
        msg = "compile in progress" + ("; waiting: " + ", ".join(held) if held else "")
        conds = set_condition(conds, READY, "False", "Progressing", msg, generation)
    else:
        failed = [t for t in considered if t not in valid]
        if len(compiled) == len(considered) and considered:
            conds = set_condition(conds, COMPILED, "True", "AllCompiled", "", generation)
        else:
            names = ", ".join(t.name for t in considered if t.artifact is None) or "no target"
            conds = set_condition(
                conds, COMPILED, "False", "CompileFailed", f"not compiled: {names}", generation
            )
        if considered and not failed:
            conds = set_condition(conds, VALIDATED, "True", "AllValidated", "", generation)
            msg = f"{len(valid)}/{len(considered)} targets validated"
            if exported:
                msg += f", {len(exported)} exported (not validated)"
            conds = set_condition(conds, READY, "True", "Validated", msg, generation)
        elif exported and not considered:
            msg = f"{len(exported)} targets exported, not validated: " + str(exported[0].message)
            conds = set_condition(conds, VALIDATED, "False", "Exported", msg, generation)
            conds = set_condition(conds, READY, "True", "Exported", msg, generation)
        else:
            detail = "; ".join(f"{t.name}: {t.reason or 'Failed'}" for t in failed) or "no target to build"
            reason = failed[0].reason or "TargetFailed" if failed else "NoTargets"
            conds = set_condition(conds, VALIDATED, "False", reason, detail, generation)
            conds = set_condition(conds, READY, "False", reason, detail, generation)
    status.conditions = conds
    status.observed_generation = generation
    return status


def progress_conditions(status: CompiledModelStatus, suspended: bool = False) -> None:
    """Set Reconciling and Stalled from Ready and the targets, the verdicts of the Argo CD health
    check (gitops/argocd/health.lua), for kstatus (Flux's health checks), which tells a failure
    from work in progress only by Stalled: without it a failed CompiledModel read as InProgress
    until a Flux wait timed out. Reconciling: targets still compile (or wait, suspended) or Ready
    is Unknown. Stalled: Ready is False with nothing left running (a failed target, a refusal, or an
    outage the operator retries, as Argo CD's Degraded)."""
    generation = status.observed_generation
    ready = next((c for c in status.conditions if c.type == READY), None)
    running = [t for t in status.targets if t.phase in ("Pending", "Running")]
    conds = status.conditions
    if ready is None or running or ready.status == "Unknown":
        reason = "Suspended" if suspended and running else ready.reason if ready else "Progressing"
        message = (ready.message if ready else "") or ""
        conds = set_condition(conds, RECONCILING, "True", reason, message, generation)
        conds = set_condition(conds, STALLED, "False", reason, "", generation)
    else:
        stalled = ready.status == "False"
        flag: ConditionStatus = "True" if stalled else "False"
        message = ready.message if stalled else ""
        conds = set_condition(conds, RECONCILING, "False", ready.reason, "", generation)
        conds = set_condition(conds, STALLED, flag, ready.reason, message, generation)
    status.conditions = conds
