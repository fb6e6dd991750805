"""The compile Job's contract, typed once and used by both sides: the environment the operator
sets and the Job reads (`JobSpec`), the exit codes the Job's podFailurePolicy acts on (`ExitCode`),
`result.json` (`JobResult`), written by the Job and read by the operator, and the compact copy of
the result that fits the 4 KiB a pod's termination message may hold, so the operator can fill
status without a store read."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from kompile.api.base import ApiModel
from kompile.api.catalog import Device
from kompile.api.spec import InputSpec, Target
from kompile.api.status import TargetStatus

RESULT_FILE = "result.json"
TIMING_CACHES = "timing-caches"
"""Folder beside the store's cache/ that holds TensorRT timing caches per GPU class and TVM tuning
databases per hardware class (kompile.compile_jobs.tvm_database)."""


class JobContractError(ValueError):
    """The Job's environment does not hold what the operator sets."""


class ExitCode(IntEnum):
    """What a compile Job's exit code means to its podFailurePolicy (the one retry policy)."""

    VERDICT = 0
    """The pipeline reached a verdict (validated or not: retrying cannot change it)."""
    BAD_INPUT = 2
    """The input is wrong (manifest, source, export): a retry cannot help, the Job fails at once."""
    STORE = 3
    """The artifact store was unreachable: a crash that a retry may fix, like any other code."""
    OUT_OF_MEMORY = 137
    """SIGKILL, which a container's exit code shows for the cgroup's OOM kill: a retry at the same memory
    limit would be killed again, so the Job fails at once (an eviction, which kills with 137 too, is
    matched first by its DisruptionTarget condition and retried)."""
    STOPPED = 143
    """SIGTERM (the Job's deadline passed, or its pod was deleted or evicted): nothing published, what
    a build had measured (a tvm tuning) shared; like a crash to the retry policy."""


@dataclass(frozen=True)
class JobDeadline:
    """When the compile Job's activeDeadlineSeconds ends: counted from the Job's creation (as the Job
    controller counts it, across retried pods), so a retried pod knows how much is left."""

    created: float
    """Unix time the operator created the Job."""
    seconds: int
    """Its activeDeadlineSeconds (the operator's KOMPILE_JOB_DEADLINE_SECONDS)."""

    KEPT_SHARE = 0.2
    """The last share of the deadline is kept to time and publish what was built: no candidate
    starts in it (tvm tuning may take 75% of the deadline, spec_limits.SEARCH_SHARE, so it fits)."""

    @property
    def ends(self) -> float:
        return self.created + self.seconds

    def left(self, now: float) -> float:
        return self.ends - now

    def stop_starting(self, now: float) -> bool:
        """True once less than KEPT_SHARE of the deadline is left."""
        return self.left(now) < self.KEPT_SHARE * self.seconds

    def to_text(self) -> str:
        return f"{self.created:.3f}+{self.seconds}"

    @classmethod
    def from_text(cls, text: str) -> JobDeadline:
        created, _, seconds = text.partition("+")
        return cls(created=float(created), seconds=int(seconds))


class JobEnv:
    """Names of the environment variables of a compile Job's container."""

    COMPILED_MODEL = "KOMPILE_COMPILED_MODEL"
    TARGET = "KOMPILE_TARGET"
    HARDWARE_CLASS = "KOMPILE_HARDWARE_CLASS"
    DEVICE = "KOMPILE_DEVICE"
    ARCH = "KOMPILE_ARCH"
    """The class's architecture (kubernetes.io/arch): which backends auto offers there."""
    ARTIFACT_PREFIX = "KOMPILE_ARTIFACT_PREFIX"
    WORK_DIR = "KOMPILE_WORK_DIR"
    TIMING_CACHE_URI = "KOMPILE_TIMING_CACHE_URI"
    S3_ENDPOINT = "KOMPILE_S3_ENDPOINT"
    SOURCE_DIR = "KOMPILE_SOURCE_DIR"
    """Where relative source paths resolve (tests and local runs; pods use the working directory)."""
    DEADLINE = "KOMPILE_JOB_DEADLINE"
    """JobDeadline as text: the Job's creation (unix time) + its activeDeadlineSeconds."""
    TERMINATION_LOG = "KOMPILE_TERMINATION_LOG"
    """Where the compact result goes (default /dev/termination-log)."""


