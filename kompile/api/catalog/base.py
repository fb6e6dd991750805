"""What a catalog entry says about a compiler backend, and the typed options every backend shares.

Options travel as a map of strings (`targets[].options`, what `kubectl` and YAML carry); each
backend's options model parses that map into typed fields, so a typo or a bad value is refused by
`kompile check`, the operator and (through CEL rules made from the same models) the API server,
long before a compile Job would have refused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

Device = Literal["cpu", "cuda"]
SourceKind = Literal["onnx", "torch"]
"""What a backend compiles: the ONNX export of the source, or the eager torch module itself."""


def _flag(value: Any) -> Any:
    # Only true/false: pydantic's lax bool would also take yes/on/1, which the CRD's rule refuses.
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError("use true or false")
    return value


def _count(value: Any) -> Any:
    if isinstance(value, str) and not value.isdigit():
        raise ValueError("use a non-negative integer")
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]
"""A boolean option: "true" or "false" on the wire."""
Count = Annotated[int, BeforeValidator(_count), Field(ge=0)]
"""A non-negative integer option, digits on the wire."""


class OptionsError(ValueError):
    """Options a backend does not accept; the message names each bad key and what is accepted."""


class BackendOptions(BaseModel):
    """Options every backend accepts. Subclasses add their own fields; values arrive as strings."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # The wire carries strings ("true", "4096"): lax parsing turns them into typed values.
        strict=False,
    )
    case_sensitive: ClassVar[frozenset[str]] = frozenset()
    """Wire names of free-text options whose case matters (paths, op type names)."""

    device: Device | None = Field(
        default=None,
        description="cpu or cuda: the device the artifact is built for; default: the hardware class's.",
    )

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, data: Any) -> Any:
        # Enumerated values are case-insensitive and trimmed, as they always were.
        if not isinstance(data, Mapping):
            return data
        return {
            k: (v.strip() if k in cls.case_sensitive else v.strip().lower()) if isinstance(v, str) else v
            for k, v in data.items()
        }

    def record(self) -> dict[str, str]:
        """The options as the wire spells them (camelCase keys, string values), defaults included."""
        out: dict[str, str] = {}
        for name, value in self.model_dump(by_alias=True).items():
            if value is None:
                continue
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    def search_minutes(self) -> float:
        """Minutes these options let the compile spend searching (tuning) beyond building it, which
        a compile Job's deadline must hold; 0 for a backend that does not search."""
        return 0.0

    @classmethod
    def wire_names(cls) -> list[str]:
        return [f.alias or n for n, f in cls.model_fields.items()]

    @classmethod
    def choices(cls, wire_name: str) -> list[str] | None:
        """The values an enumerated option takes (None for others)."""
        field = next(f for n, f in cls.model_fields.items() if (f.alias or n) == wire_name)
        ann = field.annotation
        if get_origin(ann) is not Literal:  # Optional[Literal[...]]: look inside
            ann = next((a for a in get_args(ann) if get_origin(a) is Literal), ann)
        return [str(v) for v in get_args(ann)] if get_origin(ann) is Literal else None


@dataclass(frozen=True)
class Serving:
    """How Triton (through KServe's kserve-tritonserver runtime) serves a backend's artifact."""

    kserve_format: str
    """KServe `modelFormat.name` of the InferenceService."""
    triton_platform: str | None
    """`platform` of the model's config.pbtxt; None for a backend named by `triton_backend` alone."""
    files: tuple[str, ...]
    """File names inside the Triton version folder (`<model>/1/`), the model file first."""
    triton_backend: str | None = None
    """`backend` line of config.pbtxt where Triton needs one beside the platform."""


