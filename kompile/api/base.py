"""Shared base for API models: camelCase on the wire, snake_case in Python, strict fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every CompiledModel API type.

    `extra="forbid"` makes a misspelt field an error that names it, the same way the API server's
    strict field validation does, so `kompile run` and `kubectl apply` refuse the same manifests.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        # No lax coercion ("yes" -> True, "20" -> 20): the API server would refuse those too.
        strict=True,
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The document as it is written to the API server or to `--json`: camelCase, no nulls."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