@dataclass(frozen=True)
class JobSpec:
    """What the operator tells one compile Job: the CompiledModel, its one target, where to publish."""

    compiled_model: dict[str, Any]
    """apiVersion, kind, metadata (name, namespace, uid, generation) and spec of the CompiledModel."""
    target: Target
    hardware_class: str
    device: Device
    artifact_prefix: str
    work_dir: str = "/scratch"
    timing_cache_uri: str | None = None
    s3_endpoint: str | None = None
    arch: str | None = None
    """None: the Job's own machine's (a target not pinned to an architecture)."""
    deadline: JobDeadline | None = None
    """When the Job's deadline ends; None: no deadline known (candidates bounded by their budget)."""

    def to_env(self) -> list[dict[str, str]]:
        env = [
            (JobEnv.COMPILED_MODEL, json.dumps(self.compiled_model, separators=(",", ":"))),
            (JobEnv.TARGET, json.dumps(self.target.to_wire(), separators=(",", ":"))),
            (JobEnv.HARDWARE_CLASS, self.hardware_class),
            (JobEnv.DEVICE, self.device),
            (JobEnv.ARCH, self.arch),
            (JobEnv.ARTIFACT_PREFIX, self.artifact_prefix),
            (JobEnv.WORK_DIR, self.work_dir),
            (JobEnv.TIMING_CACHE_URI, self.timing_cache_uri),
            (JobEnv.S3_ENDPOINT, self.s3_endpoint),
            (JobEnv.DEADLINE, self.deadline.to_text() if self.deadline else None),
        ]
        return [{"name": name, "value": value} for name, value in env if value is not None]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobSpec:
        """Read what the operator set; JobContractError names a missing or malformed variable."""

        def need(name: str) -> str:
            value = env.get(name)
            if not value:
                raise JobContractError(f"environment variable {name} is required (the operator sets it)")
            return value

        try:
            doc = json.loads(need(JobEnv.COMPILED_MODEL))
            target = Target.model_validate_json(need(JobEnv.TARGET))
        except (ValueError, ValidationError) as err:
            raise JobContractError(
                f"{JobEnv.COMPILED_MODEL} or {JobEnv.TARGET} is malformed: {err}"
            ) from None
        try:
            deadline = JobDeadline.from_text(env[JobEnv.DEADLINE]) if env.get(JobEnv.DEADLINE) else None
        except ValueError:
            raise JobContractError(
                f"{JobEnv.DEADLINE}={env[JobEnv.DEADLINE]!r}: expected <unix time>+<seconds>"
            ) from None
        device = env.get(JobEnv.DEVICE) or "cpu"
        if device not in ("cpu", "cuda"):
            raise JobContractError(f"{JobEnv.DEVICE}={device!r}: use cpu or cuda")
        return cls(
            compiled_model=doc,
            target=target,
            hardware_class=need(JobEnv.HARDWARE_CLASS),
            device="cuda" if device == "cuda" else "cpu",
            artifact_prefix=need(JobEnv.ARTIFACT_PREFIX),
            work_dir=env.get(JobEnv.WORK_DIR) or "/scratch",
            timing_cache_uri=env.get(JobEnv.TIMING_CACHE_URI) or None,
            s3_endpoint=env.get(JobEnv.S3_ENDPOINT) or None,
            arch=env.get(JobEnv.ARCH) or None,
            deadline=deadline,
        )


PROGRESS_EVERY_SECONDS = 5.0
"""A running Job writes its latest progress line at most this often (kompile.compile_jobs.progress)."""


