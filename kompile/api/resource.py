"""The CompiledModel resource as a whole, and loading it from YAML with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError

from kompile.api.base import ApiModel
from kompile.api.spec import CompiledModelSpec
from kompile.api.status import CompiledModelStatus
from kompile.api.vocabulary import DNS_LABEL_PATTERN

GROUP = "kompile.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CompiledModel"
PLURAL = "compiledmodels"
SINGULAR = "compiledmodel"
SHORT_NAMES = ["cmodel"]


class ObjectMeta(ApiModel):
    """The parts of Kubernetes ObjectMeta the pipeline reads; the rest is kept as it is."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: str = Field(
        description="Name of the CompiledModel: a DNS label (lower-case letters, digits and '-').",
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
    )
    namespace: str | None = Field(default=None, description="Namespace.")
    uid: str | None = Field(default=None, description="UID assigned by the API server.")
    generation: int | None = Field(default=None, description="Generation of the spec.")


class CompiledModel(ApiModel):
    """A CompiledModel document."""

    api_version: Literal["kompile.dev/v1alpha1"] = Field(description="kompile.dev/v1alpha1")
    kind: Literal["CompiledModel"] = Field(description="CompiledModel")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: CompiledModelSpec = Field(description="Desired state.")
    status: CompiledModelStatus | None = Field(default=None, description="Observed state.")


class ManifestError(ValueError):
    """A manifest a user must fix; the message says which field and what to change."""


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _quote_hint(loc: tuple[int | str, ...], value: bool | int | float) -> str:
    # YAML reads 0, 2.5, on/off, yes/no and true/false unquoted as numbers and booleans; the options
    # and label maps (like the CRD's) hold strings, and a bare "should be a valid string" hides why.
    what = "option values are strings" if "options" in loc else "a string is expected here"
    key = loc[-1] if loc and isinstance(loc[-1], str) else "value"
    if isinstance(value, bool):
        spelled = '"on" or "true"' if value else '"off" or "false"'
        return (
            f"{what}, and YAML reads an unquoted on/off, yes/no or true/false as a boolean: "
            f"quote the value as docs/reference.md spells it ({key}: {spelled})"
        )
    return f'{what}, and YAML reads an unquoted {value} as a number: quote it ({key}: "{value}")'


def _mapping_hint(loc: tuple[int | str, ...], value: Any) -> str:
    if value is None:  # `validation:` with nothing under it
        return "empty (the key has no value): give it its fields, or delete the key"
    got = f"the string {value!r}" if isinstance(value, str) else f"a {type(value).__name__}"
    msg = f"expected a mapping, not {got}"
    if isinstance(value, str) and "candidates" in loc:  # a backend named where its object goes
        msg += f": write {{backend: {value}}}"
    return msg + " (docs/reference.md lists its fields)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, list, dict and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _description_at(loc: tuple[int | str, ...]) -> str | None:
    """The description of the field at loc (a validation error's location), for a hint that says
    what the field holds where pydantic only prints the pattern it failed."""
    models: list[type[BaseModel]] = [CompiledModel]
    description = None
    for part in loc:
        if isinstance(part, int):
            continue
        found = [f for m in models for name, f in m.model_fields.items() if part in (name, f.alias)]
        if not found:  # a dict's key: the same models hold its value
            continue
        description, models = found[0].description, _models_in(found[0].annotation)
    return description


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid CompiledModel manifest:"]
    for e in err.errors():
        # pydantic appends the validator's class name for model validators; drop Python-only noise.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling; `kubectl explain compiledmodel.spec` lists fields)"
        elif e["type"] == "string_type" and isinstance(e.get("input"), bool | int | float):
            msg = _quote_hint(loc, e["input"])
        elif e["type"] in ("model_type", "dict_type"):
            msg = _mapping_hint(loc, e.get("input"))
        elif e["type"] == "string_pattern_mismatch":
            about = _description_at(loc)
            pattern = (e.get("ctx") or {}).get("pattern")
            said = f": {about}" if about else ""
            msg = f"{e.get('input')!r} is not allowed here{said} (pattern {pattern})"
        lines.append(f"  - {_field_path(loc) or '(document)'}: {msg}")
    return "\n".join(lines)


