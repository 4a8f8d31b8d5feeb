"""Prismatic's vision side (OpenVLA / OpenVLA-OFT): timm ViT towers, the fused DINOv2 + SigLIP backbone, the
fused GELU MLP projector. Written here from the reference's description; parameter names are timm's (with
OpenVLA's ``ls*.scale_factor`` for layer scale) so an OpenVLA checkpoint loads key for key.

Each tower returns the patch tokens of its **second-to-last** block (prefix tokens dropped, no final norm),
as OpenVLA's ``get_intermediate_layers(n={depth - 2})`` does; the last block, the final norm and SigLIP's
attention-pool head are in the checkpoint but not in the computation (kept, so loading is 0 missing / 0 unused).

    pixel_values [B, 6 * num_images, S, S] (per image: DINOv2-normalized RGB, then SigLIP-normalized RGB)
      -> patches [B, num_images * N, D_dino + D_siglip] -> projector -> [B, num_images * N, llm_dim]

FiLM (OpenVLA-OFT+, ``film_dim`` > 0): every block of both towers gets ``scale`` / ``shift`` projections of the
average language embedding [B, film_dim] and modulates the residual stream between attention and MLP,
``x <- (1 + scale(lang)) * x + shift(lang)`` (the same gamma / beta for every token: spatially global, as in
OFT's ``FiLMedVisionTransformerBlock``). The names are OFT's without its wrapper levels:
``vision_backbone.featurizer.blocks.0.block.attn.qkv`` / ``...blocks.0.scale`` load as
``featurizer.blocks.0.attn.qkv`` / ``featurizer.blocks.0.scale``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIGLIP_MEAN, SIGLIP_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ViTSpec:
    """The structure of one timm ViT (what its model id implies)."""

    patch: int
    width: int
    depth: int
    heads: int
    mlp_hidden: int
    class_token: bool = True
    reg_tokens: int = 0
    layer_scale: bool = False  # DINOv2's per-channel residual scale
    no_embed_class: bool = False  # position embeddings on patches only (prefix tokens added after)
    attn_pool: bool = False  # SigLIP's attention-pool head ("map")


# timm model ids (pretrained tag dropped) -> structure. The tiny ones are the same families at test size
# (built by the reference's own timm in scripts/reference_fixtures/_openvla_common.py).
TIMM_VITS: dict[str, ViTSpec] = {
    "vit_large_patch14_reg4_dinov2": ViTSpec(14, 1024, 24, 16, 4096, reg_tokens=4, layer_scale=True,
                                             no_embed_class=True),
    "vit_so400m_patch14_siglip_224": ViTSpec(14, 1152, 27, 16, 4304, class_token=False, attn_pool=True),
    "vit_so400m_patch14_siglip_384": ViTSpec(14, 1152, 27, 16, 4304, class_token=False, attn_pool=True),
    "vlarl_tiny_dinov2_reg4_patch8": ViTSpec(8, 16, 3, 2, 64, reg_tokens=4, layer_scale=True, no_embed_class=True),
    "vlarl_tiny_siglip_patch8": ViTSpec(8, 24, 3, 2, 89, class_token=False, attn_pool=True),
}
DINO_IDS = ("vit_large_patch14_reg4_dinov2", "vlarl_tiny_dinov2_reg4_patch8")


def vit_spec(timm_id: str) -> ViTSpec:
    name = timm_id.split(".")[0]
    if name not in TIMM_VITS:
        raise ValueError(f"vision tower '{timm_id}' is not one this module builds; known: {sorted(TIMM_VITS)}")
    return TIMM_VITS[name]


def image_stats(timm_id: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) the tower was trained with: ImageNet for DINOv2, 0.5 / 0.5 for SigLIP."""
    return (IMAGENET_MEAN, IMAGENET_STD) if timm_id.split(".")[0] in DINO_IDS else (SIGLIP_MEAN, SIGLIP_STD)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale_factor = nn.Parameter(torch.ones(dim))  # timm's ``gamma``, renamed as OpenVLA saves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    """A pre-norm ViT block; with ``film_dim`` > 0 also OFT's FiLM between its attention and MLP halves."""

    def __init__(self, spec: ViTSpec, film_dim: int = 0):
        super().__init__()
        d = spec.width
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn, self.mlp = Attention(d, spec.heads), Mlp(d, spec.mlp_hidden)
        self.ls1 = LayerScale(d) if spec.layer_scale else nn.Identity()
        self.ls2 = LayerScale(d) if spec.layer_scale else nn.Identity()
        # FiLM's gamma and beta from the language average: [B, film_dim] -> [B, width]
        self.scale = nn.Linear(film_dim, d) if film_dim else None
        self.shift = nn.Linear(film_dim, d) if film_dim else None

    def forward(self, x: torch.Tensor, language: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        if self.scale is not None:  # "1 +": zero-initialised projections start as the identity
            x = x * (1 + self.scale(language)[:, None]) + self.shift(language)[:, None]
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(3, width, patch, patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class AttentionPool(nn.Module):
    """SigLIP's attention-pool head (timm ``attn_pool``): in the checkpoint, unused by OpenVLA's features."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        d = spec.width
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        self.q, self.kv, self.proj = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.norm, self.mlp = nn.LayerNorm(d, eps=1e-6), Mlp(d, spec.mlp_hidden)


class TimmViT(nn.Module):
    """A timm ``VisionTransformer`` with OpenVLA's feature rule: [B, 3, S, S] -> [B, (S / patch)^2, width]."""

    def __init__(self, spec: ViTSpec, image_size: int, film_dim: int = 0):
        super().__init__()
        self.spec = spec
        n = (image_size // spec.patch) ** 2
        self.num_patches = n
        self.num_prefix = int(spec.class_token) + spec.reg_tokens
        self.patch_embed = PatchEmbed(spec.patch, spec.width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.width)) if spec.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, spec.width)) if spec.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, n if spec.no_embed_class else n + self.num_prefix, spec.width))
        self.blocks = nn.ModuleList(Block(spec, film_dim) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(spec.width, eps=1e-6)
        self.attn_pool = AttentionPool(spec) if spec.attn_pool else None

    def forward(self, x: torch.Tensor, language: torch.Tensor | None = None) -> torch.Tensor:
        """``language`` [B, film_dim]: the average language embedding (FiLM towers only)."""
        x = self.patch_embed(x)
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.spec.no_embed_class:
            x = torch.cat([*prefix, x + self.pos_embed], 1)
        else:
            x = torch.cat([*prefix, x], 1) + self.pos_embed
        for block in self.blocks[: len(self.blocks) - 1]:  # through block depth - 2
            x = block(x, language)
        return x[:, self.num_prefix :]


class PrismaticVisionBackbone(nn.Module):
    """``featurizer`` (DINOv2) and, when fused, ``fused_featurizer`` (SigLIP), concatenated per patch.

    ``num_images`` images are stacked along channels (6 each when fused) and along patches in the output.
    ``film_dim`` > 0 (the LLM width) gives both towers FiLM blocks; ``forward`` then needs the language average."""

    def __init__(self, timm_ids: list[str], image_sizes: list[int], num_images: int = 1, film_dim: int = 0):
        super().__init__()
        self.fused = len(timm_ids) == 2
        self.film, self.film_dim = film_dim > 0, film_dim
        self.featurizer = TimmViT(vit_spec(timm_ids[0]), image_sizes[0], film_dim)
        self.fused_featurizer = TimmViT(vit_spec(timm_ids[1]), image_sizes[1], film_dim) if self.fused else None
        self.embed_dim = sum(t.spec.width for t in (self.featurizer, self.fused_featurizer) if t is not None)
        self.num_images = num_images
        self.channels = 6 if self.fused else 3

    @property
    def num_patches(self) -> int:
        """Patch tokens of all images together."""
        return self.featurizer.num_patches * self.num_images

    def film_parameters(self) -> list[nn.Parameter]:
        """Every block's FiLM ``scale`` / ``shift`` maps (none without FiLM): what OFT+ trains with the towers frozen."""
        return [p for name, p in self.named_parameters() if name.split(".")[-2] in ("scale", "shift")]

    def forward(self, pixel_values: torch.Tensor, language: torch.Tensor | None = None) -> torch.Tensor:
        """``language`` [B, film_dim]: the average language embedding, given exactly when the towers have FiLM."""
        if self.film != (language is not None):
            raise ValueError("the vision backbone "
                             + ("has FiLM and needs the average language embedding" if self.film else
                                "has no FiLM; pass no language embedding (or build it with use_film=True)"))
        if pixel_values.shape[1] != self.channels * self.num_images:
            raise ValueError(f"pixel_values has {pixel_values.shape[1]} channels; {self.num_images} image(s) of "
                             f"{self.channels} channels each were expected")
        out = []
        for img in pixel_values.split(self.channels, dim=1):
            if not self.fused:
                out.append(self.featurizer(img, language))
                continue
            a, b = img.split(3, dim=1)
            out.append(torch.cat([self.featurizer(a, language), self.fused_featurizer(b, language)], 2))
        return torch.cat(out, 1)


class PrismaticProjector(nn.Module):
    """Vision features -> LLM width: fc1 -> GELU -> fc2 (-> GELU -> fc3 when fused, hidden 4 x vision dim)."""

    def __init__(self, fused: bool, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1, self.fc2 = nn.Linear(vision_dim, 4 * vision_dim), nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1, self.fc2 = nn.Linear(vision_dim, llm_dim), nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc2(F.gelu(self.fc1(x)))
        return self.fc3(F.gelu(x)) if self.fused else x


def pixel_values(images: torch.Tensor, timm_ids: list[str], image_size: int) -> torch.Tensor:
    """Camera images [B, H, W, 3] uint8 (or [B, 3, H, W] floats in [0, 1]) -> one image's channels [B, 3k, S, S].

    Each tower gets the image normalized with its own statistics (k = number of towers). Images already at
    ``S x S`` match OpenVLA's processor exactly; others are resized with antialiased bicubic interpolation
    (OpenVLA resizes with PIL, which differs by a few grey levels)."""
    x = images.permute(0, 3, 1, 2) if images.shape[-1] == 3 and images.shape[1] != 3 else images
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="bicubic", antialias=True,
                          align_corners=False).clamp(0, 1)
    out = []
    for tid in timm_ids:
        mean, std = (torch.tensor(v, dtype=x.dtype, device=x.device).view(1, 3, 1, 1) for v in image_stats(tid))
        out.append((x - mean) / std)
    return torch.cat(out, 1)
