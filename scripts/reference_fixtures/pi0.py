"""pi0 and pi0.5 parity fixtures, made by LeRobot 0.4.4's own classes in an environment of their own.

    python scripts/reference_fixtures/pi0.py [pi0] [pi05] [--openpi DIR]   (default: pi0)
    python scripts/make_reference_fixtures.py pi0 pi05                     (pi05.py runs this with "pi05")

Creates ``.reference-envs/pi0``: lerobot 0.4.4 (--no-deps) on transformers 4.53.2 with openpi's
``transformers_replace`` files copied over the installed package, as openpi's README instructs (pi0 /
pi0.5 refuse stock transformers), and torchvision 0.28.0 --no-deps with an operator-schema shim (see
/work/shared/REFERENCES.md). ``--openpi`` (or ``$OPENPI_SRC``) is an openpi checkout or its git
directory. The script then re-runs itself inside the venv and writes, per policy type, under
``tests/fixtures/reference/{pi0,pi05}/``:

* ``checkpoint/``: a tiny random-weight policy saved by LeRobot itself (config.json, model.safetensors,
  policy_preprocessor*/policy_postprocessor* with MEAN_STD (pi0) or QUANTILES (pi0.5) statistics);
  ``checkpoint/tokenizer/``: the tiny offline tokenizer its pre-processor names (in place of the
  PaliGemma tokenizer's hub id); ``checkpoint/tiny_dims.json``: the widths (config.json names only the
  Gemma variants, whose published sizes LeRobot reads from code);
* ``checkpoint/io.safetensors``: raw observations, the model-level inputs LeRobot's pre-processing made,
  the noise, every denoising step's velocity, the normalized padded chunk and the final actions;
* ``checkpoint/io.json``: the task strings and the versions used.

Tiny sizes are set by replacing, for the build only, LeRobot's ``get_gemma_config`` and the PaliGemma /
Gemma constructors it calls (vocabulary, SigLIP widths); every forward pass is LeRobot's and openpi's own
code. All parameters are redrawn from a seed (default HF init leaves biases and norm scales constant).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lerobot_common as common  # noqa: E402

VENV = common.ENVS / "pi0"
OUT = common.FIXTURES
PINNED = [
    "torch==2.13.0", "transformers==4.53.2", "tokenizers==0.21.4", "huggingface-hub==0.35.3", "diffusers==0.35.2",
    "datasets>=4.8,<4.9", "accelerate", "draccus==0.10.0", "einops", "pillow", "imageio", "pyserial",
    "deepdiff", "av", "packaging", "safetensors", "jsonlines", "termcolor",
]
NO_DEPS = ["lerobot==0.4.4", "torchvision==0.28.0"]
REPLACE = "src/openpi/models_pytorch/transformers_replace"
REPLACED = [
    "models/gemma/configuration_gemma.py", "models/gemma/modeling_gemma.py",
    "models/paligemma/modeling_paligemma.py", "models/siglip/check.py", "models/siglip/modeling_siglip.py",
]
DEFAULT_OPENPI = Path("/work/.mirror/Physical-Intelligence+openpi/repo")
SEED = 0
TASKS = ["pick up the red cube", "open_the top drawer slowly"]

# The tiny widths (8 heads and one head_dim shared by both stacks, as the joint attention needs; the
# SigLIP projection equals the VLM width). Kept beside each checkpoint in tiny_dims.json.
TINY = {
    "vlm": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "expert": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "patch_size": 8},
    "vocab_size": 264,
}

VARIANTS = {
    # pi0: two cameras (one needing resize-with-pad), one empty camera slot, MEAN_STD, chunk 6 / 4 steps
    "pi0": dict(
        cameras={"observation.images.base": (3, 24, 40), "observation.images.wrist": (3, 32, 32)},
        state_dim=6, action_dim=5,
        config=dict(chunk_size=6, n_action_steps=6, num_inference_steps=4, max_state_dim=8, max_action_dim=8,
                    image_resolution=(32, 32), tokenizer_max_length=24, empty_cameras=1),
    ),
    # pi0.5: one camera, QUANTILES, state discretized into the prompt, published chunk/steps/padding
    "pi05": dict(
        cameras={"observation.images.base": (3, 32, 32)},
        state_dim=4, action_dim=3,
        config=dict(image_resolution=(32, 32)),
    ),
}


def openpi_file(src: Path, rel: str) -> bytes:
    """One file of openpi's tree, from a checkout or (``git show``) its git directory."""
    if (src / rel).is_file():
        return (src / rel).read_bytes()
    return subprocess.check_output(["git", "--git-dir", str(src), "show", f"HEAD:{rel}"])


