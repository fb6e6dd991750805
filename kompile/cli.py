"""`kompile`: the command line. `kompile run MANIFEST` is the embedded default a newcomer tries first.

Exit codes: 0 when every target this machine can serve validated; 1 when a target failed to
compile or validate; 2 when the input is wrong (manifest, source, inputs, export); 70 when kompile
itself failed (a bug: the message names the file that holds the traceback).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from kompile.api.resource import CompiledModel, ManifestError, load_manifest, load_manifests, manifest_files

if TYPE_CHECKING:
    from collections.abc import Callable

    from kompile.operator.kube import Kube
    from kompile.operator.leader import LeaseElector
    from kompile.operator.settings import Settings as OperatorSettings

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Compile one trained model for every kind of hardware."
)
# Wide enough for the summary table when stderr is not a terminal (CI logs, pipes).
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

EXIT_TARGET_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE: kompile's own bug, not the input


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    from rich.markup import escape

    # Escaped: a message quotes user text (paths, model names) that may hold [brackets].
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)")
_ONE_SLASH = ("models", "runs")  # MLflow's URIs: models:/name/version, runs:/id/path


def _refuse_uri(argument: Path, verb: str) -> None:
    """A model URI given where a path goes (`kompile run s3://bucket/model.onnx`): the path folds
    its // into one, and "no such file" said nothing of where a URI belongs."""
    found = None if argument.exists() else _URI.fullmatch(str(argument))
    if found is None:
        return
    scheme, rest = found.groups()
    uri = f"{scheme}:/{rest}" if scheme in _ONE_SLASH else f"{scheme}://{rest}"
    takes = {
        "run": "a manifest, a local model file (.onnx, .pt2) or a Hugging Face model folder",
        "init": "a local model file (.onnx, .pt2) or a Hugging Face model folder",
    }[verb]
    raise _fail(
        f"{uri}: kompile {verb} takes {takes}, not a URI. A URI goes in a manifest: "
        f"spec.source.uri: {uri}, with the model's spec.inputs (examples/small-cnn.yaml is one); "
        f"run that manifest, or `kompile {verb}` a local copy of the model."
    )


DimOption = Annotated[
    list[str] | None,
    typer.Option("--dim", help="Model files: a dynamic dim's range, NAME=MIN:OPT:MAX (repeatable)."),
]
PrecisionOption = Annotated[
    list[str] | None,
    typer.Option(
        "--precision",
        help="Model files: precisions to build (repeatable; default fp32; auto: the fastest that passes).",
    ),
]
BackendOption = Annotated[str, typer.Option(help="Model files: the fleet's backend (default auto).")]
DatasetOption = Annotated[
    Path | None,
    typer.Option(
        "--dataset",
        help="Model files: reference inputs, an .npz keyed by input name (samples along the batch "
        "axis): validation runs on them, and the dims they show take their sizes.",
    ),
]


