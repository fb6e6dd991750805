"""The source module as every consumer sees it: inputs passed by their spec.inputs names where
forward() takes them by name, outputs one flat tuple of tensors.

Why: a Hugging Face model (AutoModel.from_pretrained) takes input_ids, attention_mask, ... as
keywords among a dozen optional ones; called positionally, the ONNX exporter fills the parameters
between with their defaults and the model's own decorators pass one of them again ("got multiple
values for argument 'use_cache'"), and a spec listing token_type_ids before attention_mask would
feed one as the other. Its output is a ModelOutput (a dict), and a plain dict of heads is common
too: the ONNX exporter and torch.export order a dict's values as written, JAX by sorted key, so
the reference, each artifact and each runtime would disagree on which output is which. One flat
tuple, in torch's own pytree order (as written), leaves nothing to disagree about. A forward
taking one dict of tensors (forward(batch), as training loops hand a batch over) gets the inputs
as that dict, keyed by their spec.inputs names.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch.utils import _pytree as pytree

from kompile.api.spec import InputSpec

CallStyle = Literal["positional", "keywords", "dict"]
"""How the inputs reach forward(): in spec order, by their names, or as one dict of them."""


def _by_name(module: Any, names: Sequence[str]) -> bool:
    """Pass inputs by name when forward() names each of them and a positional call would not be
    exactly its parameter list (more parameters, or another order)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a compiled or scripted forward without a signature
        return False
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not set(names) <= set(named):
        return False
    return [p.name for p in params if p.kind is not p.VAR_KEYWORD] != list(names)


