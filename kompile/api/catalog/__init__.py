"""The backend catalog: what each compiler backend is, in one place.

Each module of this package but `base` describes one backend: its typed options model and `ENTRY`
(a `BackendEntry`); the package finds them by that naming convention. Everything else derives from
here: the API's backend names (CRD enum, pydantic) and option rules, which backends `auto` offers
on a device, which need the ONNX export, which only build for GPUs, serving formats and model file
names, pip extras, and the versions that key the compile cache. The compile side of each backend
(`kompile/compile_jobs/backends/<name>.py`) reads its name, devices and precisions from its entry;
a test holds the two in step, so a backend cannot be half-registered.

Imports nothing heavy: the operator uses it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

from kompile.api.catalog.base import (
    BackendEntry,
    BackendOptions,
    Device,
    OptionsError,
    Serving,
    SourceKind,
)

__all__ = [
    "AUTO",
    "CATALOG",
    "BackendEntry",
    "BackendName",
    "BackendOptions",
    "Device",
    "OptionsError",
    "Serving",
    "SourceKind",
    "TargetBackendName",
    "auto_backends",
    "auto_left_out",
    "auto_summary",
    "check_options",
    "entry",
    "options_for",
]

AUTO = "auto"
_SUPPORT_MODULES = {"base", "cel"}  # the rest of the package: one module per backend


def _discover() -> dict[str, BackendEntry]:
    found: dict[str, BackendEntry] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _SUPPORT_MODULES:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        item = module.ENTRY
        if not isinstance(item, BackendEntry) or item.name != info.name:
            raise TypeError(f"{module.__name__}.ENTRY must be a BackendEntry named {info.name!r}")
        found[item.name] = item
    return found


CATALOG: dict[str, BackendEntry] = _discover()


def entry(name: str) -> BackendEntry:
    """The catalog entry of a backend; ValueError naming the known ones otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; use one of {list(CATALOG)}") from None


def auto_backends(device: str, arch: str | None = None) -> tuple[str, ...]:
    """The backends `auto` offers on a class of this device and architecture (`kubernetes.io/arch`),
    in their tie-breaking order. arch None: an unknown one, so every backend some class of the
    device may be offered (what option checks and cache keys of unpinned targets need)."""
    offered = [e for e in CATALOG.values() if e.auto_offered(device, arch)]
    return tuple(e.name for e in sorted(offered, key=lambda e: (e.auto_rank, e.name)))


def auto_left_out(device: str, arch: str) -> list[tuple[str, str]]:
    """(backend, why) for each backend auto offers on this device elsewhere but not on this arch."""
    return [
        (e.name, e.auto_arches_why or f"auto offers it on {', '.join(e.auto_arches)} classes only")
        for e in CATALOG.values()
        if e.auto_offered(device, None) and not e.auto_offered(device, arch)
    ]


def auto_summary(device: str) -> str:
    """What auto offers on a device in words, for help texts: 'a, b (and c on arm64)'."""
    everywhere = [n for n in auto_backends(device) if not CATALOG[n].auto_arches]
    some = [
        f"{n} on {'/'.join(CATALOG[n].auto_arches)}" for n in auto_backends(device) if CATALOG[n].auto_arches
    ]
    return ", ".join(everywhere) + (f" (and {', '.join(some)})" if some else "")


def _auto_union() -> list[BackendEntry]:
    names = {n for device in ("cpu", "cuda") for n in auto_backends(device)}
    return [CATALOG[n] for n in sorted(names)]


def check_options(backend: str, options: Mapping[str, str] | None) -> None:
    """Refuse options the backend would refuse. For `auto`, each key must be an option of one of
    the backends auto may offer (each candidate then gets the keys its backend knows)."""
    if not options:
        return
    if backend != AUTO:
        entry(backend).parse_options(options)
        return
    device = options.get("device", "").strip().lower()
    if device and device not in ("cpu", "cuda"):
        raise OptionsError(f"option device={options['device']!r}: use one of ['cpu', 'cuda']")
    # An explicit device narrows auto to that device's backends; else any class may be its own.
    offered = [CATALOG[n] for n in auto_backends(device)] if device else _auto_union()
    unknown = sorted(k for k in options if not any(k in e.options.wire_names() for e in offered))
    if unknown:
        accepted = sorted({k for e in offered for k in e.options.wire_names()})
        raise OptionsError(
            f"unknown option(s) {unknown} for backend auto (its candidates {[e.name for e in offered]} "
            f"accept {accepted})"
        )
    for e in offered:
        # Each candidate gets the keys its backend knows, so each must take their values; the
        # device only picks which backends auto offers.
        own = {k: v for k, v in (options_for(e.name, options) or {}).items() if k != "device"}
        try:
            e.parse_options(own)
        except OptionsError as err:
            raise OptionsError(
                f"with backend auto, candidate {e.name} gets these options too: {err} (list candidates "
                "to give each backend its own options)"
            ) from None


def options_for(backend: str, options: Mapping[str, str] | None) -> dict[str, str] | None:
    """The keys of an auto target's options that `backend` knows (all of them for its own)."""
    if options is None:
        return None
    known = set(entry(backend).options.wire_names())
    return {k: v for k, v in options.items() if k in known}


def _known(name: str) -> str:
    entry(name)
    return name


def _known_or_auto(name: str) -> str:
    if name != AUTO and name not in CATALOG:
        raise ValueError(f"unknown backend {name!r}; use {AUTO} or one of {list(CATALOG)}")
    return name


BackendName = Annotated[
    str, AfterValidator(_known), WithJsonSchema({"type": "string", "enum": list(CATALOG)})
]
"""A backend of the catalog."""
TargetBackendName = Annotated[
    str,
    AfterValidator(_known_or_auto),
    WithJsonSchema({"type": "string", "enum": [AUTO, *CATALOG]}),
]
"""A backend of the catalog, or auto: the hardware class's default candidates."""
