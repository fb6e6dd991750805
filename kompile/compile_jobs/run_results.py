"""Saved run results (Polygraphy's split of running and comparing): the inputs and the outputs one
runner gave on them, as an `.npz` with names. The pipeline computes the source model's outputs once
per run (`reference.npz`), holds every candidate to them, and saves each artifact's own outputs
(`outputs.npz`) beside its result.json, so two runs made on different machines or days can be
compared later with `kompile compare A B`."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kompile.api.status import Thresholds, ValidationResult
from kompile.api.vocabulary import TaskKind
from kompile.compile_jobs import validate

Array = np.ndarray[Any, Any]
Feeds = dict[str, Array]
REFERENCE_FILE = "reference.npz"
OUTPUTS_FILE = "outputs.npz"
_META = "__kompile__"
_LABELS = "labels"
FORMAT = 1


class RunResultsError(ValueError):
    """A file that is not saved run results, or two results that cannot be compared."""


def inputs_digest(inputs: Sequence[Feeds]) -> str:
    """sha256 over every input array (name, dtype, shape, bytes), in sample order."""
    h = hashlib.sha256()
    for i, feed in enumerate(inputs):
        for name in sorted(feed):
            a = np.asarray(feed[name], order="C")
            h.update(f"{i}/{name}/{a.dtype.str}/{a.shape}".encode())
            h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


@dataclass
class RunResults:
    """What `label` (eager:<model>, or a candidate like onnxruntime-int8) output on some inputs."""

    label: str
    output_names: list[str]
    outputs: list[list[Array]]
    inputs: list[Feeds] = field(default_factory=list)
    """Kept in the reference; an artifact's results carry only their digest."""
    digest: str = ""
    """inputs_digest of the inputs these outputs were computed on."""
    labels: Array | None = None
    """Class labels of the inputs (spec.validation.labelsKey), one per row, in sample order."""

    def __post_init__(self) -> None:
        if self.inputs and not self.digest:
            self.digest = inputs_digest(self.inputs)

    def save(self, path: Path, *, with_inputs: bool = True) -> Path:
        arrays: dict[str, Array] = {}
        for i, outs in enumerate(self.outputs):
            for name, value in zip(self.output_names, outs, strict=True):
                arrays[f"output/{i}/{name}"] = np.asarray(value)
        if with_inputs:
            for i, feed in enumerate(self.inputs):
                for name, value in feed.items():
                    arrays[f"input/{i}/{name}"] = np.asarray(value)
            if self.labels is not None:
                arrays[_LABELS] = np.asarray(self.labels)
        meta = {"format": FORMAT, "label": self.label, "outputNames": self.output_names}
        meta |= {"samples": len(self.outputs), "inputsDigest": self.digest}
        arrays[_META] = np.array(json.dumps(meta))
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path) -> RunResults:
        takes = "compare takes the reference.npz and outputs.npz kompile run saves, or an artifact folder"
        if path.is_file() and not zipfile.is_zipfile(path):
            raise RunResultsError(f"{path}: not kompile run results: not an .npz archive; {takes}")
        try:
            with np.load(path, allow_pickle=False) as data:
                if _META not in data.files:
                    raise RunResultsError(
                        f"{path}: not kompile run results: an .npz written by something other than "
                        f"kompile run (it holds {', '.join(data.files[:5]) or 'no arrays'}); {takes}"
                    )
                meta = json.loads(str(data[_META]))
                names: list[str] = list(meta["outputNames"])
                samples = int(meta["samples"])
                outputs = [[data[f"output/{i}/{n}"] for n in names] for i in range(samples)]
                inputs: list[Feeds] = [{} for _ in range(samples)]
                labels = data[_LABELS] if _LABELS in data.files else None
                for key in data.files:
                    if key.startswith("input/"):
                        _, i, name = key.split("/", 2)
                        inputs[int(i)][name] = data[key]
        except RunResultsError:
            raise
        except (OSError, ValueError, KeyError) as err:
            raise RunResultsError(f"{path}: not kompile run results ({type(err).__name__}: {err})") from None
        return cls(
            str(meta["label"]), names, outputs, [f for f in inputs if f], str(meta["inputsDigest"]), labels
        )

    def nonfinite(self) -> list[int]:
        """The samples some output of which holds NaN or Inf."""
        return [i for i, outs in enumerate(self.outputs) if not all(np.isfinite(o).all() for o in outs)]

    def with_outputs(self, label: str, outputs: list[list[Array]]) -> RunResults:
        """Another runner's outputs on these same inputs."""
        return RunResults(label, list(self.output_names), outputs, digest=self.digest)


def compare(
    reference: RunResults,
    candidate: RunResults,
    thresholds: Thresholds,
    task: TaskKind = "auto",
    held_out: Collection[int] = (),
) -> ValidationResult:
    """Hold `candidate` to `reference`; both must have run on the same inputs. `held_out`: the
    samples the candidate's calibration never saw."""
    if reference.digest and candidate.digest and reference.digest != candidate.digest:
        raise RunResultsError(
            f"{reference.label} and {candidate.label} ran on different inputs "
            f"({reference.digest[:19]} vs {candidate.digest[:19]}): compare results of one reference set"
        )
    if reference.output_names != candidate.output_names:
        raise RunResultsError(
            f"output names differ: {reference.label} has {reference.output_names}, "
            f"{candidate.label} has {candidate.output_names}"
        )
    return validate.compare(
        reference.outputs,
        candidate.outputs,
        reference.output_names,
        thresholds,
        task,
        reference.labels,
        held_out,
    )
