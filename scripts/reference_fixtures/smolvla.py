"""SmolVLA parity fixture, made by LeRobot 0.4.4's own classes in an environment of their own.

    python scripts/reference_fixtures/smolvla.py        (or: scripts/make_reference_fixtures.py smolvla)

Creates ``.reference-envs/smolvla`` (lerobot 0.4.4 --no-deps on stock transformers 4.57.6, torchvision
0.28.0 --no-deps with an operator-schema shim; see /work/shared/REFERENCES.md), then re-runs itself
inside it. There it writes, under ``tests/fixtures/reference/smolvla/``:

* ``checkpoint/`` (published settings) and ``variant/`` (the other reference paths): a tiny random-weight SmolVLA saved by LeRobot itself (config.json,
  model.safetensors, policy_preprocessor*/policy_postprocessor* with MEAN_STD statistics) and
  ``checkpoint/vlm/``: the tiny SmolVLM config + processor + tokenizer the config points at;
* ``<name>/io.safetensors``: raw observations, the model-level inputs LeRobot's pre-processing made from
  them, the noise, every denoising step's velocity, the normalized padded chunk and the final actions;
* ``<name>/io.json``: the task strings and the versions used.

All parameters are redrawn from a seed (default HF init leaves biases and norm scales constant).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lerobot_common as common  # noqa: E402

VENV = common.ENVS / "smolvla"
OUT = common.FIXTURES / "smolvla"
PINNED = [
    "torch==2.13.0", "transformers==4.57.6", "huggingface-hub==0.35.3", "diffusers==0.35.2",
    "datasets>=4.8,<4.9", "accelerate", "draccus==0.10.0", "einops", "pillow", "imageio", "pyserial",
    "deepdiff", "av", "num2words", "packaging", "safetensors", "jsonlines", "termcolor",
]
NO_DEPS = ["lerobot==0.4.4", "torchvision==0.28.0"]
SEED = 0
TASKS = ["pick up the red cube", "open the top drawer slowly"]


def ensure_env() -> Path:
    """This fixture's venv (made once); its python."""
    return common.ensure_venv(VENV, PINNED, NO_DEPS)


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges (any string tokenizes) with SmolVLM's extra tokens."""
    from transformers import PreTrainedTokenizerFast

    tok = common.byte_level_bpe([])
    extra = {
        "fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
        "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
        "video_token": "<video>",
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", extra_special_tokens=extra
    )
    fast.add_tokens(list(extra.values()), special_tokens=True)
    return fast


def write_vlm(folder: Path, width: int, heads: int, kv_heads: int) -> None:
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    tok = byte_tokenizer()
    config = SmolVLMConfig(
        scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "patch_size": 8, "image_size": 32},
        text_config={"model_type": "llama", "hidden_size": width, "intermediate_size": 2 * width,
                     "num_hidden_layers": 6, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                     "head_dim": 8, "vocab_size": len(tok),
                     "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "tie_word_embeddings": False,
                     "pad_token_id": tok.pad_token_id},
    )
    size = {"longest_edge": 32}
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(do_image_splitting=False, size=size, max_image_size=size),
        tokenizer=tok, video_processor=SmolVLMVideoProcessor(), image_seq_len=4,
    )
    config.save_pretrained(folder)
    processor.save_pretrained(folder)


VARIANTS = {
    # published SmolVLA settings (chunk 50, 10 steps, dims padded to 32, expert interleaving SA/CA every 2)
    # on a 6-layer VLM cut to 4; two cameras of different aspect ratios
    "checkpoint": dict(
        vlm=(24, 3, 1), cameras={"observation.images.top": (3, 24, 40), "observation.images.wrist": (3, 32, 32)},
        state_dim=6, action_dim=5, config={},
    ),
    # the other reference paths: image special tokens, an expert of half the depth (SA at VLM layer 0, CA
    # at layer 2), an empty (absent) camera, a prefix padded to a fixed length, language padded to max_length
    "variant": dict(
        vlm=(16, 2, 1), cameras={"observation.images.top": (3, 32, 24)}, state_dim=4, action_dim=3,
        config=dict(add_image_special_tokens=True, num_expert_layers=2, self_attn_every_n_layers=4,
                    empty_cameras=1, prefix_length=48, pad_language_to="max_length", chunk_size=8,
                    n_action_steps=8, num_steps=5, max_state_dim=8, max_action_dim=8),
    ),
}


def build(name: str, vlm: tuple[int, int, int], cameras: dict, state_dim: int, action_dim: int, config: dict) -> None:
    import torch
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors

    torch.manual_seed(SEED)
    ckpt = OUT / name
    ckpt.mkdir(parents=True, exist_ok=True)
    write_vlm(ckpt / "vlm", *vlm)
    os.chdir(ckpt)  # the config records vlm_model_name="vlm", relative to the checkpoint
    config = SmolVLAConfig(
        vlm_model_name="vlm", load_vlm_weights=False, device="cpu", num_vlm_layers=4,
        resize_imgs_with_padding=(32, 32), tokenizer_max_length=16,
        **common.policy_features(cameras, state_dim, action_dim), **config,
    )
    policy = SmolVLAPolicy(config)
    common.redraw(policy, SEED)
    policy.eval()
    g = torch.Generator().manual_seed(SEED + 1)
    stats = {
        "observation.state": {"mean": torch.randn(state_dim, generator=g),
                              "std": 0.5 + torch.rand(state_dim, generator=g)},
        "action": {"mean": torch.randn(action_dim, generator=g), "std": 0.5 + torch.rand(action_dim, generator=g)},
    }
    pre, post = make_smolvla_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(ckpt)
    pre.save_pretrained(ckpt)
    post.save_pretrained(ckpt)

    raw = common.raw_batch(cameras, state_dim, g)
    noise = torch.randn(common.BATCH, config.chunk_size, config.max_action_dim, generator=g)
    processed = pre({**{k: v.clone() for k, v in raw.items()}, "task": list(TASKS)})

    velocities = common.record_denoise_steps(policy)
    images, img_masks = policy.prepare_images(processed)
    state = policy.prepare_state(processed)
    with torch.no_grad():
        chunk = policy.model.sample_actions(
            images, img_masks, processed["observation.language.tokens"],
            processed["observation.language.attention_mask"], state, noise=noise.clone(),
        )
        velocities_model = torch.stack(velocities)
        velocities.clear()
        policy.reset()
        normalized = policy.predict_action_chunk(processed, noise=noise.clone())
        actions = post(normalized)
    model_inputs = {"images": images, "image_masks": img_masks, "tokens": processed["observation.language.tokens"],
                    "token_mask": processed["observation.language.attention_mask"], "state": state}
    outputs = {"noise": noise, "velocities": velocities_model, "chunk": chunk, "actions": actions}
    common.write_io(ckpt, raw, model_inputs, outputs, {"tasks": TASKS, "cameras": list(cameras), "seed": SEED})
    print(f"[smolvla] wrote {ckpt}: actions {tuple(actions.shape)}, chunk |max| {chunk.abs().max():.3f}")


def main() -> int:
    if "--inside" in sys.argv:
        import torch

        common.shim_torchvision_ops()
        torch.set_num_threads(1)
        for name, spec in VARIANTS.items():
            build(name, **spec)
        return 0
    python = ensure_env()
    return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside"], env=common.offline_env())


if __name__ == "__main__":
    raise SystemExit(main())
