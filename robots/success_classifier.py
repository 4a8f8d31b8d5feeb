"""A tiny CNN that says whether a camera frame shows the task done: the success signal of a real arm.

``scripts/train_success_classifier.py`` trains it from labelled episodes (frames of successful episodes near
their end = positive, the rest negative) and saves ``classifier.pt`` (weights + config); ``robots.rewards``
loads it with ``load_classifier`` and thresholds ``probability(frame)``. Input: uint8 ``[B, H, W, 3]``,
resized to ``image_size``; output: success logits ``[B]``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ClassifierConfig:
    image_size: int = 64
    channels: list[int] = field(default_factory=lambda: [16, 32, 32])


class SuccessClassifier(nn.Module):
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.cfg = cfg
        layers: list[nn.Module] = []
        c_in = 3
        for c in cfg.channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.ReLU()]
            c_in = c
        self.conv = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """frames: uint8 [B, H, W, 3] -> logits [B]."""
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"success classifier frames must be uint8 [B, H, W, 3], got {tuple(frames.shape)}")
        x = torch.as_tensor(frames).permute(0, 3, 1, 2).float() / 255.0
        x = F.interpolate(x, size=(self.cfg.image_size, self.cfg.image_size), mode="bilinear", align_corners=False)
        return self.head(self.conv(x - 0.5).mean(dim=(2, 3))).squeeze(-1)

    @torch.no_grad()
    def probability(self, frames: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self(frames))

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, tmp)
        os.replace(tmp, path)
        return path


def load_classifier(path: str | os.PathLike) -> SuccessClassifier:
    if not Path(path).is_file():
        raise FileNotFoundError(f"success classifier '{path}' not found; train one with "
                                "scripts/train_success_classifier.py and set robot.hil.reward.classifier_path")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = SuccessClassifier(ClassifierConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    return model.eval()
