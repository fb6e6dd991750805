"""A manifest written for a model file: what `kompile init MODEL_FILE` saves and `kompile run
MODEL_FILE` runs. The inputs come from the file (the ONNX graph, the torch.export signature), fleet
mode compiles for every hardware class (here: this machine's), and the YAML carries comments that
say what to change before committing it or applying it to a cluster."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import yaml

from kompile.api.resource import API_VERSION, KIND
from kompile.api.spec import InputSpec, static_batch
from kompile.api.vocabulary import DNS_LABEL_PATTERN, NAME_MAX, TargetPrecision

if TYPE_CHECKING:
    from kompile.compile_jobs.signature import Input

SUFFIXES = {".onnx": "onnx", ".pt2": "pt2"}


class StarterError(ValueError):
    """A model file or flag kompile cannot write a manifest for; the message says what to change."""


@dataclass
class StarterOptions:
    dims: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Ranges by dynamic dim name, from --dim NAME=MIN:OPT:MAX."""
    precisions: list[str] = field(default_factory=lambda: ["fp32"])
    backend: str = "auto"
    name: str | None = None
    dataset: Path | None = None
    """--dataset: an .npz of reference inputs; validation runs on it and it sizes the dims it shows."""
    dataset_uri: str = ""
    """How the manifest names that file (relative to the manifest's folder, as the source)."""


def model_format(path: Path) -> str | None:
    """huggingface for a model folder (config.json beside the weights), onnx or pt2 by suffix."""
    from kompile.compile_jobs.huggingface import is_model_folder

    return "huggingface" if is_model_folder(path) else SUFFIXES.get(path.suffix.lower())


def is_model_file(path: Path) -> bool:
    return model_format(path) is not None


def parse_dim(text: str) -> tuple[str, tuple[int, int, int]]:
    """NAME=MIN:OPT:MAX (or NAME=SIZE for a fixed size)."""
    name, _, spec = text.partition("=")
    parts = spec.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not name or len(values) not in (1, 3) or min(values, default=0) < 1:
        raise StarterError(f"--dim {text!r}: write NAME=MIN:OPT:MAX (for example batch=1:1:32) or NAME=SIZE")
    lo, opt, hi = values * 3 if len(values) == 1 else values
    if not lo <= opt <= hi:
        raise StarterError(f"--dim {text!r}: need MIN <= OPT <= MAX")
    return name, (lo, opt, hi)


def _dns_name(stem: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:63].strip("-")
    return name or "model"


def _check_flags(opts: StarterOptions) -> None:
    """Flag values the manifest's schema would refuse, named as the flags: the user wrote no
    spec.fleet.precisions[0]."""
    from kompile.api.catalog import AUTO, CATALOG

    allowed = get_args(TargetPrecision)
    bad = [p for p in opts.precisions if p not in allowed]
    if bad:
        raise StarterError(f"--precision {', '.join(bad)}: use {', '.join(allowed[:-1])} or {allowed[-1]}")
    if opts.backend != AUTO and opts.backend not in CATALOG:
        raise StarterError(f"--backend {opts.backend}: use {AUTO} or one of {', '.join(CATALOG)}")
    if opts.name is not None and not (
        re.fullmatch(DNS_LABEL_PATTERN, opts.name) and len(opts.name) <= NAME_MAX
    ):
        raise StarterError(
            f"--name {opts.name}: a DNS label of at most {NAME_MAX} characters (lower-case letters, "
            "digits and '-', starting and ending with a letter or digit)"
        )


def manifest_for(model: Path, source_uri: str, opts: StarterOptions) -> dict[str, Any]:
    """The CompiledModel document for `model`, its source named `source_uri`."""
    from kompile.compile_jobs.signature import input_specs, read_signature

    fmt = model_format(model)
    if fmt is None and model.suffix.lower() in (".yaml", ".yml"):
        raise StarterError(
            f"{model} is a manifest already (init writes one for a model file): run it with "
            f"`kompile run {model}`, or check it with `kompile check {model}`"
        )
    if fmt is None:
        from kompile.compile_jobs.source_files import unreadable_model_hint

        raise StarterError(
            unreadable_model_hint(model)
            or f"{model}: kompile writes manifests for .onnx and .pt2 files and Hugging Face model folders"
        )
    _check_flags(opts)
    inputs = read_signature(model, fmt)
    known = {s.name for i in inputs for s in i.shape if not isinstance(s, int)}
    unknown = sorted(set(opts.dims) - known)
    if unknown:
        raise StarterError(
            f"--dim {', '.join(unknown)}: {model.name} has no dynamic dimension of that name; "
            f"its dynamic dimensions are {sorted(known) or 'none'}"
        )
    dims = dict(opts.dims)
    if opts.dataset is not None:
        dims |= _dataset_dims(opts.dataset, inputs, dims)
    fleet: dict[str, Any] = {"enabled": True, "precisions": list(opts.precisions)}
    if opts.backend != "auto":
        fleet |= {"cpuBackend": opts.backend, "gpuBackend": opts.backend}
    spec: dict[str, Any] = {
        "source": {"uri": source_uri},
        "inputs": input_specs(inputs, dims),
        "fleet": fleet,
        "benchmark": {"batchSizes": [_timed_batch(input_specs(inputs, dims))]},
    }
    if opts.dataset is not None:
        spec["validation"] = {"dataset": opts.dataset_uri or str(opts.dataset)}
    from kompile.compile_jobs.detections import ultralytics_detector

    if fmt == "onnx" and ultralytics_detector(model):
        # The outputs-only gate passed an int8 detector that lost objects: judge the detections.
        spec.setdefault("validation", {})["task"] = "detection"
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": opts.name or _dns_name(model.name if fmt == "huggingface" else model.stem)},
        "spec": spec,
    }


