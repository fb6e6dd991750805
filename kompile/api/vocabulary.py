"""The API's small words: the enumerations, patterns and limits the spec models share, and the helper
that writes a CEL rule. Backend names are not here: they come from the backend catalog."""

from __future__ import annotations

from typing import Literal

SelectionPolicy = Literal["minLatency", "maxThroughput"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
# A target may ask for the fastest precision that passes its tolerances (kompile.api.candidates.LADDER).
TargetPrecision = Literal["fp32", "fp16", "bf16", "int8", "auto"]
DType = Literal["float32", "float16", "bfloat16", "int64", "int32", "uint8", "bool"]
SourceFormat = Literal["auto", "pt2", "torchscript", "onnx", "mlflow", "python", "huggingface"]
Quantization = Literal["dynamic", "static"]
TaskKind = Literal["auto", "classification", "detection", "none"]
# How task detection reads a YOLO head: without objectness (Ultralytics' YOLOv8 on) or with it (YOLOv5, v7).
DetectionHead = Literal["yolov8", "yolov5"]
DeploymentMode = Literal["Serverless", "RawDeployment", "Standard"]

# A source URI: a local path, file://, s3://, models:/ or runs:/ (MLflow), or python://module:factory.
# A relative path may not hold a colon, so an unsupported scheme (https://) is refused.
SOURCE_URI_PATTERN = r"^(s3://|file://|models:/|runs:/|python://|/|\./|\.\./|[A-Za-z0-9_.-][^:]*$)"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX = 63
# A Kubernetes resource quantity as a string (2, 500m, 4Gi, 1e3), never negative: the API server
# would refuse the compile Job instead, at every reconcile.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"
# Label keys: an optional DNS-subdomain prefix (253) and "/" before a name (63); values: 63.
LABEL_KEY_MAX = 317
LABEL_VALUE_MAX = 63


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out
