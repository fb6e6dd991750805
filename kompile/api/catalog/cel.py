"""CEL rules made from the catalog's options models, so the API server refuses an unknown option key
at `kubectl apply` time, as `kompile check` does.

Keys only: a rule that also matched every value against its pattern cost 8-33x the API server's
budget (32 targets x 8 candidates x 32 options x value length). Values are checked by the same
typed models in `kompile check` and by the operator before any Job (an InvalidSpec condition that
names the key). A messageExpression naming the bad key cost over 100x the budget."""

from __future__ import annotations

from kompile.api.catalog import AUTO, CATALOG, auto_backends


def _keys(names: list[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in sorted(names)) + "]"


def option_rules(var: str = "options", *, auto: bool) -> list[dict[str, str]]:
    """One rule over `self.<var>` of a Target (auto allowed) or a Candidate: each key must be an
    option of the backend named (for auto: of a backend auto may offer)."""
    branches = [(e.name, e.options.wire_names()) for e in CATALOG.values()]
    if auto:
        offered = sorted({n for d in ("cpu", "cuda") for n in auto_backends(d)})
        union = sorted({k for n in offered for k in CATALOG[n].options.wire_names()})
        branches.append((AUTO, union))
    expr = "[]"
    for name, keys in reversed(branches):
        expr = f"self.backend == '{name}' ? {_keys(keys)} : {expr}"
    return [
        {
            "rule": f"!has(self.{var}) || self.{var}.all(k, k in ({expr}))",
            "message": f"{var}: unknown option for this backend; each backend's options are listed "
            "in docs/reference.md (Backend options)",
            "fieldPath": f".{var}",
        }
    ]