class JobProgress(ApiModel):
    """progress.json: what a running compile Job is doing, for the operator to show in the target's
    status (a Job runs for minutes, tuning for up to most of an hour)."""

    line: str = Field(description="The Job's latest progress line, as its log shows it.")
    at: str = Field(description="When the line was written (RFC 3339).")
    started: str = Field(description="When the Job's pipeline started (RFC 3339).")

    def dumps(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def loads(cls, data: str | bytes) -> JobProgress:
        return cls.model_validate_json(data)


class JobResult(ApiModel):
    """result.json: one target's outcome, beside its artifact (or alone when nothing was built)."""

    # Read by an operator that may be older or newer than the Job that wrote it: unknown keys pass.
    model_config = ApiModel.model_config | ConfigDict(extra="ignore")

    api_version: str | None = None
    compiled_model: str | None = None
    generation: int | None = None
    source_uri: str | None = None
    source_digest: str | None = None
    target: TargetStatus
    backend_version: str | None = None
    options: dict[str, str] | None = None
    toolchain: dict[str, str] | None = None
    signature: list[InputSpec] | None = None
    files: dict[str, int] | None = Field(
        default=None,
        description="Every file beside this one (path relative to it -> size in bytes): a cache hit "
        "serves the entry only when each is there at its size.",
    )
    saved_results: dict[str, str] | None = Field(
        default=None,
        description="Saved run results beside this file: reference (source outputs and inputs) and "
        "outputs (the artifact's), .npz files kompile compare reads.",
    )

    def dumps(self) -> str:
        return json.dumps(self.to_wire(), indent=2) + "\n"

    @classmethod
    def loads(cls, data: bytes | str) -> JobResult:
        """Parse result.json; ValueError when it is not one."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as err:
            raise ValueError(
                f"not a kompile result.json: {err.error_count()} problem(s), first: {err.errors()[0]['msg']}"
            ) from None


TERMINATION_LIMIT = 4096


def compact_result(target: TargetStatus, source_digest: str | None, backend_version: str | None) -> str:
    """A JSON document under the termination-message limit; detail is dropped before essentials."""
    doc: dict[str, Any] = {
        "target": target.to_wire(),
        "sourceDigest": source_digest,
        "backendVersion": backend_version,
    }
    t = doc["target"]
    t.pop("conditions", None)
    cands: list[dict[str, Any]] = t.get("candidates", [])
    validation: dict[str, Any] = t.get("validation") or {}

    def each(key: str, fn: Callable[[Any], Any]) -> None:
        for c in cands:
            if key in c:
                c[key] = fn(c[key])

    def trim(d: dict[str, Any], key: str, fn: Callable[[Any], Any]) -> None:
        if d.get(key) is not None:
            d[key] = fn(d[key])

    # Detail goes first; candidates keep their verdict and first-batch figures longest, since
    # they say why the winner won.
    shrinkers: list[Callable[[], object]] = [
        lambda: t.pop("eagerLatency", None),
        lambda: each("options", lambda _: None),
        lambda: each("latency", lambda lat: lat[:1]),
        lambda: each("message", lambda m: m[-200:]),
        lambda: validation.pop("thresholds", None),
        lambda: validation.pop("outputs", None),
        lambda: trim(t, "latency", lambda lat: lat[:1]),
        lambda: trim(t, "message", lambda m: m[-1000:]),
        lambda: validation.pop("failures", None),
        lambda: each("message", lambda _: None),
        lambda: trim(t.get("selection") or {}, "message", lambda m: m[:300]),
        # A precision ladder with remedies has a dozen candidates: the essentials of each last.
        lambda: t.pop("notOffered", None),
        lambda: t.update(candidates=[_essentials(c) for c in cands]),
    ]
    text = json.dumps(doc, separators=(",", ":"))
    for shrink in shrinkers:
        if len(text.encode()) <= TERMINATION_LIMIT:
            break
        shrink()
        text = json.dumps(doc, separators=(",", ":"))
    if len(text.encode()) > TERMINATION_LIMIT:
        # Bounded by construction: the verdict alone (the operator reads the rest from result.json).
        essentials = ("name", "backend", "precision", "phase", "reason", "artifact", "speedup")
        doc["target"] = {k: t[k] for k in essentials if k in t}
        doc["target"]["message"] = "figures in result.json: the termination message holds 4 KiB"
        text = json.dumps(doc, separators=(",", ":"))
    return text


def _essentials(c: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "backend", "precision", "phase", "reason", "selected")
    return {k: c[k] for k in keep if k in c}


def parse_compact(text: str) -> tuple[TargetStatus, str | None, str | None]:
    """Inverse of compact_result. Raises ValueError when the text is not such a document."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or "target" not in doc:
        raise ValueError("not a kompile job result")
    target = TargetStatus.model_validate(_fill_required(doc["target"]))
    return target, doc.get("sourceDigest"), doc.get("backendVersion")


def _fill_required(t: dict[str, Any]) -> dict[str, Any]:
    # Thresholds may have been dropped to fit the limit; the status keeps what it can.
    v = t.get("validation")
    if isinstance(v, dict) and "thresholds" not in v:
        v["thresholds"] = {"minCosine": 0.0, "topK": 1}
    return t