@app.command()
def run(
    manifest: Annotated[
        Path,
        typer.Argument(help="CompiledModel YAML file, or a model: .onnx, .pt2, a Hugging Face model folder."),
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the status document (CRD status shape) on stdout.")
    ] = False,
    work_dir: Annotated[Path, typer.Option(help="Scratch, cache and default stores.")] = Path(".kompile"),
    artifacts: Annotated[
        str | None,
        typer.Option(
            help="Artifact root, a folder or s3://bucket/prefix; default: spec.registry.artifactStore "
            "or WORK_DIR/artifacts."
        ),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI; default: sqlite under WORK_DIR."
        ),
    ] = None,
    register: Annotated[bool, typer.Option(help="Record runs and versions in MLflow.")] = True,
    target: Annotated[list[str] | None, typer.Option(help="Only these targets (repeatable).")] = None,
    dim: DimOption = None,
    precision: PrecisionOption = None,
    backend: BackendOption = "auto",
    dataset: DatasetOption = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="The CompiledModel to run, in a file holding several; for a model file, its metadata.name."
        ),
    ] = None,
) -> None:
    """Compile, validate, benchmark and register a model on this machine.

    MANIFEST is a CompiledModel YAML file. Given a model file instead, kompile reads its inputs,
    compiles it for this machine and prints the manifest it used."""
    from kompile.artifact_store import local_path
    from kompile.local_run import LocalRunSettings, execute, with_artifact_store

    written: str | None = None
    _refuse_uri(manifest, "run")
    if starter_is_model(manifest):
        found = _dataset_ref(dataset, manifest.parent)
        cm, written = _starter_manifest(manifest, manifest.name, dim, precision, backend, name, found)
    elif dim or precision or backend != "auto" or dataset is not None:
        raise _fail(
            "--dim, --precision, --backend and --dataset apply to model files; edit the manifest instead"
        )
    else:
        try:
            cm = load_manifest(manifest, name)
        except ManifestError as err:
            from kompile.compile_jobs.source_files import unreadable_model_hint

            # A model file not named .onnx/.pt2 (a .pt): what it holds says more than YAML's error.
            raise _fail(unreadable_model_hint(manifest) or str(err)) from None
    local_artifacts = None
    if artifacts is not None:
        if artifacts.startswith("s3://"):  # the store, as spec.registry.artifactStore names one
            cm = with_artifact_store(cm, artifacts)
        elif "://" in artifacts and not artifacts.startswith("file://"):
            raise _fail(f"--artifacts {artifacts}: give a folder, file:///path or s3://bucket/prefix")
        else:
            local_artifacts = local_path(artifacts)
    settings = LocalRunSettings(
        manifest=manifest,
        work_dir=work_dir,
        artifacts=local_artifacts,
        store_flag="spec.registry.artifactStore" if artifacts is None else "--artifacts",
        tracking_uri=tracking_uri,
        register=register,
        targets=target or None,
        json_out=json_out,
    )
    # SIGTERM (`kill`, a CI timeout) ends the run as Ctrl-C does: the `finally` blocks run, so what a
    # tvm tuning measured is merged into the machine's shared database, and the exit code is 130.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.perf_counter()
    try:
        code, message = execute(cm, settings, err_console)
    except KeyboardInterrupt:
        err_console.print(
            "\ninterrupted: nothing was registered and no `latest` pointer moved; run it again to finish",
            highlight=False,
        )
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if message:
        raise _fail(message, code)
    if written is not None:
        again = _init_command(manifest, dim, precision, backend, dataset, name)
        err_console.print(f"\nThe manifest this run used (save it with `{again}`):", highlight=False)
        err_console.print(written, markup=False, highlight=False, soft_wrap=True)
    if not json_out:
        err_console.print(f"done in {time.perf_counter() - started:.1f}s")
    raise typer.Exit(code)


def _init_command(
    model: Path,
    dims: list[str] | None,
    precisions: list[str] | None,
    backend: str,
    dataset: Path | None,
    name: str | None,
) -> str:
    """The `kompile init` that writes the manifest a model-file run used: the same flags, so the
    saved manifest is that one (without them it would lose the dims and the dataset)."""
    args = ["kompile", "init", str(model)]
    for flag, values in (("--dim", dims or []), ("--precision", precisions or [])):
        args += [part for value in values for part in (flag, value)]
    if backend != "auto":
        args += ["--backend", backend]
    if dataset is not None:
        args += ["--dataset", str(dataset)]
    if name is not None:
        args += ["--name", name]
    return shlex.join(args)


def starter_is_model(path: Path) -> bool:
    from kompile.starter import is_model_file

    return is_model_file(path)


def _starter_manifest(
    model: Path,
    source_uri: str,
    dims: list[str] | None,
    precisions: list[str] | None,
    backend: str,
    name: str | None = None,
    dataset: tuple[Path, str] | None = None,
) -> tuple[CompiledModel, str]:
    """The CompiledModel written for a model file, and its commented YAML; `dataset` is the
    --dataset file and how the manifest names it."""
    from kompile.api.resource import parse_manifest
    from kompile.compile_jobs.source_files import SourceError
    from kompile.starter import StarterError, StarterOptions, commented_yaml, manifest_for, parse_dim

    if not model.exists():
        raise _fail(f"{model}: no such file")
    try:
        opts = StarterOptions(
            dims=dict(parse_dim(d) for d in dims or []),
            precisions=list(precisions or ["fp32"]),
            backend=backend,
            name=name,
            dataset=dataset[0] if dataset else None,
            dataset_uri=dataset[1] if dataset else "",
        )
        doc = manifest_for(model, source_uri, opts)
        cm = parse_manifest(doc, f"the manifest written for {model.name}")
    except (StarterError, SourceError, ManifestError) as err:
        raise _fail(str(err)) from None
    return cm, commented_yaml(doc, model)