@dataclass(frozen=True)
class BackendEntry:
    """One compiler backend, as the rest of kompile sees it. The compile Job's class for it lives in
    `kompile/compile_jobs/backends/<name>.py` and takes its name, devices and precisions from here."""

    name: str
    summary: str
    """One line for the reference docs."""
    devices: tuple[Device, ...]
    """Devices it builds for; the first is its own when neither the class nor options say."""
    precisions: frozenset[str]
    consumes: SourceKind
    options: type[BackendOptions]
    extra: str
    """pip extra that installs what it needs: pip install 'kompile[<extra>]' (for a backend with its
    own `environment`, what the pipeline's side needs to hand it the model)."""
    version_from: tuple[str, ...]
    """Python distributions whose versions shape its artifacts (the compiler first): they key the
    compile cache, so an upgrade compiles afresh."""
    serving: Serving | None
    """None: kompile cannot roll this backend's artifacts out."""
    auto_on: tuple[Device, ...] = ()
    """Devices whose `backend: auto` targets offer it as a candidate."""
    auto_rank: int = 100
    """Order among a device's auto candidates (lower first); only breaks ties in the selection."""
    auto_arches: tuple[str, ...] = ()
    """Architectures (`kubernetes.io/arch` values) of the classes whose auto offers it; empty: all."""
    auto_arches_why: str | None = None
    """Why auto leaves it out on other architectures: the target's `notOffered` says so there."""
    stand_in: bool = False
    """A stand-in for tests and dry runs, never offered by auto and never served."""
    for_devices: bool = False
    """Its artifacts run on devices that fetch them from the store (phones, boards, Macs), not on
    KServe: the operator never rolls them out."""
    environment: str | None = None
    """Its own environment, for a backend whose dependencies conflict with the project's (another
    torch pin): built from requirements/env-<environment>.txt by scripts/setup-backend-env.sh, run
    by the pipeline as a subprocess (kompile.compile_jobs.environments), and in the cluster the
    image KOMPILE_ENV_IMAGES names for it. Its `version_from` distributions are read there."""
    exported_note: str | None = None
    """Set for an export-only backend (no runtime for its artifacts on the classes kompile compiles
    on): each artifact is recorded with phase Exported and this message, unvalidated, and is never
    selected or served."""

    @property
    def validates(self) -> bool:
        return self.exported_note is None

    def auto_offered(self, device: str, arch: str | None) -> bool:
        """Whether auto offers it on a class of this device and architecture (None: any arch)."""
        arch_ok = arch is None or not self.auto_arches or arch in self.auto_arches
        return device in self.auto_on and not self.stand_in and arch_ok

    @property
    def gpu_only(self) -> bool:
        return self.devices == ("cuda",)

    def version_string(self, versions: Mapping[str, str]) -> str:
        """Its version for the cache key and lineage: the compiler's, then `+dist=version` for each
        other distribution that shapes the artifact; `unknown` where a version is not known."""
        first, *rest = self.version_from
        return versions.get(first, "unknown") + "".join(f"+{d}={versions.get(d, 'unknown')}" for d in rest)

    def parse_options(self, raw: Mapping[str, str] | None) -> BackendOptions:
        """The target's options map parsed into this backend's typed options.

        Raises OptionsError naming each unknown key or bad value and what is accepted.
        """
        try:
            opts = self.options.model_validate(dict(raw or {}))
        except ValidationError as err:
            raise OptionsError(self._explain(err, raw or {})) from None
        if opts.device is not None and opts.device not in self.devices:
            raise OptionsError(f"option device={opts.device!r}: {self.name} builds for {list(self.devices)}")
        return opts

    def _explain(self, err: ValidationError, raw: Mapping[str, str]) -> str:
        problems: list[str] = []
        unknown = sorted(str(e["loc"][0]) for e in err.errors() if e["type"] == "extra_forbidden")
        if unknown:
            problems.append(
                f"unknown {self.name} option(s) {unknown}; accepted: {sorted(self.options.wire_names())}"
            )
        for e in err.errors():
            if e["type"] == "extra_forbidden":
                continue
            key = str(e["loc"][0]) if e["loc"] else ""
            choices = self.options.choices(key) if key else None
            hint = f"use one of {choices}" if choices else str(e["msg"]).removeprefix("Value error, ")
            problems.append(f"option {key}={raw.get(key)!r}: {hint}" if key else hint)
        return "; ".join(problems)
