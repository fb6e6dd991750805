"""Versions of the compilers the compile images carry, as pinned by requirements/lock.txt,
requirements/modelopt.txt and requirements/edge.txt (the images install those files), and by each
backend's own environment (requirements/env-<name>.txt). The operator cannot import a compiler (its
image has none), so it keys the compile cache with these; a unit test holds them equal to the pins,
so a toolchain upgrade changes the keys and nothing stale is reused. TensorRT comes with NVIDIA's
base image instead: its version is the operator setting KOMPILE_GPU_TENSORRT_VERSION."""

from __future__ import annotations

PINNED: dict[str, str] = {
    "onnxruntime": "1.31.1",
    "torch": "2.15.0",
    "nvidia-modelopt": "0.47.0",
    "openvino": "2026.4.1",
    "nncf": "3.4.0",
    "executorch": "1.5.1",
    "torchao": "0.18.0",
    "coremltools": "9.0",
}
IMAGE_PROVIDED = frozenset({"tensorrt"})
"""Distributions a compile image's base provides rather than the lock files."""
ENVIRONMENT_PINNED: dict[str, dict[str, str]] = {
    "litert": {
        "litert-torch": "0.10.0",
        "ai-edge-litert": "2.3.0",
        "ai-edge-quantizer": "0.10.0",
        "torch": "2.14.1",
    },
    "xla": {"jax": "0.10.2", "jaxlib": "0.10.2", "torchax": "0.0.13", "torch": "2.9.1"},
    "tvm": {
        "apache-tvm": "0.27.0.post1",
        "apache-tvm-ffi": "0.1.14.post0",
        "onnx": "1.23.2",
    },
    "iree": {
        "iree-base-compiler": "3.13.0",
        "iree-base-runtime": "3.13.0",
        "onnx": "1.23.2",
    },
}
"""Per own environment (a catalog entry's `environment`): the versions its env-<name>.txt pins."""


def pinned_for(environment: str | None) -> dict[str, str]:
    """The versions a backend's artifacts are built with: its own environment's pins over the
    project's."""
    return PINNED | ENVIRONMENT_PINNED.get(environment or "", {})
