"""GitOps integration files shipped with kompile (Argo CD's health check for CompiledModel)."""

from __future__ import annotations

from pathlib import Path

HEALTH_LUA = Path(__file__).resolve().parent.parent / "gitops" / "argocd" / "health.lua"