def _required_params(module: Any) -> list[str] | None:
    """forward()'s parameters a call must fill (None when it has no readable signature, or takes
    any number: forward(*tensors), as ProgramCall's)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _takes_one_dict(module: Any, names: Sequence[str]) -> bool:
    """forward(batch): one parameter to fill, named for none of the inputs."""
    required = _required_params(module)
    return required is not None and len(required) == 1 and required[0] not in names


def forward_hint(module: Any, names: Sequence[str]) -> str:
    """How forward() was called, when that may be why it failed: as a dict of the inputs, or with
    another number of them than it takes; "" otherwise (a single input named differently from
    forward's one parameter is passed to it all the same)."""
    style: CallStyle = module.style if isinstance(module, SourceModule) else "positional"
    inner = module.inner if isinstance(module, SourceModule) else module
    required = _required_params(inner)
    if required is None or (style != "dict" and len(required) == len(names)):
        return ""
    how = {"positional": "in that order", "keywords": "by name", "dict": "as one dict keyed by name"}[style]
    return f"forward({', '.join(required)}) was called with spec.inputs {', '.join(names)} {how}; "


def _call(module: Any, style: CallStyle, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> Any:
    if style == "keywords":
        return module(**dict(zip(names, tensors, strict=True)))
    if style == "dict":
        return module(dict(zip(names, tensors, strict=True)))
    return module(*tensors)


class _Failed:
    """A call that raised: what it raised, for choosing how to call the module."""

    def __init__(self, err: Exception) -> None:
        self.err = err


def _tried(module: Any, style: CallStyle, names: Sequence[str], example: Sequence[torch.Tensor]) -> Any:
    """The module's output on the example called in `style`, or _Failed with what it raised."""
    try:
        with torch.inference_mode():
            return _call(module, style, names, example)
    except Exception as err:  # noqa: BLE001 - the reference run reports the model's failure, with its line
        return _Failed(err)


def in_eval_mode(module: Any) -> Any:
    """`module.eval()`, but a torch.export program's module refuses it ("Calling eval() is not
    supported yet"): its graph was captured in the mode it was exported in, none is left to set."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


class ProgramCall(torch.nn.Module):  # type: ignore[misc]
    """A torch.export program's module called as it was exported: its tensors given in order (the
    spec's), passed as the program's arguments and keywords, with the non-tensor values it was
    exported with (a float option) filled in. Called otherwise it refuses ("Ran into a kwarg
    keyword mismatch"): exported with keywords (Hugging Face models are), or with a float."""

    wraps_source = True

    def __init__(self, inner: torch.nn.Module, program: Any, label: str) -> None:
        super().__init__()
        from torch.export.graph_signature import ConstantArgument, InputKind

        self.inner = inner
        self.kompile_label = label
        self.in_spec = program.call_spec.in_spec
        # The user inputs in flatten order: a tensor taken from the caller, or a value kept.
        self.constants: list[tuple[bool, Any]] = [
            (isinstance(s.arg, ConstantArgument), getattr(s.arg, "value", None))
            for s in program.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT
        ]

    def train(self, mode: bool = True) -> ProgramCall:
        self.training = mode  # the program's module refuses train() and eval()
        return self

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        leaves = [value if constant else next(given) for constant, value in self.constants]
        args, kwargs = pytree.tree_unflatten(leaves, self.in_spec)
        return self.inner(*args, **kwargs)


def program_module(program: Any, label: str) -> Any:
    """The module of a loaded .pt2: itself where the program takes its tensors in order and nothing
    else, else a ProgramCall that calls it as it was exported."""
    module = program.module()
    module.kompile_label = label  # sources.module_label: its class is torch's generated GraphModule
    if program.call_spec.in_spec is None:
        return module
    call = ProgramCall(module, program, label)
    args, kwargs = pytree.tree_unflatten([0] * call.in_spec.num_leaves, call.in_spec)
    # Flat: its tensors as positional arguments, no list of them (forward(xs) on [a, b]), no keyword.
    flat = not kwargs and len(args) == call.in_spec.num_leaves
    if flat and not any(constant for constant, _ in call.constants):
        return module
    return call


def _flat(out: Any) -> bool:
    return isinstance(out, torch.Tensor) or (
        type(out) is tuple and all(isinstance(t, torch.Tensor) for t in out)
    )


def leaf_names(out: Any) -> list[str] | None:
    """What a structured output calls each of its tensors, in flatten order: the dict key or
    NamedTuple field, with the positions below it (hidden_states_0). None when it names none (a
    tensor, a plain tuple): the serving names then stay output / output_<i>."""
    paths = [path for path, leaf in pytree.tree_flatten_with_path(out)[0] if isinstance(leaf, torch.Tensor)]
    names: list[str] = []
    named = False
    for i, path in enumerate(paths):
        keyed = [j for j, k in enumerate(path) if isinstance(k, (pytree.MappingKey, pytree.GetAttrKey))]
        named = named or bool(keyed)
        names.append("_".join(_key_text(k) for k in path[keyed[0] :]) if keyed else f"output_{i}")
    return names if named else None


def _key_text(key: Any) -> str:
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.GetAttrKey):
        return str(key.name)
    return str(getattr(key, "idx", key))


class SourceModule(torch.nn.Module):  # type: ignore[misc]
    """The user's module called by input name, its outputs flattened to a tuple of tensors;
    `leaf_names` keeps what the model called them, for the serving names."""

    wraps_source = True  # sources.module_label names the class inside (torch-free code reads it)
    names_outputs = True  # export.names_for_outputs serves the outputs under leaf_names

    def __init__(
        self, inner: torch.nn.Module, names: Sequence[str], style: CallStyle, leaves: list[str] | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self.names = list(names)
        self.style: CallStyle = style
        self.leaf_names = leaves

    def train(self, mode: bool = True) -> SourceModule:
        # The wrapper's flag only: the module inside was put in eval mode where it was loaded, and
        # a .pt2 program's module refuses both train() and eval().
        self.training = mode
        return self

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = _call(self.inner, self.style, self.names, tensors)
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def adapt(module: Any, signature: Sequence[InputSpec], example: Sequence[torch.Tensor]) -> Any:
    """`module` itself when positional inputs and its outputs are already what consumers expect,
    else a SourceModule around it. A module that fails on the example is left as it is: the
    reference run reports that failure with what to change."""
    if isinstance(module, torch.jit.ScriptModule):
        return _scripted(module, signature, example)
    names = [s.name for s in signature]
    style: CallStyle = "keywords" if _by_name(module, names) else "positional"
    out = _tried(module, style, names, example)
    if isinstance(out, _Failed) and style == "positional" and _takes_one_dict(module, names):
        as_dict = _tried(module, "dict", names, example)
        # It ran, or it looked up a key the inputs do not have: a forward(batch) reading batch[...],
        # whose reference run then says which key (not "too many indices" from a tensor).
        if not isinstance(as_dict, _Failed) or isinstance(as_dict.err, KeyError):
            style, out = "dict", as_dict
    failed = isinstance(out, _Failed)
    if style == "positional" and (failed or _flat(out)):
        return module
    return SourceModule(module, names, style, None if failed else leaf_names(out)).eval()


def _scripted(module: Any, signature: Sequence[InputSpec], example: Sequence[torch.Tensor]) -> Any:
    """A TorchScript module whose outputs are not one flat tuple (a dict of heads): the ONNX
    exporter has no conversion for the dict it builds (prim::DictConstruct), and an export wrapper
    cannot trace into it. Traced ahead, a wrapper that flattens it is one graph the exporter takes
    whole (the scripted call is inlined and its dict folded away), served under the dict's keys.
    Inputs stay positional: a scripted forward's parameter names are not read."""
    try:
        with torch.inference_mode():
            out = module(*example)
    except Exception:  # noqa: BLE001 - the reference run reports the model's failure
        return module
    if _flat(out):
        return module
    names = [s.name for s in signature]
    try:
        traced = torch.jit.trace(SourceModule(module, names, "positional"), tuple(example), strict=False)
    except RuntimeError:  # left as it was: the export names the construct it cannot take
        return module
    traced.leaf_names = leaf_names(out)
    traced.names_outputs = True
    return traced
