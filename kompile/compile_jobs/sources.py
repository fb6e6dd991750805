"""Fetch and load the trained model a manifest points at, and record its sha256 digest.

Supported: a local path or file://, s3:// (boto3; endpoint from the manifest or AWS_ENDPOINT_URL),
MLflow models (models:/name/version, runs:/id/path), and python://module:factory. Formats: .pt2
(torch.export archive), .pt/.pth (TorchScript), .onnx, an MLflow model folder, a Hugging Face model
folder (local), a Python factory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import posixpath
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kompile.api.spec import Source
from kompile.artifact_store import local_path
from kompile.compile_jobs import huggingface, source_files
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.source_files import SourceError as SourceError  # re-exported
from kompile.compile_jobs.user_code import first_line, where
from kompile.registry import hide_userinfo

LOAD_LOG = "load.log"
"""Beside the fetched sources: what torch printed while loading one."""

_SUFFIX_FORMATS = {
    ".pt2": "pt2",
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".ts": "torchscript",
    ".onnx": "onnx",
}


@dataclass
class LoadedSource:
    """A source model ready for export and for computing reference outputs."""

    uri: str
    format: str
    digest: str
    module: Any = None
    """The eager torch module (None when the source is ONNX: its reference is ONNX Runtime unoptimized)."""
    onnx_path: Path | None = None
    lineage: dict[str, str] = field(default_factory=dict)
    """Where the source came from beyond its URI (for example the MLflow model version)."""
    exported: Any = None
    """The torch.export ExportedProgram of a .pt2 source: exported to ONNX as it is, not re-traced."""
    quantized: str = ""
    """An ONNX source that is quantized already: its quantized operators ("6 QuantizeLinear, ...")."""

    @property
    def kind(self) -> str:
        """What the backends start from: "onnx", "torchscript" (which torch.export cannot take),
        or "torch" (a module torch.export traces)."""
        if self.module is None:
            return "onnx"
        import torch

        return "torchscript" if isinstance(self.module, torch.jit.ScriptModule) else "torch"

    @property
    def label(self) -> str:
        if self.module is None or self.format in ("pt2", "torchscript", "mlflow"):
            return self.uri if self.format == "mlflow" else Path(self.uri).name
        return module_label(self.module)


def module_label(module: Any) -> str:
    """The user's class name for messages, through source_module's wrappers; a .pt2's file name
    (its module's class is one torch generates)."""
    while True:
        label = getattr(module, "kompile_label", None)
        if isinstance(label, str):
            return label
        if not getattr(module, "wraps_source", False):
            return type(module).__qualname__
        module = module.inner


def detect_format(uri: str) -> str:
    if uri.startswith("python://"):
        return "python"
    if uri.startswith(("models:/", "runs:/")):
        return "mlflow"
    suffix = Path(urlparse(uri).path).suffix.lower()
    if suffix in _SUFFIX_FORMATS:
        return _SUFFIX_FORMATS[suffix]
    raise SourceError(
        f"spec.source.uri {uri!r}: cannot tell the format from the file name; name a .pt2, .pt, "
        ".onnx file or a model folder (on S3 ending in /), or set spec.source.format (pt2, "
        "torchscript, onnx, mlflow, python, huggingface)"
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def sha256_files(paths: Sequence[Path]) -> str:
    """An artifact's digest: one file's own sha256, or for several (OpenVINO's .xml and .bin) the
    sha256 over each one's name and digest, in order."""
    if len(paths) == 1:
        return sha256_file(paths[0])
    h = hashlib.sha256()
    for path in paths:
        h.update(f"{path.name}\0{sha256_file(path)}\n".encode())
    return "sha256:" + h.hexdigest()


def sha256_tree(root: Path) -> str:
    """Digest of a folder: names and contents of every file, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode())
        h.update(sha256_file(p).encode())
    return "sha256:" + h.hexdigest()


def fetch(uri: str, cache_dir: Path, base_dir: Path, s3_endpoint: str | None = None) -> Path:
    """A local path for a file source, downloading s3:// objects into cache_dir."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return _fetch_s3(parsed.netloc, parsed.path.lstrip("/"), cache_dir, s3_endpoint)
    path = _local_path(uri, base_dir) or base_dir / uri
    if not path.is_file():
        raise SourceError(f"spec.source.uri: {path} does not exist (paths are relative to the manifest)")
    return path


def _told(message: str, code: str | None) -> str:
    """A store error's message with what to check when the store refused this caller's keys."""
    from kompile.artifact_store import own_keys_hint

    hint = own_keys_hint(code)
    return f"{message}: {hint}" if hint else message


def _fetch_s3(bucket: str, key: str, cache_dir: Path, endpoint: str | None) -> Path:
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    from kompile.artifact_store import s3_client

    dest = cache_dir / "s3" / bucket / key
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        s3_client(endpoint).download_file(bucket, key, str(dest))
    except (BotoCoreError, ClientError, Boto3Error) as err:
        code = (
            err.response.get("Error", {}).get("Code") if isinstance(err, ClientError) else type(err).__name__
        )
        raise SourceError(
            _told(f"spec.source.uri s3://{bucket}/{key}: download failed: {code}", code)
        ) from None
    return dest


def _fetch_external_data(uri: str, names: Sequence[str], cache_dir: Path, endpoint: str | None) -> None:
    """An s3:// ONNX model's external data files (`names`, each inside its folder), fetched from
    beside its key to beside its copy (a local model's are checked where they are)."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3":
        return
    folder = posixpath.dirname(parsed.path.lstrip("/"))
    for name in names:
        key = posixpath.join(folder, name)
        try:
            _fetch_s3(parsed.netloc, key, cache_dir, endpoint)
        except SourceError as err:
            raise SourceError(
                f"spec.source.uri {uri}: its weights are in the external data file {name}, expected at "
                f"s3://{parsed.netloc}/{key} beside it: {err}; upload it there"
            ) from None


def _import_fresh(module_name: str, base_dir: Path) -> Any:
    """A user's factories live next to their manifest, as the examples' do. Code in that folder is
    imported from it afresh: a module an earlier run in this process imported (another folder's,
    or this file before an edit) must not stand in for it. Installed packages import as usual."""
    top = module_name.partition(".")[0]
    if (base_dir / top).is_dir() or (base_dir / f"{top}.py").is_file():
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]
        with contextlib.suppress(ValueError):
            sys.path.remove(str(base_dir))
        importlib.invalidate_caches()
    if str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    # No __pycache__ written into the user's folder (a cached .pyc of the same size and second
    # would also hide an edit).
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return importlib.import_module(module_name)
    finally:
        sys.dont_write_bytecode = writes


def _raised(err: BaseException) -> str:
    """'raised KeyError: ... (at nets.py:12)': the error's first lines and the line in the user's
    code where it came from, where they would look first."""
    # A few lines: load_state_dict's first line only says that it failed, the next ones what.
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = " ".join(lines[:3])
    text = text if len(text) <= 400 else text[:400] + "..."
    at = where(err)
    return f"raised {type(err).__name__}: {text}" + (f" (at {at})" if at else "")


def _load_python(uri: str, base_dir: Path) -> tuple[Any, str]:
    target = uri.removeprefix("python://")
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SourceError(f"spec.source.uri {uri!r}: expected python://package.module:factory")
    try:
        module = _import_fresh(module_name, base_dir)
    except ImportError as err:
        raise SourceError(f"spec.source.uri {uri!r}: cannot import {module_name!r}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module failed as it ran: theirs to fix
        raise SourceError(f"spec.source.uri {uri!r}: cannot import {module_name!r}: {_raised(err)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SourceError(f"spec.source.uri {uri!r}: {module_name} has no callable {attr!r}")
    try:
        model = factory()
    except Exception as err:  # noqa: BLE001 - the user's factory failed (a weights file, a state_dict)
        hint = ""
        if isinstance(err, FileNotFoundError):
            hint = (
                f"; relative paths in it resolve from the current directory ({Path.cwd()}), not from "
                "the manifest's folder: build them from Path(__file__).parent"
            )
        raise SourceError(f"spec.source.uri {uri!r}: {attr}() {_raised(err)}{hint}") from None
    import torch

    if not isinstance(model, torch.nn.Module):
        raise SourceError(
            f"spec.source.uri {uri!r}: {attr}() returned {type(model).__name__}, not an nn.Module"
        )
    h = hashlib.sha256()
    if module.__file__:
        h.update(Path(module.__file__).read_bytes())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return model.eval(), "sha256:" + h.hexdigest()


def _load_torch_file(path: Path, fmt: str, log: Path) -> tuple[Any, Any]:
    """(eager module, ExportedProgram or None), after checking the file holds what `fmt` says.
    What torch's C++ prints meanwhile (a torch.ao quantized model's deprecation lines, straight to
    the process's stderr) goes to `log`, not amid the progress."""
    import torch

    source_files.check(path, fmt)
    if fmt == "pt2":
        source_files.check_pt2_schema(path)
    logged: list[str] = []
    try:
        with source_files.quiet_torch_loading() as logged, output_to(log):
            if fmt == "pt2":
                from kompile.compile_jobs.source_module import program_module

                program = torch.export.load(str(path))
                return program_module(program, path.name), program
            return torch.jit.load(str(path), map_location="cpu").eval(), None
    except (RuntimeError, ValueError, OSError, KeyError, AttributeError) as err:
        raise SourceError(
            source_files.pt2_load_failure(path, err, logged)
            or f"{path}: expected {source_files.EXPECTED[fmt]}, but it cannot be loaded (corrupt, or "
            f"written by an incompatible torch?): {first_line(err)}"
        ) from None


@contextlib.contextmanager
def _mlflow_uris(tracking_uri: str | None) -> Iterator[None]:
    """MLflow's tracking and registry URIs (and its progress bar) for one call.
    mlflow.set_tracking_uri would set them for the whole process and, through the environment, for
    every child process; a models:/ name resolves through the registry URI, which
    download_artifacts' own argument does not reach."""
    bar = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", bar)
    before = {n: os.environ.get(n) for n in names}
    if tracking_uri:
        os.environ.update(dict.fromkeys(names[:2], tracking_uri))
    if not sys.stderr.isatty():  # its download bar is for a terminal: in a log its redraws are noise
        os.environ[bar] = "false"
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _load_mlflow(uri: str, cache_dir: Path, tracking_uri: str | None) -> LoadedSource:
    import mlflow
    from mlflow.exceptions import MlflowException

    # A fresh folder per model: downloads into a shared one merged, and a second model's run then
    # found the first one's files (its model.onnx, its config.json) and compiled those.
    dest = cache_dir / "mlflow" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        with _mlflow_uris(tracking_uri):
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest)))
    except MlflowException as err:
        raise SourceError(
            f"spec.source.uri {uri!r}: cannot fetch the MLflow model: {hide_userinfo(err.message)}"
        ) from None
    digest = sha256_tree(local)
    lineage = {"mlflow.source.uri": uri}
    onnx_files = sorted(local.rglob("*.onnx"))
    if onnx_files:
        _, quantized = source_files.read_onnx_source(onnx_files[0])
        return LoadedSource(
            uri, "mlflow", digest, onnx_path=onnx_files[0], lineage=lineage, quantized=quantized
        )
    # MLflow 3 logs PyTorch models as torch.export archives by default; older ones are pickles.
    pt2_files = sorted(local.rglob("*.pt2"))
    if pt2_files:
        module, program = _load_torch_file(pt2_files[0], "pt2", cache_dir / LOAD_LOG)
        return LoadedSource(uri, "mlflow", digest, module=module, exported=program, lineage=lineage)
    # mlflow.transformers logs the Hugging Face folder itself (under model/): loaded as one.
    folders = sorted(
        p.parent for p in local.rglob(huggingface.CONFIG) if huggingface.is_model_folder(p.parent)
    )
    if folders:
        module = huggingface.load(folders[0])
        return LoadedSource(uri, "mlflow", digest, module=module, lineage=lineage)
    flavors = _mlflow_flavors(local)
    if "pytorch" not in flavors:
        raise SourceError(
            f"spec.source.uri {uri!r}: an MLflow model with flavors {flavors or 'none'}; kompile compiles "
            "the pytorch, transformers and onnx flavors (or a model logged as a .pt2): log the model "
            "with one of them"
        )
    module = mlflow.pytorch.load_model(str(local), map_location="cpu")
    return LoadedSource(uri, "mlflow", digest, module=module.eval(), lineage=lineage)


