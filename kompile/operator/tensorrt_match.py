"""TensorRT version matching between the GPU compile image and the Triton runtime that serves.

A plan loads only on the TensorRT version that built it (its header records major.minor.patch.build,
and the runtime refuses another version unless the plan was built version-compatible) and on the
compute capability it was built for. So the compile image used for a GPU class must carry the
serving runtime's TensorRT, and the InferenceService must name the Triton release that carries it.
Pure functions: the operator checks before any Job runs, without TensorRT installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$")


@dataclass(frozen=True, order=True)
class TrtVersion:
    major: int
    minor: int
    patch: int | None = None
    build: int | None = None

    def __str__(self) -> str:
        parts = [self.major, self.minor, self.patch, self.build]
        return ".".join(str(p) for p in parts if p is not None)

    def same_release(self, other: TrtVersion) -> bool:
        """Whether a plan built by one loads on the other: major.minor.patch equal, and the build
        number too where both give it. A version without a patch number cannot vouch for a plan."""
        if self.patch is None or other.patch is None:
            return False
        if (self.major, self.minor, self.patch) != (other.major, other.minor, other.patch):
            return False
        return self.build is None or other.build is None or self.build == other.build


def parse_trt_version(text: str) -> TrtVersion:
    """'10.13.3.9', '10.13.3' or '10.13'; a ValueError says what is accepted."""
    m = _VERSION.match(text or "")
    if not m:
        raise ValueError(
            f"TensorRT version {text!r} is not major.minor.patch[.build] (for example 10.7.0.23)"
        )
    major, minor, patch, build = (int(g) if g is not None else None for g in m.groups())
    assert major is not None and minor is not None
    return TrtVersion(major, minor, patch, build)


# TensorRT version -> NVIDIA Triton container release (KServe runtimeVersion), only rows read from
# NVIDIA's own listing of the standard `-py3` images (the `-trtllm-python-py3` images of the same
# month may carry another TensorRT, so they are no evidence). Sources:
# - 20.10, 20.12, 21.05: NVIDIA Triton release notes (docs.nvidia.com/deeplearning/triton-inference-
#   server/release-notes/rel_20-10.html, rel_20-12.html, rel_21-05.html), "Contents of the container".
# - 21.08, 21.11, 22.05, 22.08, 22.11: the container version table of TWCC's Triton image page
#   (docs.twcloud.ai .../images/triton-inference-server/), which lists NGC tags with their TensorRT.
# Newer releases (TensorRT 10.x) could not be confirmed from a source here: name the runtime with
# KOMPILE_TRITON_RUNTIME_VERSION (settings.triton_runtime_version) and add the row with its source.
TRITON_RELEASES: dict[str, str] = {
    "7.2.1": "20.10-py3",
    "7.2.2": "20.12-py3",
    "7.2.3.4": "21.05-py3",
    "8.0.1.6": "21.08-py3",
    "8.0.3.4": "21.11-py3",
    "8.2.5.1": "22.05-py3",
    "8.4.2.4": "22.08-py3",
    "8.5.1": "22.11-py3",
}


def triton_runtime_version(trt_version: str, override: str | None = None) -> str | None:
    """The Triton release (runtimeVersion, e.g. '22.11-py3') serving plans of `trt_version`.

    `override` (the operator setting) wins; otherwise the table row whose version matches. None when
    neither knows it: the InferenceService then keeps the runtime's default version.
    """
    if override:
        return override
    wanted = parse_trt_version(trt_version)
    for row, release in TRITON_RELEASES.items():
        if parse_trt_version(row).same_release(wanted):
            return release
    return None


def refusal(serving: str | None, compile_image_version: str | None, compile_image: str) -> str | None:
    """Why a tensorrt target must not be compiled, or None when the versions agree.

    `serving`: the TensorRT version the serving runtime carries (CompiledModel
    spec.rollout.tensorrtVersion, else settings.serving_tensorrt_version); None means "whatever the
    compile image builds" and never refuses. `compile_image_version`: settings.gpu_tensorrt_version.
    """
    if not serving:
        return None
    try:
        want = parse_trt_version(serving)
    except ValueError as err:
        return f"spec.rollout.tensorrtVersion: {err}"
    if not compile_image_version:
        return (
            f"the serving runtime needs TensorRT {want}, but the TensorRT version of the GPU compile "
            f"image {compile_image} is not configured, so the match cannot be checked: set the "
            "operator's KOMPILE_GPU_TENSORRT_VERSION to the version that image carries"
        )
    try:
        have = parse_trt_version(compile_image_version)
    except ValueError as err:
        return f"KOMPILE_GPU_TENSORRT_VERSION: {err}"
    if want.patch is None:
        return (
            f"spec.rollout.tensorrtVersion {want} lacks the patch number; a plan loads only on the "
            f"exact TensorRT release that built it: give major.minor.patch (the compile image has {have})"
        )
    if want.same_release(have):
        return None
    return (
        f"TensorRT mismatch: the serving runtime runs TensorRT {want} but the GPU compile image "
        f"{compile_image} carries TensorRT {have}, and a plan loads only on the TensorRT release that "
        f"built it. Set spec.rollout.tensorrtVersion to {have}, or point KOMPILE_GPU_IMAGE (and "
        f"KOMPILE_GPU_TENSORRT_VERSION) at a compile image built on TensorRT {want}"
    )
