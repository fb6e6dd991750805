"""A ResNet-50-shaped CNN (torchvision's architecture, random seeded weights)."""

from __future__ import annotations

import torch
from torchvision.models import resnet50 as tv_resnet50


def resnet50() -> torch.nn.Module:
    torch.manual_seed(0)
    return tv_resnet50(weights=None, num_classes=1000).eval()