def _mlflow_flavors(local: Path) -> list[str]:
    """The flavors the MLmodel file of a downloaded MLflow model names."""
    import yaml

    try:
        doc = yaml.safe_load((local / "MLmodel").read_text())
    except (OSError, yaml.YAMLError):
        return []
    flavors = doc.get("flavors") if isinstance(doc, dict) else None
    return sorted(flavors) if isinstance(flavors, dict) else []


def load_source(
    source: Source,
    base_dir: Path,
    cache_dir: Path,
    s3_endpoint: str | None = None,
    tracking_uri: str | None = None,
) -> LoadedSource:
    """Fetch, digest and load the manifest's source."""
    folder = (
        _fetch_s3_folder(source.uri, cache_dir, s3_endpoint)
        if source.s3_folder
        else _local_folder(source.uri, base_dir)
    )
    if (
        folder is not None
        and huggingface.is_model_folder(folder)
        and source.format in ("auto", "huggingface")
    ):
        module = huggingface.load(folder)
        loaded = LoadedSource(source.uri, "huggingface", sha256_tree(folder), module=module)
        return _check_digest(source, loaded)
    if source.format == "huggingface" or folder is not None:
        raise SourceError(_not_a_model_folder(source.uri, folder, source.format))
    fmt = detect_format(source.uri) if source.format == "auto" else source.format
    if fmt == "python":
        module, digest = _load_python(source.uri, base_dir)
        loaded = LoadedSource(source.uri, fmt, digest, module=module)
    elif fmt == "mlflow":
        loaded = _load_mlflow(source.uri, cache_dir, tracking_uri)
    else:
        path = fetch(source.uri, cache_dir, base_dir, s3_endpoint)
        if fmt == "onnx":
            graph, quantized = source_files.read_onnx_source(path)
            external = source_files.external_files(path, graph)
            _fetch_external_data(source.uri, external, cache_dir, s3_endpoint)
            source_files.check_beside(path, external)
            # The weights are the model: a changed external data file is a changed source.
            digest = sha256_files([path, *(path.parent / f for f in external)])
            loaded = LoadedSource(source.uri, fmt, digest, onnx_path=path, quantized=quantized)
        else:
            module, program = _load_torch_file(path, fmt, cache_dir / LOAD_LOG)
            loaded = LoadedSource(source.uri, fmt, sha256_file(path), module=module, exported=program)
    return _check_digest(source, loaded)