def _dataset_ref(dataset: Path | None, manifest_dir: Path) -> tuple[Path, str] | None:
    """The --dataset file and its path relative to the manifest's folder (where the run resolves
    spec.validation.dataset, as it does the source)."""
    if dataset is None:
        return None
    if not dataset.is_file():
        raise _fail(f"--dataset {dataset}: no such file")
    return dataset, Path(os.path.relpath(dataset.resolve(), manifest_dir.resolve())).as_posix()


@app.command()
def init(
    model: Annotated[Path, typer.Argument(help="Model file (.onnx or .pt2) or Hugging Face model folder.")],
    out: Annotated[
        Path | None, typer.Option(help="Manifest to write; default: MODEL's name with .yaml.")
    ] = None,
    dim: DimOption = None,
    precision: PrecisionOption = None,
    backend: BackendOption = "auto",
    dataset: DatasetOption = None,
    name: Annotated[str | None, typer.Option(help="metadata.name; default: from the file name.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite OUT if it exists.")] = False,
) -> None:
    """Write a commented CompiledModel manifest for a model file or folder, ready to run or kubectl apply."""
    _refuse_uri(model, "init")
    path = out or (model.parent / f"{model.name}.yaml" if model.is_dir() else model.with_suffix(".yaml"))
    source = Path(os.path.relpath(model.resolve(), path.resolve().parent)).as_posix()
    found = _dataset_ref(dataset, path.parent)
    # Refuses a non-model first.
    _, text = _starter_manifest(model, source, dim, precision, backend, name, found)
    if path.exists() and not force:
        raise _fail(f"{path} exists: pass --force to overwrite it, or --out another file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as err:
        raise _fail(f"cannot write {path}: {err.strerror}") from None
    err_console.print(f"wrote {path}: run it with `kompile run {path}`", highlight=False)


@app.command()
def check(
    manifests: Annotated[
        list[Path],
        typer.Argument(
            help="CompiledModel YAML files (- reads stdin: `kustomize build overlay | kompile check -`), "
            "or folders (a GitOps repository) whose YAML files are checked."
        ),
    ],
) -> None:
    """Validate manifests (every CompiledModel in them) against the API without running anything."""
    from rich.markup import escape

    found = manifest_files(manifests)
    files, problems = found.files, found.empty
    valid = 0
    for path in files:
        stdin = str(path) == "-"
        try:
            models = load_manifests("<stdin>", sys.stdin.read()) if stdin else load_manifests(path)
        except ManifestError as err:
            problems.append(str(err))
            continue
        path = Path("<stdin>") if stdin else path
        for cm in models:
            valid += 1
            err_console.print(
                f"{escape(str(path))}: valid CompiledModel {cm.metadata.name!r}", highlight=False
            )
    for problem in problems:
        err_console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if found.patches:
        err_console.print(
            f"left out {_counted(len(found.patches), 'kustomize patch', 'es')} (a partial CompiledModel by "
            "design, e.g. "
            f"{escape(str(found.patches[0]))}): check what an overlay renders with "
            "`kubectl kustomize <overlay> | kompile check -` (or `kustomize build`)",
            highlight=False,
        )
    counted = f"{_counted(valid, 'CompiledModel')} in {_counted(len(files), 'file')}"
    if problems:
        raise _fail(f"{counted}: {len(problems)} invalid")
    if len(files) > 1 or any(p.is_dir() for p in manifests):
        err_console.print(f"{counted}: all valid", highlight=False)


def _counted(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


@app.command()
def compare(
    reference: Annotated[
        Path, typer.Argument(help="Saved results to compare against (.npz or artifact folder).")
    ],
    candidate: Annotated[
        Path, typer.Argument(help="Saved results held to REFERENCE (.npz or artifact folder).")
    ],
    precision: Annotated[
        str | None,
        typer.Option(help="Default thresholds of this precision; default: CANDIDATE's, else fp32."),
    ] = None,
    max_abs_error: Annotated[
        float | None, typer.Option(help="Override: largest absolute difference, whatever the output's size.")
    ] = None,
    max_scaled_error: Annotated[
        float | None,
        typer.Option(
            help="Override: largest absolute difference per unit of max(1, the output's largest |value|)."
        ),
    ] = None,
    min_cosine: Annotated[float | None, typer.Option(help="Override: smallest cosine similarity.")] = None,
    task: Annotated[str, typer.Option(help="auto, classification, detection or none.")] = "auto",
    detection_head: Annotated[
        str, typer.Option(help="--task detection: yolov8 (no objectness) or yolov5 (an objectness column).")
    ] = "yolov8",
) -> None:
    """Compare two saved run results (reference.npz, outputs.npz, or artifact folders)."""
    from pydantic import ValidationError

    from kompile.api.spec import Tolerances
    from kompile.compare import compare_saved, load_saved
    from kompile.compile_jobs.run_results import RunResultsError

    if task not in ("auto", "classification", "detection", "none"):
        raise _fail(f"--task {task!r}: use auto, classification, detection or none")
    if detection_head not in ("yolov8", "yolov5"):
        raise _fail(f"--detection-head {detection_head!r}: use yolov8 or yolov5")
    try:
        tolerances = Tolerances(
            max_abs_error=max_abs_error, max_scaled_error=max_scaled_error, min_cosine=min_cosine
        )
        a, b = load_saved(reference), load_saved(candidate)
        verdict = compare_saved(a, b, precision, tolerances, task, detection_head)  # type: ignore[arg-type]
    except (RunResultsError, ValidationError, ValueError) as err:
        raise _fail(str(err)) from None
    err_console.print(
        f"{b.results.label} ({b.path}) against {a.results.label} ({a.path}), {verdict.samples} samples",
        highlight=False,
        soft_wrap=True,
    )
    for o in verdict.outputs:
        top = (
            ""
            if o.top_k_agreement is None
            else f", top-{verdict.thresholds.top_k} agreement {o.top_k_agreement:.4f}"
        )
        figures = (
            f"max abs error {o.max_abs_error:.3g}, max rel error {o.max_rel_error:.3g}, "
            f"min cosine {o.cosine:.6f}{top}"
            if o.agreement is None
            else f"equal values {o.agreement:.4f} (integer or boolean: labels, masks)"
        )
        if (d := o.detections) is not None:
            figures += (
                f"; detections: {d.found} of {d.required} found, {d.extra} added, agreement {d.agreement:.3f}"
            )
        err_console.print(f"  {o.name}: {figures}", highlight=False, soft_wrap=True)
    if (acc := verdict.task_accuracy) is not None:
        err_console.print(
            f"  accuracy on {acc.labelled} labels ({acc.output}): {acc.accuracy:.2f}% against "
            f"{acc.reference:.2f}%, drop {acc.drop:.2f} points",
            highlight=False,
            soft_wrap=True,
        )
    if not verdict.passed:
        raise _fail("failed: " + "; ".join(verdict.failures), EXIT_TARGET_FAILED)
    err_console.print("[green]passed[/]")


@app.command()
def crd(
    out: Annotated[
        Path | None, typer.Option(help="Write the CRD YAML into this folder instead of stdout.")
    ] = None,
    check_drift: Annotated[
        bool, typer.Option("--check", help="Exit 1 when the file in OUT differs from the models.")
    ] = False,
) -> None:
    """Print (or write) the CompiledModel CRD generated from the API models."""
    from kompile.api.crd import CRD_FILENAME, render_crd

    text = render_crd()
    if out is None:
        sys.stdout.write(text)
        return
    path = out / CRD_FILENAME
    if check_drift:
        if not path.exists() or path.read_text() != text:
            raise _fail(f"{path} is out of date with kompile/api: run `kompile crd --out {out}`", 1)
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    err_console.print(f"wrote {path}")


@app.command()
def reference(
    out: Annotated[Path | None, typer.Option(help="Write the Markdown here instead of stdout.")] = None,
) -> None:
    """Print (or write) the CompiledModel API reference generated from the models."""
    from kompile.api.reference import render_reference

    text = render_reference()
    if out is None:
        sys.stdout.write(text)
        return
    out.write_text(text)
    err_console.print(f"wrote {out}")


@app.command()
def operator(
    verbose: Annotated[bool, typer.Option(help="Debug logging.")] = False,
) -> None:
    """Run the Kubernetes operator (settings from KOMPILE_* environment variables)."""
    import kopf
    from kubernetes.config import ConfigException

    from kompile.operator.kube import load_config
    from kompile.operator.settings import SettingsError

    try:
        from kompile.operator import main as operator_main  # reads the settings
    except SettingsError as err:
        raise _fail(str(err)) from None
    try:
        load_config()
    except ConfigException as err:
        where = os.environ.get("KUBECONFIG", "~/.kube/config")
        raise _fail(
            f"no Kubernetes credentials: not in a pod (no service account token) and no usable "
            f"kubeconfig at {where} ({err}); set KUBECONFIG to a kubeconfig file, or install the "
            "operator in the cluster (helm install kompile helm/kompile)"
        ) from None
    s = operator_main.SETTINGS
    err_console.print(
        f"kompile operator: watching {', '.join(s.namespaces) or 'all namespaces'}; "
        f"liveness :{s.health_port}/healthz, metrics :{s.metrics_port}/metrics"
    )
    from kompile.operator.leader import LeaseForbidden

    kopf.configure(debug=verbose, verbose=verbose)
    if not verbose:
        # The handlers only enqueue: a "Handler succeeded" line per watch event would be most of the log.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        elector = _elect(s, operator_main.kube)
    except LeaseForbidden as err:
        err_console.print(f"error: {err}")
        raise typer.Exit(1) from None
    try:
        kopf.run(
            clusterwide=not s.namespaces,
            namespaces=s.namespaces,
            liveness_endpoint=f"http://0.0.0.0:{s.health_port}/healthz",
            standalone=True,
        )
    finally:
        if elector is not None:
            elector.release()


def _elect(s: OperatorSettings, kube: Callable[[], Kube]) -> LeaseElector | None:
    """Wait for the Lease (a standby), then keep it from a thread; None without leader election."""
    from kubernetes import client

    from kompile.operator.leader import LeaseElector, default_identity, lose_leadership, standby_health

    if not s.lease_name:
        return None
    api = client.CoordinationV1Api(kube().api)
    elector = LeaseElector(api, s.lease_name, s.lease_namespace, default_identity(), s.lease_duration_seconds)
    with standby_health(s.health_port):
        elector.acquire()
    elector.keep(on_lost=lose_leadership)
    return elector


def _disk_full(err: BaseException) -> str | None:
    """What to do when a disk filled up (anywhere in the error's chain): not a bug in kompile, and
    nothing the input could change, so no bug report is asked for."""
    import errno
    import shutil

    from rich.markup import escape

    seen: BaseException | None = err
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    assert isinstance(seen, OSError)
    where = Path(str(seen.filename2 or seen.filename or "."))
    folder = next((p for p in (where, *where.parents) if p.is_dir()), Path("."))
    free = shutil.disk_usage(folder).free / 2**20
    return escape(
        f"no space left on the disk holding {where} ({free:.0f} MiB free): free space there, or give "
        "--work-dir a folder on a disk with room (a run keeps the export and each candidate's build, "
        "a few times the model's size)"
    )


def main() -> None:
    # No raw traceback reaches a user: an error kompile did not expect is one line that says so,
    # the traceback kept in a file for the bug report (KOMPILE_DEBUG=1 raises it as it is).
    try:
        app()
    except Exception as err:
        if os.environ.get("KOMPILE_DEBUG"):
            raise
        full = _disk_full(err)
        if full is not None:
            err_console.print(f"[bold red]error:[/] {full}", highlight=False, soft_wrap=True, markup=True)
            raise SystemExit(EXIT_TARGET_FAILED) from None
        import tempfile
        import traceback

        from rich.markup import escape

        from kompile.registry import hide_userinfo

        # The file is for a bug report: keys in a URL (a --tracking-uri's user:password@) stay out.
        fd, path = tempfile.mkstemp(prefix="kompile-error-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(
                hide_userinfo(
                    f"kompile {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(err))
                )
            )
        first = hide_userinfo((str(err).strip().splitlines() or [""])[0])[:300]
        err_console.print(
            f"[bold red]error:[/] kompile failed unexpectedly: {type(err).__name__}: {escape(first)}\n"
            f"This is a bug in kompile, not in your input: please report it with {escape(path)} (the full "
            "traceback); KOMPILE_DEBUG=1 prints it here.",
            highlight=False,
            soft_wrap=True,
        )
        raise SystemExit(EXIT_INTERNAL) from None


def print_json(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
