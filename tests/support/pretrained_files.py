"""Model files that installed wheels ship with real weights (requirements/pretrained.txt)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def silero_file(name: str) -> Path:
    """A file of the silero-vad wheel's data folder ("silero_vad.onnx")."""
    spec = importlib.util.find_spec("silero_vad")  # not imported: its __init__ loads torchaudio helpers
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("silero-vad is installed by scripts/setup-venv.sh (requirements/pretrained.txt)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name
