# syntax=docker/dockerfile:1
# Five images from one file, one target each:
#   docker build --target operator       -t ghcr.io/kompile/operator:0.1.0       .
#   docker buildx build --platform linux/amd64,linux/arm64 --target compile-cpu \
#     -t ghcr.io/kompile/compile-cpu:0.1.0 --push .
#   docker buildx build --platform linux/amd64,linux/arm64 --target compile-litert \
#     -t ghcr.io/kompile/compile-litert:0.1.0 --push .
#   docker build --target compile-iree   -t ghcr.io/kompile/compile-iree:0.1.0   .
#   docker build --target compile-gpu    -t ghcr.io/kompile/compile-gpu:0.1.0    .
# compile-cpu and compile-litert are multi-arch tags: arm64 edge classes pull their arm64 variant
# (the operator pins the architecture with the Job's nodeSelector; auto offers litert on arm64
# classes, so their Jobs run compile-litert, which carries compile-cpu's backends too).
# No Docker engine runs in CI: tests/unit/test_dockerfile.py lints this file with hadolint and checks
# that every pip extra and file named here exists. Versions come from requirements/lock.txt, the same
# lock CI's venv is built from (scripts/setup-venv.sh), used here as a constraints file so an image
# never resolves a different version than the tests ran with.

# Exact tags (not `3.11-slim`): a rebuild does not silently move to another Python or Debian release.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# TensorRT 10.13 on CUDA 13.0, Python 3.12. A TensorRT plan runs only on the TensorRT version that
# built it, so its TensorRT version is part of the artifact cache key (the operator's
# KOMPILE_GPU_TENSORRT_VERSION): bump both together.
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:25.10-py3

# ---------------------------------------------------------------------------------------------------
# The operator: Kopf, the Kubernetes client, boto3 and the MLflow client. No torch, no compiler
# (import-linter keeps kompile.operator from importing them), so the image stays a few hundred MB.
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
WORKDIR /opt/kompile
COPY requirements/lock.txt requirements/lock.txt
COPY pyproject.toml README.md ./
COPY kompile kompile
# A regular (not editable) install: the source folder is not needed at run time.
RUN pip install --no-cache-dir -c requirements/lock.txt ".[operator,s3,mlflow]"
# 65532: the conventional "nonroot" uid of distroless images; numeric so that Kubernetes'
# runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["kompile", "operator"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image (ONNX Runtime). Size: the lock pins PyPI's torch, whose Linux x86_64 wheel
# bundles the CUDA libraries (about 4-5 GB installed); the CPU-only wheels from PyTorch's own index
# would make it about 1 GB, but that index is not reachable from CI here, and an image must not run
# versions CI never tested. Switch to `--index-url https://download.pytorch.org/whl/cpu` together
# with the lock when that changes.
FROM ${PYTHON_IMAGE} AS compile-cpu
# Set by BuildKit per --platform (amd64, arm64); the default is for a builder that does not set it.
ARG TARGETARCH=amd64
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    KOMPILE_WORK_DIR=/scratch \
    KOMPILE_SOURCE_DIR=/opt/kompile
WORKDIR /opt/kompile
COPY requirements/lock.txt requirements/lock.txt
COPY pyproject.toml README.md ./
COPY kompile kompile
# executorch and coreml: the edge backends, pinned by their extras as in requirements/edge.txt (the
# packages executorch declares but never imports on the export path, hydra-core and test tools, are
# left to pip here; the venv installs edge.txt with --no-deps). Every pin has Linux wheels for both
# architectures (openvino's arm64 wheel needs glibc 2.35: bookworm has 2.36) except coremltools 9.0,
# whose Linux wheels are x86_64 only: Core ML exports are built on amd64 classes, and on arm64 the
# coreml backend reports itself unavailable.
RUN pip install --no-cache-dir -c requirements/lock.txt ".[torch,onnxruntime,openvino,s3,executorch]" \
    && if [ "${TARGETARCH}" = "amd64" ]; then \
        pip install --no-cache-dir -c requirements/lock.txt ".[coreml]"; \
    fi
# The example models, so python://models.small:small_cnn resolves as it does in the examples.
COPY examples/models models
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image plus the litert backend's own environment (litert-torch 0.10 needs torch <
# 2.15): requirements/env-litert.txt built by the same script as locally, at a fixed path that
# KOMPILE_ENV_LITERT names; the pipeline calls its python as a subprocess. The operator's
# KOMPILE_ENV_IMAGES (default litert=ghcr.io/kompile/compile-litert:0.1.0) sends targets with a
# litert candidate here. About 6.6 GB more (a second torch).
FROM compile-cpu AS compile-litert
USER 0
WORKDIR /opt/kompile
COPY requirements/env-litert.txt requirements/env-litert.txt
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh litert > /tmp/env-path \
    && ln -s "$(cat /tmp/env-path)" /opt/kompile/envs/litert \
    && rm /tmp/env-path
ENV KOMPILE_ENV_LITERT=/opt/kompile/envs/litert
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image plus the iree backend's own environment (iree-base-compiler, iree-base-runtime
# and onnx, no torch): requirements/env-iree.txt at a fixed path that KOMPILE_ENV_IREE names. The
# operator's KOMPILE_ENV_IMAGES (default iree=ghcr.io/kompile/compile-iree:0.1.0) sends targets with
# an iree candidate here. About 600 MB more.
FROM compile-cpu AS compile-iree
USER 0
WORKDIR /opt/kompile
COPY requirements/env-iree.txt requirements/env-iree.txt
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh iree > /tmp/env-path \
    && ln -s "$(cat /tmp/env-path)" /opt/kompile/envs/iree \
    && rm /tmp/env-path
