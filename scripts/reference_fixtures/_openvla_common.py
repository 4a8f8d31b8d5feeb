"""Shared parts of the OpenVLA and OpenVLA-OFT fixture scripts (not a fixture itself: the name starts with ``_``).

The reference code is the Prismatic Hugging Face classes of the public repositories (openvla/openvla and
moojink/openvla-oft). They are read from a local git copy of each repository (``--openvla-repo`` /
``--oft-repo``; default: the copies ``fetch`` left under ``/work/.mirror``) and written into the
reference venv at build time, never into vlarl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lerobot_common import ENVS, FIXTURES, ROOT, ensure_venv, offline_env, shim_torchvision_ops  # noqa: E402,F401
from _lerobot_common import redraw as _redraw  # noqa: E402

MIRROR = Path("/work/.mirror")
REPOS = {
    "openvla": MIRROR / "openvla+openvla" / "repo",
    "oft": MIRROR / "moojink+openvla-oft" / "repo",
    "oft_transformers": MIRROR / "moojink+transformers-openvla-oft" / "repo",
}
CLONE_HINT = {
    "openvla": "git clone https://github.com/openvla/openvla",
    "oft": "git clone https://github.com/moojink/openvla-oft",
    "oft_transformers": "git clone https://github.com/moojink/transformers-openvla-oft",
}
# OpenVLA pins transformers 4.40.1 / tokenizers 0.19.1 / timm 0.9.10; torch is the local CPU build.
PINNED = ["torch==2.13.0", "transformers==4.40.1", "tokenizers==0.19.1", "huggingface-hub==0.35.3",
          "diffusers==0.35.2", "safetensors", "pyyaml", "pillow"]
NO_DEPS = ["timm==0.9.10", "torchvision==0.28.0"]  # torchvision's deps would pull a CUDA torch
SEED = 0
IMAGE = 32  # tiny image side; patch 8 -> 16 patches per tower
BOS, EMPTY = 1, 29871  # Llama-2 <s> and the empty token OpenVLA appends after "Out:"
VOCAB, PAD_MULTIPLE = 32064, 64  # Llama-2's 32000 + OpenVLA's pad to a multiple of 64


def repo_path(name: str) -> Path:
    flag = {"openvla": "--openvla-repo", "oft": "--oft-repo", "oft_transformers": "--oft-transformers-repo"}[name]
    path = Path(os.environ.get(flag.strip("-").replace("-", "_").upper(), REPOS[name]))
    if not path.exists():
        raise SystemExit(f"reference repository '{name}' not found at {path}; {CLONE_HINT[name]} and set "
                         f"{flag.strip('-').replace('-', '_').upper()}=<path>")
    return path


def read_repo_file(name: str, rel: str) -> str:
    """A file of a reference repository (a bare git copy or a checkout), at its HEAD."""
    path = repo_path(name)
    if (path / rel).is_file():
        return (path / rel).read_text()
    return subprocess.check_output(["git", f"--git-dir={path}", "show", f"HEAD:{rel}"], text=True)


def repo_commit(name: str) -> str:
    path = repo_path(name)
    git_dir = path if not (path / ".git").exists() else path / ".git"
    return subprocess.check_output(["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], text=True).strip()


def ensure_env(venv: Path, patch_llama: bool = False) -> Path:
    """Create the reference venv once; OFT's copy gets the fork's bidirectional ``modeling_llama.py``."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    ensure_venv(venv, PINNED, NO_DEPS)
    if patch_llama:
        site = subprocess.check_output(
            [str(python), "-c", "import transformers, os; print(os.path.dirname(transformers.__file__))"],
            text=True, env={**os.environ, "PYTHONPATH": ""}).strip()
        src = read_repo_file("oft_transformers", "src/transformers/models/llama/modeling_llama.py")
        (Path(site) / "models" / "llama" / "modeling_llama.py").write_text(src)
    return python


def write_reference_package(dst: Path, files: dict[str, tuple[str, str]]) -> None:
    """``files``: package path -> (repository, path in it). Every folder gets an empty ``__init__.py``."""
    for rel, (repo, src) in files.items():
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(read_repo_file(repo, src))
    for folder in [p for p in dst.rglob("*") if p.is_dir()] + [dst]:
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text("")


def run_inside(script: Path, python: Path, package_root: Path) -> int:
    return subprocess.call([str(python), str(script), "--inside"], env=offline_env(str(package_root)))


# ---- the parts below run inside the reference venv -------------------------------------------------