def parse_manifest(doc: Any, source: str = "manifest") -> CompiledModel:
    """Validate one parsed YAML document as a CompiledModel."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{source}: expected a YAML mapping with apiVersion, kind, metadata and spec")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise ManifestError(
            f"{source}: expected apiVersion: {API_VERSION} and kind: {KIND}, "
            f"got apiVersion: {doc.get('apiVersion')!r}, kind: {doc.get('kind')!r}"
        )
    try:
        return CompiledModel.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, source)) from None


# .pt and .pth hold TorchScript or a torch.save pickle alike; loading one tells which.
_TORCH_FILES = {".pt": "PyTorch (TorchScript or torch.save)", ".pth": "PyTorch (TorchScript or torch.save)"}
_TORCH_FILES[".ts"] = "TorchScript"


def _binary_hint(p: Path) -> str:
    if p.suffix.lower() == ".safetensors" or (p.name.startswith("pytorch_model") and p.suffix == ".bin"):
        return (
            f"{p}: not a YAML manifest but model weights, without the model's code: pass the folder "
            "that holds them with config.json (a Hugging Face model folder: kompile run "
            f"{p.parent.name or '.'}), or write a manifest whose spec.source.uri is that folder or "
            "python://your_module:factory, a function that builds the model and loads them"
        )
    kind = _TORCH_FILES.get(p.suffix.lower())
    if kind is None:
        return f"{p}: not a YAML manifest (binary content); pass a CompiledModel manifest or a model file"
    return (
        f"{p}: not a YAML manifest but a {kind} model file, whose input shapes kompile cannot read: write "
        f"a manifest with spec.source.uri: {p.name} and its spec.inputs (examples/small-cnn.yaml is "
        "one), or pass an .onnx or .pt2 file (torch.export.save), whose inputs kompile reads itself"
    )


# What the API server writes into an object's metadata: a file from `kubectl get -o yaml` has them.
_SERVER_METADATA = {
    "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "managedFields", "selfLink",
}  # fmt: skip


def _as_input(doc: dict[str, Any]) -> dict[str, Any]:
    """A CompiledModel document as a new object: the operator's status (in what `kubectl get -o
    yaml` writes, maybe from another operator version) is not input, nor the server's metadata.
    The cluster object's uid and generation are not a local run's: MLflow records an operator's
    generation once, by them, so a second `kompile run` of such a file registered nothing."""
    meta = doc.get("metadata")
    if isinstance(meta, dict):
        doc = {**doc, "metadata": {k: v for k, v in meta.items() if k not in _SERVER_METADATA}}
    return {k: v for k, v in doc.items() if k != "status"}


def _placed(placed: list[tuple[int, Any]]) -> list[tuple[str, Any]]:
    """Each document with where it is; the items of a `kind: List` (what `kubectl get -o yaml`
    writes for several objects) as documents of their own."""
    out: list[tuple[str, Any]] = []
    for n, d in placed:
        if isinstance(d, dict) and d.get("kind") == "List" and isinstance(d.get("items"), list):
            out += [(f"document {n}, item {i}", item) for i, item in enumerate(d["items"], 1)]
        else:
            out.append((f"document {n}", d))
    return out


def _model_documents(p: Path, text: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The CompiledModel documents of a YAML file (or of `text`), unparsed, in file order, each
    with its place among the file's documents (from 1)."""
    if text is None:
        text = _manifest_text(p)
    try:
        placed = _placed([(n, d) for n, d in enumerate(yaml.safe_load_all(text), 1) if d is not None])
    except yaml.YAMLError as err:
        raise ManifestError(f"{p}: not valid YAML: {err}") from None
    docs = [d for _, d in placed]
    models = [(n, _as_input(d)) for n, d in placed if isinstance(d, dict) and d.get("kind") == KIND]
    if not models and len(docs) == 1:
        parse_manifest(docs[0], str(p))  # raises, saying which of apiVersion and kind is wrong
    if not models:
        raise ManifestError(f"{p}: no CompiledModel document (kind: {KIND}) among its {len(docs)} documents")
    return models


def _manifest_text(p: Path) -> str:
    if p.is_dir() and (p / "config.json").is_file():
        raise ManifestError(
            f"{p}: a Hugging Face model folder, not a manifest: `kompile run {p}` compiles it, "
            f"`kompile init {p}` writes its manifest"
        )
    if p.is_dir():
        raise ManifestError(
            f"{p}: a folder without config.json: pass a CompiledModel manifest, a model file (.onnx, "
            ".pt2) or a Hugging Face model folder (config.json beside its weights)"
        )
    if not p.is_file():
        raise ManifestError(f"{p}: no such manifest file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ManifestError(_binary_hint(p)) from None


def _name_of(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def load_manifest(path: str | Path, name: str | None = None) -> CompiledModel:
    """Read the CompiledModel document of a YAML file: the only one, or the one called `name` in
    a file holding several (as `kubectl apply -f` takes them)."""
    p = Path(path)
    models = _model_documents(p)
    names = [_name_of(d) for _, d in models]
    if name is not None:
        if name not in names:
            raise ManifestError(f"{p}: no CompiledModel named {name!r} in it (it holds: {', '.join(names)})")
        return parse_manifest(models[names.index(name)][1], _where(p, models, names.index(name)))
    if len(models) > 1:
        raise ManifestError(
            f"{p}: holds {len(models)} CompiledModels ({', '.join(names)}): pick one with --name "
            f"{names[0] or 'NAME'}, or put each in its own file"
        )
    return parse_manifest(models[0][1], str(p))


def _where(p: Path, models: list[tuple[str, dict[str, Any]]], i: int) -> str:
    """How an error names document i: the file alone when it holds one model."""
    place, doc = models[i]
    return str(p) if len(models) == 1 else f"{p}, CompiledModel {_name_of(doc)!r} ({place})"


KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")


@dataclass
class ManifestFiles:
    """What `kompile check` reads among the paths it was given."""

    files: list[Path]
    empty: list[str]
    """A message for each folder that holds no CompiledModel."""
    patches: list[Path]
    """Kustomize patches left out: partial CompiledModels by design, checked once rendered."""


def manifest_files(paths: list[Path]) -> ManifestFiles:
    """The files to check among `paths`: a file as given ("-": stdin); for a folder (a GitOps
    repository), its YAML files that mention a CompiledModel, hidden folders (.git), kustomizations
    and the patches they name left out."""
    out = ManifestFiles([], [], [])
    for path in paths:
        if str(path) == "-" or not path.is_dir() or (path / "config.json").is_file():
            out.files.append(path)  # load_manifests says what it is when it is no manifest
            continue
        yamls = [
            f
            for f in sorted(path.rglob("*"))
            if (f.suffix in (".yaml", ".yml") or f.name in KUSTOMIZATIONS)
            and f.is_file()
            and not any(part.startswith(".") for part in f.relative_to(path).parts)
        ]
        patches = {p for f in yamls if f.name in KUSTOMIZATIONS for p in _kustomize_patches(f)}
        found = [f for f in yamls if f.name not in KUSTOMIZATIONS and _mentions_kind(f)]
        left_out = [f for f in found if f.resolve() in patches]
        found = [f for f in found if f not in left_out]
        out.patches += left_out
        if not found and not left_out:
            out.empty.append(f"{path}: no YAML file under it holds a CompiledModel (kind: {KIND})")
        out.files += found
    return out


def _kustomize_patches(kustomization: Path) -> set[Path]:
    """The files a kustomization names as patches (patchesStrategicMerge, patches and
    patchesJson6902 entries with a path), resolved; an unreadable one names none."""
    try:
        doc = yaml.safe_load(kustomization.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return set()
    if not isinstance(doc, dict):
        return set()
    named: list[Any] = list(doc.get("patchesStrategicMerge") or [])
    for key in ("patches", "patchesJson6902"):
        named += [e.get("path") for e in doc.get(key) or [] if isinstance(e, dict)]
    folder = kustomization.parent
    # An inline patch (a YAML string of several lines) names no file.
    return {(folder / n).resolve() for n in named if isinstance(n, str) and n and "\n" not in n}


def _mentions_kind(path: Path) -> bool:
    """Whether a file's text names the kind: others (a kustomization, a Helm template that is not
    YAML until rendered) are not read as manifests."""
    try:
        return KIND in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def load_manifests(path: str | Path, text: str | None = None) -> list[CompiledModel]:
    """Every CompiledModel document of a YAML file (or of `text`, read elsewhere: stdin, `path`
    then naming it), each parsed and validated; the errors of every invalid one together, each
    naming its model, so one look fixes a whole GitOps file."""
    p = Path(path)
    models = _model_documents(p, text)
    parsed, errors = [], []
    for i, (_, doc) in enumerate(models):
        try:
            parsed.append(parse_manifest(doc, _where(p, models, i)))
        except ManifestError as err:
            errors.append(str(err))
    if errors:
        raise ManifestError("\n".join(errors))
    return parsed