ENV KOMPILE_ENV_IREE=/opt/kompile/envs/iree
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image plus the tvm backend's own environment (apache-tvm 0.27 with its FFI pinned,
# onnx, xgboost-cpu; no torch: it compiles the ONNX export): requirements/env-tvm.txt at a fixed path
# that KOMPILE_ENV_TVM names. KOMPILE_ENV_IMAGES (default tvm=ghcr.io/kompile/compile-tvm:0.1.0)
# sends targets with a tvm candidate here. About 450 MB more.
FROM compile-cpu AS compile-tvm
USER 0
WORKDIR /opt/kompile
COPY requirements/env-tvm.txt requirements/env-tvm.txt
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh tvm > /tmp/env-path \
    && ln -s "$(cat /tmp/env-path)" /opt/kompile/envs/tvm \
    && rm /tmp/env-path
ENV KOMPILE_ENV_TVM=/opt/kompile/envs/tvm
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image plus the xla backend's own environment (torchax 0.0.13 imports only with
# torch 2.9): requirements/env-xla.txt at a fixed path that KOMPILE_ENV_XLA names. The operator's
# KOMPILE_ENV_IMAGES (default xla=ghcr.io/kompile/compile-xla:0.1.0) sends targets with an xla
# candidate here. About 6.5 GB more (torch 2.9 with its CUDA libraries, jaxlib).
FROM compile-cpu AS compile-xla
USER 0
WORKDIR /opt/kompile
COPY requirements/env-xla.txt requirements/env-xla.txt
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh xla > /tmp/env-path \
    && ln -s "$(cat /tmp/env-path)" /opt/kompile/envs/xla \
    && rm /tmp/env-path
ENV KOMPILE_ENV_XLA=/opt/kompile/envs/xla
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The CPU compile image plus every backend's own environment (requirements/env-*.txt), each at
# /opt/kompile/envs/<name> where KOMPILE_ENVS_DIR finds it: the operator's KOMPILE_ENVS_IMAGE
# (default ghcr.io/kompile/compile-envs:0.1.0) runs a target whose candidates need several own
# environments (litert and xla, say) here, since one Job builds every candidate of its target.
FROM compile-cpu AS compile-envs
USER 0
WORKDIR /opt/kompile
COPY requirements/env-*.txt requirements/
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN for pins in requirements/env-*.txt; do \
        name="$(basename "$pins" .txt)" && name="${name#env-}" \
        && PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh "$name" > /tmp/env-path \
        && ln -s "$(cat /tmp/env-path)" "/opt/kompile/envs/$name" || exit 1; \
    done && rm -f /tmp/env-path
ENV KOMPILE_ENVS_DIR=/opt/kompile/envs
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The GPU compile image: NVIDIA's TensorRT container brings TensorRT, its Python bindings and CUDA;
# kompile adds torch (PyPI's CUDA wheel) for export and the inductor backend, ONNX Runtime (CPU) for
# the reference run and the CPU check of prepared graphs, and NVIDIA ModelOpt without its [onnx]
# extra (exact pins in the tensorrt extra, equal to requirements/modelopt.txt) for fp16/bf16/int8
# graph preparation. The plans it builds load only on this image's TensorRT version: the operator's
# KOMPILE_GPU_TENSORRT_VERSION must name it (docs/tensorrt.md), and a serving runtime on another
# version is refused before any Job runs. The last command fails the build if either import breaks.
FROM ${TENSORRT_IMAGE} AS compile-gpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    KOMPILE_WORK_DIR=/scratch \
    KOMPILE_SOURCE_DIR=/opt/kompile \
    KOMPILE_TIMING_CACHE_DIR=/scratch/timing-caches
WORKDIR /opt/kompile
COPY requirements/lock.txt requirements/lock.txt
COPY pyproject.toml README.md ./
COPY kompile kompile
RUN python3 -m pip install --no-cache-dir -c requirements/lock.txt ".[torch,onnxruntime,s3,tensorrt]" \
    && python3 -c "import tensorrt, modelopt.onnx.autocast, modelopt.onnx.quantization; print(tensorrt.__version__)"
COPY examples/models models
USER 65532:65532
ENTRYPOINT ["kompile-job"]

# ---------------------------------------------------------------------------------------------------
# The GPU compile image plus the own environments of the backends that also build for NVIDIA GPUs
# (the catalog entries with an environment and the cuda device: iree, tvm, xla), each at
# /opt/kompile/envs/<name> where KOMPILE_ENVS_DIR finds it: the operator's KOMPILE_GPU_ENVS_IMAGE
# (default ghcr.io/kompile/compile-gpu-envs:0.1.0) runs a GPU target with such a candidate here.
# Their pins have Python 3.12 wheels (this image's Python); where the container's Python has no
# ensurepip, setup-backend-env.sh makes the venv without pip and installs pip with the system's.
FROM compile-gpu AS compile-gpu-envs
USER 0
WORKDIR /opt/kompile
COPY requirements/env-iree.txt requirements/env-tvm.txt requirements/env-xla.txt requirements/
COPY scripts/setup-backend-env.sh scripts/setup-backend-env.sh
RUN for name in iree tvm xla; do \
        PIP_NO_CACHE_DIR=1 KOMPILE_CACHE=/opt/kompile/envs scripts/setup-backend-env.sh "$name" > /tmp/env-path \
        && ln -s "$(cat /tmp/env-path)" "/opt/kompile/envs/$name" || exit 1; \
    done && rm -f /tmp/env-path
ENV KOMPILE_ENVS_DIR=/opt/kompile/envs
USER 65532:65532
ENTRYPOINT ["kompile-job"]
