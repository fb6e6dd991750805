"""Generate the CompiledModel CRD from the typed models (the single source of truth).

Pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3 schema: no $ref,
no anyOf-with-null for optional fields, boolean exclusive bounds, no titles. This module translates.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kompile.api.resource import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from kompile.api.spec import CompiledModelSpec
from kompile.api.status import CompiledModelStatus

CRD_FILENAME = f"{GROUP}_{PLURAL}.yaml"

_DROP = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        # Field-level keys (description, list-type markers) win over the referenced type's own.
        target.update(node)
        node = target
    any_of = node.get("anyOf")
    if isinstance(any_of, list) and _int_or_string(any_of):
        return _as_int_or_string(node, any_of, defs)
    if isinstance(any_of, list):
        rest = [s for s in any_of if s != {"type": "null"}]
        if len(rest) == 1:
            node.pop("anyOf")
            inner = dict(rest[0])
            inner.update({k: v for k, v in node.items()})
            node = inner
            if node.get("default", 0) is None:
                node.pop("default")
            return _resolve(node, defs)  # the surviving branch may itself be a $ref
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "additionalProperties" and value is False):
            continue  # structural schemas forbid properties beside additionalProperties: false
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default" and isinstance(value, (dict, list)):
            continue  # object and list defaults would be applied by the API server; keep scalars only
        elif key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key == "propertyNames":
            # Not a field of Kubernetes' JSONSchemaProps (server-side apply refuses it where the
            # CRD's schema is typed): the key bound becomes a CEL rule, which the server enforces.
            rules = out.setdefault("x-kubernetes-validations", [])
            rules.append(
                {
                    "rule": f"self.all(k, size(k) <= {value['maxLength']})",
                    "message": f"keys are at most {value['maxLength']} characters",
                }
            )
        elif key == "x-kubernetes-validations":
            out[key] = [*out.get(key, []), *_resolve(value, defs)]
        else:
            out[key] = _resolve(value, defs)
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def _int_or_string(any_of: list[Any]) -> bool:
    types = sorted(str(b.get("type")) for b in any_of if isinstance(b, dict))
    return len(any_of) == 2 and types == ["integer", "string"]


def _as_int_or_string(node: dict[str, Any], any_of: list[Any], defs: dict[str, Any]) -> dict[str, Any]:
    """anyOf [integer, string] (a quantity) as a structural schema has it: no type, the
    x-kubernetes-int-or-string marker, and each branch's bounds beside it (pattern and maxLength
    only bind strings, minimum only numbers)."""
    out = {k: v for k, v in node.items() if k != "anyOf"}
    for branch in any_of:
        out.update({k: v for k, v in branch.items() if k != "type"})
    resolved: dict[str, Any] = _resolve(out, defs)
    return resolved | {"x-kubernetes-int-or-string": True}


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a pydantic model, by alias (camelCase)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    resolved: dict[str, Any] = _resolve(raw, defs)
    return resolved


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {
            "name": "Targets",
            "type": "string",
            "jsonPath": ".status.targetsReady",
            "description": "validated/total",
        },
        {"name": "Best", "type": "string", "jsonPath": ".status.best.target"},
        {"name": "Speedup", "type": "number", "jsonPath": ".status.best.speedup"},
        {
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition document."""
    spec_schema = openapi_schema(CompiledModelSpec)
    status_schema = openapi_schema(CompiledModelStatus)
    # Applied when an object without status is read: a new CompiledModel reads as not yet observed
    # (kstatus, Flux's health check, took one without status as Current) until the operator writes.
    status_schema["default"] = {"observedGeneration": 0}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["kompile"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "CompiledModel compiles one trained model for every hardware "
                            "class of a fleet, validates and benchmarks each artifact, registers it "
                            "and rolls the validated winner out.",
                            "required": ["spec"],
                            # Custom resources only need DNS-subdomain names; Jobs and
                            # InferenceServices derive theirs from this one, so hold it to a label.
                            "x-kubernetes-validations": [
                                {
                                    "rule": "size(self.metadata.name) <= 63 && "
                                    "self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                                    "message": "metadata.name must be a DNS label: at most 63 lowercase "
                                    "letters, digits and '-'",
                                }
                            ],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "kompile.dev/v1alpha1"},
                                "kind": {"type": "string", "description": "CompiledModel"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd() -> str:
    header = "# Generated by `kompile crd` from kompile/api; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
