"""Model files and photos that installed wheels ship (requirements/pretrained.txt), read as files:
the packages themselves are not imported."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # not imported: silero_vad's __init__ loads torchaudio helpers
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is installed by scripts/setup-venv.sh (requirements/pretrained.txt)")
    return Path(next(iter(spec.submodule_search_locations)))


def silero_file(name: str) -> Path:
    """A file of the silero-vad wheel's data folder ("silero_vad.onnx")."""
    return _package_dir("silero_vad") / "data" / name


def nudenet_detector() -> Path:
    """NudeNet's YOLOv8n detector (nudenet/320n.onnx): input `images` [batch, 3, height, width] RGB
    in 0-1, output `output0` [batch, 4 + 18 classes, anchors]: box centre and size in pixels, then
    each class's probability."""
    return _package_dir("nudenet") / "320n.onnx"


def people_photos(size: int = 320) -> np.ndarray[Any, Any]:
    """scikit-image's two photos of people (the astronaut Eileen Collins, the cameraman), each whole
    and two crops of three quarters, resized to size x size: [6, 3, size, size] RGB in 0-1."""
    import torch
    from PIL import Image

    data = _package_dir("skimage") / "data"
    samples = []
    for name in ("astronaut", "camera"):
        image = np.asarray(Image.open(data / f"{name}.png").convert("RGB"), dtype=np.float32) / 255
        chw = torch.from_numpy(image.transpose(2, 0, 1).copy())
        h, w = chw.shape[1:]
        ch, cw = h * 3 // 4, w * 3 // 4
        for crop in (chw, chw[:, :ch, :cw], chw[:, h // 4 : h // 4 + ch, w // 4 : w // 4 + cw]):
            resized = torch.nn.functional.interpolate(crop[None], size=(size, size), mode="bilinear")
            samples.append(resized[0].numpy())
    return np.stack(samples).astype(np.float32)


def lfw_faces(size: int = 48) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """scikit-image's subset of Labeled Faces in the Wild (skimage/data/lfw_subset.npy: 100 faces,
    then 100 patches that are not faces, 25 x 25 grey) resized to size x size and scaled as MTCNN
    feeds its nets ((pixel - 127.5) / 128, three equal channels): [200, 3, size, size], and the
    labels, 1 for a face."""
    from PIL import Image

    grey = np.load(_package_dir("skimage") / "data" / "lfw_subset.npy")
    resized = [
        np.asarray(Image.fromarray((g * 255).astype(np.uint8)).resize((size, size), Image.BILINEAR))
        for g in grey
    ]
    images = ((np.stack(resized).astype(np.float32) - 127.5) / 128)[:, None].repeat(3, axis=1)
    labels = np.array([1] * 100 + [0] * (len(grey) - 100), dtype=np.int64)
    return images, labels