def openpi_commit(src: Path) -> str:
    git = ["git", "--git-dir", str(src)] if not (src / ".git").exists() else ["git", "-C", str(src)]
    try:
        return subprocess.check_output([*git, "rev-parse", "HEAD"], text=True).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def ensure_env(openpi: Path) -> Path:
    """The venv (made once), with openpi's ``transformers_replace`` files copied over its transformers."""
    python = common.ensure_venv(VENV, PINNED, NO_DEPS)
    site = subprocess.check_output(
        [str(python), "-c", "import os, transformers; print(os.path.dirname(transformers.__file__))"],
        text=True, env={**os.environ, "PYTHONPATH": ""},
    ).strip()
    for rel in REPLACED:
        Path(site, rel).write_bytes(openpi_file(openpi, f"{REPLACE}/{rel}"))
    return python


def write_tokenizer(folder: Path) -> int:
    """A byte-level BPE tokenizer without merges that prepends <bos> like PaliGemma's; returns its size."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = common.byte_level_bpe(["<pad>", "<eos>", "<bos>", "<unk>"], unk_token="<unk>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")
    fast.save_pretrained(folder)
    return len(fast)


def tiny_builders(module) -> None:
    """Point one LeRobot modeling module's Gemma sizes and PaliGemma/Gemma constructors at TINY."""
    import transformers

    def gemma_config(variant: str):
        return module.GemmaConfig(**TINY["expert" if variant == "gemma_300m" else "vlm"])

    def paligemma(config):
        config.text_config.vocab_size = TINY["vocab_size"]
        config._vocab_size = TINY["vocab_size"]  # noqa: SLF001
        for k, v in TINY["vision"].items():
            setattr(config.vision_config, k, v)
        config.vision_config.projection_dim = config.text_config.hidden_size
        return transformers.PaliGemmaForConditionalGeneration(config)

    def gemma(config):
        config.vocab_size = TINY["vocab_size"]
        return transformers.GemmaForCausalLM(config)

    module.get_gemma_config = gemma_config
    module.PaliGemmaForConditionalGeneration = paligemma
    module.GemmaForCausalLM = gemma


def tokenizer_from_folder(processor_module, folder: str) -> None:
    """LeRobot's pre-processor names the PaliGemma tokenizer's hub id; give it the local tiny one instead."""
    step = processor_module.TokenizerProcessorStep

    def local(**kw):
        kw["tokenizer_name"] = folder
        return step(**kw)

    processor_module.TokenizerProcessorStep = local