def _check_digest(source: Source, loaded: LoadedSource) -> LoadedSource:
    if source.digest and source.digest != loaded.digest:
        raise SourceError(
            f"spec.source.digest is {source.digest} but the source's sha256 is {loaded.digest}: "
            "the model changed; update the digest or point at the intended file"
        )
    return loaded


def _local_path(uri: str, base_dir: Path) -> Path | None:
    """The path a local or file:// URI names (relative to base_dir, the manifest's folder), or None
    for a remote URI."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    path = local_path(uri)
    return path if path.is_absolute() else base_dir / path


def _local_folder(uri: str, base_dir: Path) -> Path | None:
    """The folder a local or file:// URI names, or None (a file, a remote URI, nothing there)."""
    path = _local_path(uri, base_dir)
    return path if path is not None and path.is_dir() else None


def _fetch_s3_folder(uri: str, cache_dir: Path, endpoint: str | None) -> Path:
    """Every object under the s3:// folder `uri`, downloaded into a fresh copy in cache_dir (a file
    deleted from the bucket must not linger in the digest)."""
    from kompile.artifact_store import StoreError, file_sizes

    parsed = urlparse(uri)
    prefix = parsed.path.strip("/")
    try:
        names = sorted(file_sizes(uri, endpoint))
    except StoreError as err:
        raise SourceError(_told(f"spec.source.uri {uri}: cannot list the folder: {err}", err.code)) from None
    if not names:
        raise SourceError(
            f"spec.source.uri {uri}: no objects under this folder; upload the model folder there"
        )
    dest = cache_dir / "s3" / parsed.netloc / prefix
    shutil.rmtree(dest, ignore_errors=True)
    for name in names:
        _fetch_s3(parsed.netloc, posixpath.join(prefix, name), cache_dir, endpoint)
    return dest


def _not_a_model_folder(uri: str, folder: Path | None, fmt: str) -> str:
    if folder is not None and huggingface.is_model_folder(folder):
        return (
            f"spec.source.uri {uri!r}: {folder} is a Hugging Face model folder, but format {fmt} reads "
            "one file: set format huggingface (or auto) to compile the folder, or point the uri at the "
            f"{fmt} file"
        )
    if folder is None:
        return (
            f"spec.source.uri {uri!r}: format huggingface reads a model folder (config.json beside "
            "model.safetensors): a local path, a path in the compile image, or an s3:// folder "
            "(s3://bucket/models/my-bert/)"
        )
    return (
        f"spec.source.uri {uri!r}: {folder} is a folder without config.json: kompile takes a Hugging Face "
        "model folder (config.json beside its weights, as save_pretrained writes it) or one model file "
        "(.onnx, .pt2, .pt) in it"
    )
