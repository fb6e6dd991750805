"""Small models for quick tests and for the failure examples."""

from __future__ import annotations

import torch


class SmallCNN(torch.nn.Module):
    """A few conv blocks and a classifier: compiles in seconds."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = torch.nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


class NaNModel(torch.nn.Module):
    """Yields NaN for every input: validation must fail it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - x - 1.0)


def nan_model() -> torch.nn.Module:
    return NaNModel().eval()


class DataDependentModel(torch.nn.Module):
    """Branches on a tensor's value: not exportable to a static graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 0:
            return x * 2
        return x - 1


def data_dependent() -> torch.nn.Module:
    return DataDependentModel().eval()


class SmallGRU(torch.nn.Module):
    """A one-layer GRU over a dynamic time axis, classifying the last step: the recurrent model a
    newcomer brings, where per-step overhead decides the figures."""

    def __init__(self, features: int = 16, hidden: int = 64, num_classes: int = 5) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(features, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def small_gru() -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallGRU().eval()
