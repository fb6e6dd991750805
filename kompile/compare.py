"""`kompile compare A B`: hold saved run results B to A (Polygraphy's split of running and
comparing). A and B are `.npz` files saved by a run, or artifact folders (their outputs.npz; a
folder's result.json also gives the precision whose default thresholds apply)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kompile.api.job_contract import RESULT_FILE, JobResult
from kompile.api.spec import Tolerances
from kompile.api.status import ValidationResult
from kompile.api.vocabulary import DetectionHead, TaskKind
from kompile.compile_jobs import run_results, validate
from kompile.compile_jobs.run_results import OUTPUTS_FILE, RunResults, RunResultsError


@dataclass
class Saved:
    results: RunResults
    path: Path
    precision: str | None


def load_saved(path: Path) -> Saved:
    """Saved results from an .npz file or an artifact folder; RunResultsError says what is missing."""
    if path.is_dir():
        npz = path / OUTPUTS_FILE
        if not npz.is_file():
            raise RunResultsError(f"{path} holds no {OUTPUTS_FILE}: pass an artifact folder or an .npz file")
        precision = None
        result_file = path / RESULT_FILE
        if result_file.is_file():
            try:
                precision = JobResult.loads(result_file.read_text()).target.precision
            except ValueError:
                precision = None
        return Saved(RunResults.load(npz), npz, precision)
    if not path.is_file():
        raise RunResultsError(f"{path}: no such file or folder")
    return Saved(RunResults.load(path), path, None)


def compare_saved(
    reference: Saved,
    candidate: Saved,
    precision: str | None,
    tolerances: Tolerances,
    task: TaskKind,
    detection_head: DetectionHead = "yolov8",
) -> ValidationResult:
    """B held to A with the precision's default thresholds (B's own, else fp32) and overrides."""
    chosen = precision or candidate.precision or "fp32"
    thresholds = validate.resolve_thresholds(chosen, tolerances).model_copy(
        update={"detection_head": detection_head}
    )
    return run_results.compare(reference.results, candidate.results, thresholds, task)
