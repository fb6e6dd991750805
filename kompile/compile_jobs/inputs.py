"""Reference inputs: read from a dataset file, or generated deterministically from the signature.

A feed is one dict of numpy arrays keyed by input name, ready for a runner. Validation compares
the source model and each artifact feed by feed, so per-sample figures (cosine, top-k) are honest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kompile.api.spec import InputSpec, batch_axis
from kompile.api.spec import batch_dim as batch_dim  # read here beside the feeds it shapes
from kompile.api.spec import static_batch as static_batch

Feed = dict[str, np.ndarray[Any, Any]]

_NUMPY_DTYPES: dict[str, Any] = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.float32,  # numpy has no bfloat16; the exporter casts at the boundary
    "int64": np.int64,
    "int32": np.int32,
    "uint8": np.uint8,
    "bool": np.bool_,
}


class InputMismatch(ValueError):
    """Reference inputs that do not fit the declared signature (or the model)."""


def numpy_dtype(dtype: str) -> Any:
    return _NUMPY_DTYPES[dtype]


PADDING_MASK_NAMES = ("attention_mask", "padding_mask")
"""How a 2-D input that marks a sequence's padding is named (its name ends so)."""


def _is_padding_mask(spec: InputSpec, shape: list[int]) -> bool:
    """A 2-D 0/1 input named as tokenizers and torch name a sequence's padding (attention_mask: 1 a
    token; key_padding_mask: True padding), one row per sequence. Left at the values declared it
    would be all ones, and the gate would never see an artifact that ignores the mask (a trace
    specialised on an all-ones example does). Other masks (torch's attn_mask, whose True means
    "attend" in one API and "do not" in another) keep their declared values."""
    if len(shape) != 2 or not spec.name.lower().endswith(PADDING_MASK_NAMES):
        return False
    if spec.dtype == "bool":
        return True
    if spec.dtype.startswith(("float", "bfloat")):
        # Unbounded floats would be drawn from a standard normal: never a mask a model was made for.
        return spec.low is None and spec.high is None
    integer = np.issubdtype(numpy_dtype(spec.dtype), np.integer)
    return integer and (spec.low is None or spec.low in (0, 1)) and (spec.high is None or spec.high == 2)