def _dataset_dims(
    path: Path, inputs: list[Input], given: dict[str, tuple[int, int, int]]
) -> dict[str, tuple[int, int, int]]:
    """Ranges for the dynamic dims (not the batch, not set by --dim) whose size the dataset shows:
    that size is the opt, inside the guessed range where it fits, else the only size (a Silero VAD
    chunk of 576 samples, which the guess of 16 to 256 cannot run). A guess that held no real input
    is what made such a model fail before any compile."""
    from kompile.compile_jobs.inputs import InputMismatch, read_npz
    from kompile.compile_jobs.signature import Dim, input_specs

    try:
        shapes = {k: a.shape for k, a in read_npz(path, [i.name for i in inputs]).items()}
    except InputMismatch as err:
        raise StarterError(f"--dataset {err}") from None
    leading = next((i for i in inputs if i.shape), None)
    batch = leading.shape[0].name if leading and isinstance(leading.shape[0], Dim) else None
    seen: dict[str, set[int]] = {}
    for item in inputs:
        if len(shapes[item.name]) != len(item.shape):
            continue  # the run says what is wrong with it
        for axis, size in enumerate(item.shape):
            if isinstance(size, Dim) and size.name != batch and size.name not in given:
                seen.setdefault(size.name, set()).add(shapes[item.name][axis])
    guessed = {
        d["name"]: (d["min"], d["opt"], d["max"])
        for doc in input_specs(inputs, given)
        for d in doc.get("dynamicDims", [])
    }
    out: dict[str, tuple[int, int, int]] = {}
    for name, sizes in seen.items():
        if len(sizes) != 1 or min(sizes) < 1:
            continue  # inputs disagree: the run reports it
        (n,) = sizes
        lo, _, hi = guessed[name]
        out[name] = (lo, n, hi) if lo <= n <= hi else (n, n, n)
    return out


def _timed_batch(specs: list[dict[str, Any]]) -> int:
    """1 along a dynamic batch; a static input's own batch (a [2, 16] input runs only at 2)."""
    return static_batch([InputSpec.model_validate(s) for s in specs]) or 1


def _block(doc: dict[str, Any], indent: int = 0) -> str:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    return "".join(" " * indent + line + "\n" for line in text.splitlines())


def commented_yaml(doc: dict[str, Any], model: Path) -> str:
    """The manifest with comments that say where each part came from and what to change."""
    spec = doc["spec"]
    guessed = list(dict.fromkeys(d["name"] for i in spec["inputs"] for d in i.get("dynamicDims", [])))
    folder = model.is_dir()
    out = [
        f"# CompiledModel for {model.name}, written by `kompile init`.",
        "#   here:        kompile run <this file>",
        "#   a cluster:   kubectl apply -f <this file>   (the source must then be reachable from the",
        "#                compile Jobs: s3://bucket/key, models:/name/version or a path in the image)",
        _block({k: doc[k] for k in ("apiVersion", "kind", "metadata")}).rstrip(),
        "spec:",
        f"  # The model {'folder' if folder else 'file'}, relative to this manifest.",
        _block({"source": spec["source"]}, 2).rstrip(),
        "  # Read from the model "
        + ("folder (its tokenizer and config.json)" if folder else "file")
        + ". -1 marks a dynamic dimension;",
        "  # its range (min, opt, max) is the model's own where it records one, else a guess"
        + (f" ({', '.join(guessed)})" if guessed else "")
        + ":",
        "  # set it to the sizes you serve.",
        "  # Integer inputs get reference values in [low, high): token ids need high <= vocabulary size;",
        "  # a 2-D attention_mask gets rows of ones right-padded with zeros, as a tokenizer pads a batch.",
        _block({"inputs": spec["inputs"]}, 2).rstrip(),
        "  # One target per hardware class of the fleet and per precision; backend auto compiles every",
        "  # backend that fits the class and keeps the fastest that validates. Add int8, bf16, fp16.",
        _block({"fleet": spec["fleet"]}, 2).rstrip(),
        "  # Batch sizes timed for the figures (and the selection).",
        _block({"benchmark": spec["benchmark"]}, 2).rstrip(),
    ]
    validation = spec.get("validation", {})
    if "dataset" in validation:
        out += [
            "  # Reference inputs (--dataset), relative to this manifest: validation and int8 calibration",
            "  # run on them; the dims they show took their sizes above.",
        ]
    if validation.get("task") == "detection":
        out += [
            "  # task detection: the file's metadata says Ultralytics exported it as a detector. Each",
            "  # artifact's detections are matched to the source's (set tolerances.detectionScore to the",
            "  # score you deploy at); give real images as the dataset: random ones show few.",
        ]
    if validation:
        out.append(_block({"validation": validation}, 2).rstrip())
    return "\n".join(out) + "\n"