TINY_TOWERS = {
    # the published towers' structure (DINOv2: class + 4 register tokens, layer scale, prefix tokens without
    # position embeddings; SigLIP: no class token, attention-pool head) at tiny width/depth
    "vlarl_tiny_dinov2_reg4_patch8": dict(patch_size=8, embed_dim=16, depth=3, num_heads=2, init_values=1e-5,
                                          reg_tokens=4, no_embed_class=True),
    "vlarl_tiny_siglip_patch8": dict(patch_size=8, embed_dim=24, depth=3, num_heads=2, mlp_ratio=3.7362,
                                     class_token=False, global_pool="map"),
}


def register_tiny_towers() -> list[str]:
    """Register the tiny towers as timm models (timm builds them with its own VisionTransformer)."""
    from timm.models import register_model
    from timm.models.vision_transformer import VisionTransformer

    for name, args in TINY_TOWERS.items():
        def make(pretrained: bool = False, _args=args, **kwargs):
            for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
                kwargs.pop(key, None)
            return VisionTransformer(**dict(_args, **kwargs))

        make.__name__ = name
        register_model(make)
    return list(TINY_TOWERS)


def tiny_text_config() -> dict:
    return {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "pad_token_id": 32000, "torch_dtype": "bfloat16"}


def redraw(module, seed: int) -> None:
    """Every parameter from a seeded normal (HF init leaves biases / norms / layer scales constant); DINOv2's
    layer scales (``scale_factor``) from U(0.5, 1)."""
    _redraw(module, seed, scales=("scale_factor",))


def vla_config(config_cls, stats: dict, towers: list[str]):
    """The reference's ``OpenVLAConfig`` of the tiny fused DINOv2 + SigLIP VLA (Llama-2 vocabulary padded to 64,
    256 action bins) with ``stats`` as its norm statistics."""
    config = config_cls(
        norm_stats=stats, n_action_bins=256, vision_backbone_id="dinosiglip-vit-so-224px",
        llm_backbone_id="llama2-7b-pure", arch_specifier="no-align+fused-gelu-mlp",
        image_resize_strategy="resize-naive", text_config=tiny_text_config(),
        pad_token_id=32000, pad_to_multiple_of=PAD_MULTIPLE,
    )
    config.timm_model_ids, config.image_sizes = towers, [IMAGE, IMAGE]
    config.architectures = ["OpenVLAForActionPrediction"]
    return config


def favour_action_tokens(model, factor: float = 3.0) -> None:
    """Scale the LM-head rows of the last 256 base-vocabulary ids (the action bins) so greedy decoding over the
    whole vocabulary lands on action tokens, as in a trained OpenVLA (random rows would make every token clip)."""
    import torch

    head = model.language_model.lm_head.weight
    base = VOCAB - PAD_MULTIPLE
    with torch.no_grad():
        head[base - 256 : base] *= factor


def statistics(action_dim: int, proprio_dim: int, seed: int) -> dict:
    """Two datasets' statistics in OpenVLA's ``dataset_statistics.json`` layout (the gripper dim unmasked)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for key in ("fixture_sim", "fixture_real"):
        entry = {}
        for part, dim in (("action", action_dim), ("proprio", proprio_dim)):
            lo = rng.uniform(-2, -0.5, dim)
            hi = rng.uniform(0.5, 2, dim)
            mean = (lo + hi) / 2
            entry[part] = {"mean": mean.tolist(), "std": ((hi - lo) / 4).tolist(), "q01": lo.tolist(),
                           "q99": hi.tolist(), "min": (lo - 0.1).tolist(), "max": (hi + 0.1).tolist(),
                           "mask": [True] * (dim - 1) + [False]}
        entry["num_transitions"], entry["num_trajectories"] = 1000, 10
        out[key] = entry
    return out


def prompts(batch: int, length: int, seed: int):
    """Token ids as OpenVLA's processor makes them: <s> ... then the empty token 29871 after "Out:"."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 29000, (batch, length), generator=g)
    ids[:, 0], ids[:, -1] = BOS, EMPTY
    return ids


def raw_images(batch: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, (batch, IMAGE, IMAGE, 3), dtype=np.uint8)


def image_processor(processor_cls):
    """The reference's own image processor at the tiny resolution (DINOv2 ImageNet stats, SigLIP 0.5 / 0.5)."""
    return processor_cls(
        use_fused_vision_backbone=True, image_resize_strategy="resize-naive",
        input_sizes=[(3, IMAGE, IMAGE)] * 2, interpolations=["bicubic", "bicubic"],
        means=[(0.485, 0.456, 0.406), (0.5, 0.5, 0.5)], stds=[(0.229, 0.224, 0.225), (0.5, 0.5, 0.5)],
    )


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
