"""Core ML backend, export only: the source module through `torch.export` (decomposed to ATen with
`run_decompositions({})`, what coremltools' converter reads) into a Core ML ML program, saved as a
`.mlpackage` at fp32 or fp16 (`compute_precision`).

Core ML runs predictions on macOS only ("Model prediction is only supported on macOS"), so on the
Linux classes kompile compiles on the package cannot be run: the pipeline records it with phase
`Exported` and the catalog's note instead of a verdict, and it is never selected over a validated
artifact nor rolled out. On a class whose nodes run macOS (`kubernetes.io/os=darwin`) a runner over
`coremltools.models.MLModel.predict` would validate it like the others.

An `.mlpackage` is a folder; the artifact is that folder zipped (`model.mlpackage.zip`) so one file
carries it and one digest names it. Entries are sorted and their timestamps fixed, though two
conversions still differ: coremltools writes fresh identifiers into the package's Manifest.json.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import coremltools as ct
import torch

from kompile.api.catalog.coreml import CoreMlOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    Runner,
    options_of,
)
from kompile.compile_jobs.backends.executorch import static_example
from kompile.compile_jobs.backends.inductor import EXPORT_ERRORS, describe_export_error
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.source_module import in_eval_mode
from kompile.compile_jobs.sources import module_label

_PRECISION = {"fp32": ct.precision.FLOAT32, "fp16": ct.precision.FLOAT16}
_UNITS = {
    "all": ct.ComputeUnit.ALL,
    "cpu_only": ct.ComputeUnit.CPU_ONLY,
    "cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU,
    "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE,
}


def zip_folder(folder: Path, out: Path) -> Path:
    """`folder` as one zip whose bytes depend only on its files' names and contents."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(str(Path(folder.name) / path.relative_to(folder)), (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
    return out


class CoreMlBackend(Backend):
    name = "coreml"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        target = request.target
        if request.module is None:
            raise BackendError(
                f"target {target.name!r}: coreml converts a PyTorch source and this source is ONNX "
                "(coremltools dropped its ONNX converter); give a PyTorch source for Apple devices"
            )
        opts = options_of(request, CoreMlOptions)
        args, record = static_example(request)
        record.update(computeUnits=opts.compute_units, format="mlprogram")
        label = module_label(request.module)
        request.out_dir.mkdir(parents=True, exist_ok=True)
        package = request.out_dir / "model.mlpackage"
        # torch and the converter print graphs and passes: into the build folder's log (quiet.py).
        with output_to(request.out_dir / "compile.log"), torch.no_grad():
            try:
                program = torch.export.export(in_eval_mode(request.module), args).run_decompositions({})
            except EXPORT_ERRORS as err:
                raise BackendError(describe_export_error(err, label, "a Core ML package")) from err
            shutil.rmtree(package, ignore_errors=True)
            try:
                # Written where it belongs: without package_dir coremltools converts into a
                # tmp*.mlpackage of the system's temp folder and leaves it there.
                ct.convert(
                    program,
                    convert_to="mlprogram",
                    compute_precision=_PRECISION[target.precision],
                    compute_units=_UNITS[opts.compute_units],
                    package_dir=str(package),
                    skip_model_load=True,  # no Core ML runtime here: nothing to load it into
                )
            except (*EXPORT_ERRORS, NotImplementedError) as err:
                first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
                raise BackendError(
                    f"coremltools could not convert {label} at {target.precision}: {first}; replace the "
                    "operator it names, or export this model for another backend"
                ) from err
        out = zip_folder(package, request.out_dir / "model.mlpackage.zip")
        return CompiledArtifact(
            backend=self.name, model_path=out, options=record, toolchain=self.installed_versions()
        )

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> Runner:
        raise BackendUnavailable(f"{self.entry.exported_note}: Core ML predicts on macOS only")


BACKEND = CoreMlBackend()