def _padded_mask(spec: InputSpec, shape: list[int], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Right-padded rows: each sequence's length drawn from half the width to all of it (never
    empty: a row with nothing to attend to is NaN in most kernels). 1 marks a token, as tokenizers
    write it; a name ending in padding_mask (torch's key_padding_mask) marks the padding instead."""
    rows, width = shape
    lengths = rng.integers(max(1, width // 2), width + 1, size=rows)
    tokens = np.arange(width)[None, :] < lengths[:, None]
    marked = ~tokens if spec.name.lower().endswith("padding_mask") else tokens
    return marked.astype(numpy_dtype(spec.dtype))


def _generate_one(spec: InputSpec, shape: list[int], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    dt = numpy_dtype(spec.dtype)
    if _is_padding_mask(spec, shape):
        return _padded_mask(spec, shape, rng)
    if spec.dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        # Bytes (an image) span their range; other integers (ids, indices) stay small unless told.
        low = int(spec.low) if spec.low is not None else 0
        high = int(spec.high) if spec.high is not None else (256 if dt is np.uint8 else 2)
        return rng.integers(low, high, size=shape, dtype=np.int64).astype(dt)
    if spec.low is not None or spec.high is not None:
        flow = spec.low if spec.low is not None else 0.0
        fhigh = spec.high if spec.high is not None else flow + 1.0
        return rng.uniform(flow, fhigh, size=shape).astype(dt)
    return rng.standard_normal(size=shape).astype(dt)


def _left_padded(feed: Feed, signature: Sequence[InputSpec]) -> set[str]:
    """The dims along which the feed's 2-D padding mask is padded on the left: every row ends in a
    token and some row starts with padding. A token is 1 (True) in an attention_mask, 0 in an
    additive one (-inf or a large negative number marks the padding) and in a key_padding_mask."""
    dims: set[str] = set()
    for spec in signature:
        arr = np.asarray(feed[spec.name])
        if arr.ndim != 2 or arr.shape[1] < 2 or not spec.name.lower().endswith(PADDING_MASK_NAMES):
            continue
        zero_is_token = spec.name.lower().endswith("padding_mask") or bool((arr < 0).any())
        tokens = arr == 0 if zero_is_token else arr != 0
        if tokens[:, -1].all() and not tokens[:, 0].all():
            dims.update(d.name for d in spec.dynamic_dims or [] if d.axis == 1)
    return dims


def resize(feed: Feed, signature: Sequence[InputSpec], sizes: dict[str, int]) -> Feed:
    """The feed at `sizes[name]` along each axis of a dim named in `sizes`: cut to its leading
    entries, or repeated up to the size with each row first as it was. Along a dim its padding mask
    pads on the left, the row's end stays (the last entries, where a short row's tokens are)."""
    tail = _left_padded(feed, signature)
    out: Feed = {}
    for spec in signature:
        arr = np.asarray(feed[spec.name])
        for d in spec.dynamic_dims or []:
            if d.name in sizes:
                n, held = sizes[d.name], arr.shape[d.axis]
                steps = np.arange(n) - n if d.name in tail else np.arange(n)
                arr = arr.take(steps % held, axis=d.axis)
        out[spec.name] = np.asarray(arr, order="C")
    return out


def stacked(feeds: Sequence[Feed], signature: Sequence[InputSpec], batch: int) -> Feed:
    """The feeds stacked along each input's batch axis (axis 1 of an RNN's state) and cycled to
    `batch` rows: a dataset's real samples stay real at any batch. An input without the batch dim
    (a scalar, a fixed table) is the first feed's, as every feed has it."""
    name = batch_dim(signature)
    out: Feed = {}
    for spec in signature:
        axis = batch_axis(spec, name)
        if axis is None:
            out[spec.name] = feeds[0][spec.name]
            continue
        rows = np.concatenate([np.asarray(f[spec.name]) for f in feeds], axis=axis)
        out[spec.name] = np.asarray(np.take(rows, np.arange(batch) % rows.shape[axis], axis=axis), order="C")
    return out


def generate_feeds(
    signature: Sequence[InputSpec], samples: int, seed: int, sizes: dict[str, int] | None = None
) -> list[Feed]:
    """`samples` feeds drawn from a seeded generator; dynamic dims at opt unless `sizes` names them."""
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    for _ in range(samples):
        feeds.append({s.name: _generate_one(s, s.concrete_shape(sizes), rng) for s in signature})
    return feeds


def _check_array(
    spec: InputSpec, arr: np.ndarray[Any, Any], source: str, samples_axis: int | None
) -> np.ndarray[Any, Any]:
    """`arr` as `spec` declares it, its samples on `samples_axis` (any count there)."""
    if arr.ndim != len(spec.shape):
        raise InputMismatch(
            f"{source}: input {spec.name!r} has {arr.ndim} dimensions {list(arr.shape)}, "
            f"the signature declares {len(spec.shape)} {spec.shape}"
        )
    ranges = {d.axis: d for d in spec.dynamic_dims or []}
    for axis, (want, got) in enumerate(zip(spec.shape, arr.shape, strict=True)):
        if want == -1:
            d = ranges[axis]
            if not d.min <= got <= d.max and axis != samples_axis:
                raise InputMismatch(
                    f"{source}: input {spec.name!r} axis {axis} ({d.name}) is {got}, "
                    f"outside its declared range [{d.min}, {d.max}]"
                )
        elif want != got and axis != samples_axis:
            raise InputMismatch(
                f"{source}: input {spec.name!r} has shape {list(arr.shape)}, the signature declares "
                f"{spec.shape} (axis {axis}: {got} != {want}); fix spec.inputs or the dataset"
            )
    try:
        return arr.astype(numpy_dtype(spec.dtype), casting="same_kind")
    except TypeError:
        raise InputMismatch(
            f"{source}: input {spec.name!r} holds {arr.dtype}, the signature declares {spec.dtype}"
        ) from None


def load_dataset(
    path: Path, signature: Sequence[InputSpec], labels_key: str | None = None
) -> tuple[list[Feed], np.ndarray[Any, Any] | None]:
    """Read an .npz keyed by input name. When the batch dimension is dynamic, each input's batch
    axis holds samples (axis 0; axis 1 of an RNN's state [layers, batch, hidden]) and each sample
    becomes a feed of batch 1, an input without the batch dim in every feed as it is; otherwise
    the arrays are one feed as they are. With `labels_key`, also the integer class labels stored
    under it, one per sample."""
    batch = batch_dim(signature)
    axes = {s.name: batch_axis(s, batch) for s in signature}
    found = read_npz(path, [s.name for s in signature])
    try:
        arrays = {s.name: _check_array(s, found[s.name], str(path), axes[s.name]) for s in signature}
    except InputMismatch:
        raise
    except ValueError as err:
        raise InputMismatch(f"{path}: cannot read the dataset as .npz: {err}") from None
    if labels_key is not None and labels_key not in found:
        raise InputMismatch(
            f"{path}: spec.validation.labelsKey is {labels_key!r} and the dataset has no such "
            f"array (it has {sorted(found)})"
        )
    labels = None if labels_key is None else np.asarray(found[labels_key])
    held = {k: (a.shape[axes[k]], axes[k]) for k, a in arrays.items() if axes[k] is not None}
    samples = next(iter(held.values()))[0] if held else next(iter(arrays.values())).shape[0]
    if labels is not None:
        labels = _check_labels(labels, labels_key or "", samples, path)
    if batch is None:
        return [arrays], labels
    if len({n for n, _ in held.values()}) != 1:
        counts = ", ".join(f"{k}: {n} (axis {axis})" for k, (n, axis) in held.items())
        raise InputMismatch(f"{path}: inputs disagree on the number of samples: {counts}")
    if samples == 0:
        raise InputMismatch(
            f"{path}: the dataset holds no samples (the batch axis of every input is 0): give at least "
            "one, or leave spec.validation.dataset out to validate on generated inputs"
        )
    return [_sample(arrays, axes, i) for i in range(samples)], labels


def read_npz(path: Path, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    """Every array of a dataset .npz; InputMismatch where it cannot be read or lacks an input of
    `names` (the keys are input names)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [n for n in names if n not in data.files]
            if missing:
                raise InputMismatch(
                    f"{path}: dataset has arrays {sorted(data.files)}, missing inputs {missing} "
                    "(keys must be the input names of spec.inputs)"
                )
            return {k: data[k] for k in data.files}
    except InputMismatch:
        raise
    except (OSError, ValueError) as err:
        raise InputMismatch(f"{path}: cannot read the dataset as .npz: {err}") from None


def _sample(arrays: dict[str, np.ndarray[Any, Any]], axes: dict[str, int | None], i: int) -> Feed:
    """Sample `i` of a dataset: a slice of one along each input's batch axis."""
    return {k: v if axes[k] is None else np.take(v, [i], axis=axes[k]) for k, v in arrays.items()}


def _check_labels(labels: np.ndarray[Any, Any], key: str, samples: int, path: Path) -> np.ndarray[Any, Any]:
    """Class labels as int64: 1-D, integer, one per sample (axis 0)."""
    if not np.issubdtype(labels.dtype, np.integer) or labels.ndim != 1:
        raise InputMismatch(
            f"{path}: labels {key!r} must be a 1-D integer array (one class index per sample), "
            f"found {labels.dtype} of shape {list(labels.shape)}"
        )
    if labels.shape[0] != samples:
        raise InputMismatch(
            f"{path}: {labels.shape[0]} labels under {key!r} for {samples} samples; give one per sample"
        )
    return labels.astype(np.int64)
