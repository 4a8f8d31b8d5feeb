"""Diffusion Policy's image encoder: a ResNet-18 trunk, spatial-softmax keypoints, a linear layer.

Written here (there is no CPU torchvision), with the module layout torchvision's ``resnet18`` has once its
pooling and classifier are cut off, so the parameter names are LeRobot's (``backbone.0`` the stem conv,
``backbone.1`` its norm, ``backbone.4`` .. ``backbone.7`` the four stages of two basic blocks each).
With ``use_group_norm`` every BatchNorm is a GroupNorm of ``channels // 16`` groups (Diffusion Policy's
choice for small batches); without it, BatchNorm with its running statistics.

Images enter as ``[N, C, H, W]`` floats (already normalized by the pre-processor); an optional resize
(bilinear, antialiased: torchvision's tensor ``Resize``) and a crop (random in training, centred at
evaluation, as LeRobot does) come first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from policies.diffusion_policy.config import DiffusionNetConfig

STAGE_WIDTHS = (64, 128, 256, 512)  # ResNet-18
BLOCKS_PER_STAGE = 2


def _norm(channels: int, group_norm: bool) -> nn.Module:
    return nn.GroupNorm(channels // 16, channels) if group_norm else nn.BatchNorm2d(channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual; a strided 1x1 projection (``downsample``) when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int, group_norm: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = _norm(c_out, group_norm)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = _norm(c_out, group_norm)
        self.downsample = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), _norm(c_out, group_norm))
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def resnet18_trunk(in_channels: int, group_norm: bool) -> nn.Sequential:
    """ResNet-18 without its average pool and classifier: ``[N, C, H, W] -> [N, 512, H/32, W/32]`` (rounded up)."""
    layers: list[nn.Module] = [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), _norm(64, group_norm),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for i, width in enumerate(STAGE_WIDTHS):
        stride = 1 if i == 0 else 2
        blocks = [BasicBlock(c_in, width, stride, group_norm)]
        blocks += [BasicBlock(width, width, 1, group_norm) for _ in range(BLOCKS_PER_STAGE - 1)]
        layers.append(nn.Sequential(*blocks))
        c_in = width
    return nn.Sequential(*layers)


def trunk_output_hw(h: int, w: int) -> tuple[int, int]:
    """The trunk's feature-map size for an ``h x w`` input: the stem (stride 2), the max-pool (stride 2) and
    three strided stages, each ``floor((n + 2p - k) / s) + 1``."""

    def conv(n: int, k: int, s: int, p: int) -> int:
        return (n + 2 * p - k) // s + 1

    def size(n: int) -> int:
        n = conv(conv(n, 7, 2, 3), 3, 2, 1)
        for _ in range(3):
            n = conv(n, 3, 2, 1)
        return n

    return size(h), size(w)


class SpatialSoftmax(nn.Module):
    """Keypoints as the expected image coordinates of a softmax over each (1x1-projected) feature map.

    ``[N, C, H, W] -> [N, K, 2]`` (x, y in [-1, 1]); ``pos_grid [H*W, 2]`` is a saved buffer, as LeRobot's."""

    def __init__(self, channels: int, h: int, w: int, num_kp: int | None):
        super().__init__()
        self._h, self._w = h, w
        self.nets = nn.Conv2d(channels, num_kp, kernel_size=1) if num_kp is not None else None
        self._out_c = num_kp if num_kp is not None else channels
        xs = torch.linspace(-1.0, 1.0, w, dtype=torch.float64)
        ys = torch.linspace(-1.0, 1.0, h, dtype=torch.float64)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        self.register_buffer("pos_grid", torch.stack([grid_x.reshape(-1), grid_y.reshape(-1)], 1).float())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.nets is not None:
            features = self.nets(features)
        attention = F.softmax(features.reshape(-1, self._h * self._w), dim=-1)
        return (attention @ self.pos_grid).view(-1, self._out_c, 2)


class RgbEncoder(nn.Module):
    """One camera image ``[N, C, H, W]`` -> a feature ``[N, 2K]`` (K = ``spatial_softmax_num_keypoints``)."""

    def __init__(self, cfg: DiffusionNetConfig):
        super().__init__()
        self.resize_shape = list(cfg.resize_shape) if cfg.resize_shape is not None else None
        self.crop_shape = list(cfg.crop_shape) if cfg.crop_shape is not None else None
        self.crop_is_random = cfg.crop_is_random
        self.backbone = resnet18_trunk(cfg.image_shape[0], cfg.use_group_norm)
        h, w = trunk_output_hw(*cfg.encoder_input_hw)
        kp = cfg.spatial_softmax_num_keypoints
        self.pool = SpatialSoftmax(STAGE_WIDTHS[-1], h, w, kp)
        self.feature_dim = kp * 2
        self.out = nn.Linear(kp * 2, self.feature_dim)
        self.relu = nn.ReLU()

    def _crop(self, x: torch.Tensor) -> torch.Tensor:
        ch, cw = self.crop_shape
        H, W = x.shape[-2:]
        if self.training and self.crop_is_random:
            top = int(torch.randint(0, H - ch + 1, ()).item())
            left = int(torch.randint(0, W - cw + 1, ()).item())
        else:  # torchvision's CenterCrop offsets
            top, left = int(round((H - ch) / 2.0)), int(round((W - cw) / 2.0))
        return x[..., top:top + ch, left:left + cw]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.resize_shape is not None:
            x = F.interpolate(x, size=self.resize_shape, mode="bilinear", align_corners=False, antialias=True)
        if self.crop_shape is not None:
            x = self._crop(x)
        x = torch.flatten(self.pool(self.backbone(x)), start_dim=1)
        return self.relu(self.out(x))