def redraw(module, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.ndim == 1 and "norm" in name and "dense" not in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))  # Gemma scales by (1 + w); SigLIP LN by w
                if "vision" in name and name.endswith("weight"):
                    p.add_(1.0)
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def build(kind: str, cameras: dict, state_dim: int, action_dim: int, config: dict, openpi: str) -> None:
    import torch

    if kind == "pi0":
        from lerobot.policies.pi0 import modeling_pi0 as modeling
        from lerobot.policies.pi0 import processor_pi0 as processing
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config

        policy_cls, make_processors = modeling.PI0Policy, processing.make_pi0_pre_post_processors
    else:
        from lerobot.policies.pi05 import modeling_pi05 as modeling
        from lerobot.policies.pi05 import processor_pi05 as processing
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config

        policy_cls, make_processors = modeling.PI05Policy, processing.make_pi05_pre_post_processors
    tiny_builders(modeling)
    tokenizer_from_folder(processing, "tokenizer")

    torch.manual_seed(SEED)
    ckpt = OUT / kind / "checkpoint"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    ckpt.mkdir(parents=True)
    vocab = write_tokenizer(ckpt / "tokenizer")
    assert vocab <= TINY["vocab_size"], vocab
    (ckpt / "tiny_dims.json").write_text(json.dumps(TINY, indent=2) + "\n")
    os.chdir(ckpt)  # the pre-processor records tokenizer_name="tokenizer", relative to the checkpoint
    cfg = Config(device="cpu", dtype="float32", **common.policy_features(cameras, state_dim, action_dim), **config)
    policy = policy_cls(cfg)
    redraw(policy, SEED)
    policy.eval()
    g = torch.Generator().manual_seed(SEED + 1)

    def feature_stats(dim: int) -> dict:
        lo = -1.0 - torch.rand(dim, generator=g)
        return {"mean": torch.randn(dim, generator=g), "std": 0.5 + torch.rand(dim, generator=g),
                "q01": lo, "q99": lo + 1.0 + 2.0 * torch.rand(dim, generator=g),
                "min": lo - 0.5, "max": lo + 4.0}

    stats = {"observation.state": feature_stats(state_dim), "action": feature_stats(action_dim)}
    pre, post = make_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(ckpt)
    pre.save_pretrained(ckpt)
    post.save_pretrained(ckpt)

    raw = common.raw_batch(cameras, state_dim, g, state_scale=0.8)
    noise = torch.randn(common.BATCH, cfg.chunk_size, cfg.max_action_dim, generator=g)
    processed = pre({**{k: v.clone() for k, v in raw.items()}, "task": list(TASKS)})

    velocities = common.record_denoise_steps(policy)
    images, img_masks = policy._preprocess_images(processed)  # noqa: SLF001
    tokens, token_mask = processed["observation.language.tokens"], processed["observation.language.attention_mask"]
    state = modeling.pad_vector(processed["observation.state"], cfg.max_state_dim)
    with torch.no_grad():
        if kind == "pi0":
            chunk = policy.model.sample_actions(images, img_masks, tokens, token_mask, state, noise=noise.clone())
        else:
            chunk = policy.model.sample_actions(images, img_masks, tokens, token_mask, noise=noise.clone())
        velocities_model = torch.stack(velocities)
        velocities.clear()
        policy.reset()
        normalized = policy.predict_action_chunk(processed, noise=noise.clone())
        actions = post(normalized)
    assert torch.equal(normalized, chunk[:, :, :action_dim])
    model_inputs = {"images": images, "image_masks": img_masks, "tokens": tokens, "token_mask": token_mask,
                    "state": state}
    outputs = {"noise": noise, "velocities": velocities_model, "chunk": chunk, "actions": actions}
    common.write_io(ckpt, raw, model_inputs, outputs, {"tasks": TASKS, "cameras": list(cameras), "seed": SEED,
                                                       "policy": kind,
                                                       "versions": {"openpi_transformers_replace": openpi}})
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    print(f"[{kind}] wrote {ckpt} ({size / 1e3:.0f} kB): actions {tuple(actions.shape)}, "
          f"chunk |max| {chunk.abs().max():.3f}")


def main() -> int:
    args = sys.argv[1:]
    if "--inside" in args:
        import torch

        common.shim_torchvision_ops()
        torch.set_num_threads(1)
        commit = args[args.index("--inside") + 1]
        kinds = [a for a in args if a in VARIANTS]
        for kind in kinds:
            build(kind, **VARIANTS[kind], openpi=commit)
        return 0
    openpi = Path(args[args.index("--openpi") + 1]) if "--openpi" in args else Path(
        os.environ.get("OPENPI_SRC", DEFAULT_OPENPI))
    if not openpi.exists():
        print(f"pi0 fixtures: error: openpi source {openpi} not found; pass --openpi <openpi checkout or git dir>",
              file=sys.stderr)
        return 2
    python = ensure_env(openpi)
    kinds = [a for a in args if a in VARIANTS] or ["pi0"]
    return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", openpi_commit(openpi), *kinds],
                           env=common.offline_env())


if __name__ == "__main__":
    raise SystemExit(main())
