"""OpenVLA parity fixture, made by OpenVLA's own Hugging Face classes in an environment of their own.

    python scripts/reference_fixtures/openvla.py        (or: scripts/make_reference_fixtures.py openvla)

Creates ``.reference-envs/openvla`` (transformers 4.40.1, tokenizers 0.19.1, timm 0.9.10 as OpenVLA pins
them; torchvision 0.28.0 --no-deps with an operator-schema shim, see /work/shared/REFERENCES.md), writes
OpenVLA's ``prismatic/extern/hf/*_prismatic.py`` (from a local copy of github.com/openvla/openvla, see
``_openvla_common.py``) into it, then re-runs itself inside. There it builds a tiny random-weight
``OpenVLAForActionPrediction`` (fused DINOv2 + SigLIP timm towers at tiny width, the fused GELU MLP
projector, a 2-layer Llama with Llama-2's 32064-row vocabulary) and writes ``tests/fixtures/reference/openvla/``:

* ``checkpoint/``: ``save_pretrained`` output in bfloat16 like the published checkpoints (config.json with
  ``norm_stats``, model.safetensors), ``dataset_statistics.json`` and the image processor's
  ``preprocessor_config.json``; the model used for the outputs below is this folder reloaded in fp32;
* ``io.safetensors``: raw images, the processor's pixel values, prompt ids, the greedy action tokens of
  ``generate``, the logits of one teacher-forced pass at the 7 action positions (last 320 vocabulary
  columns: the 256 action ids and the 64 padding rows, plus the log-sum-exp over the whole vocabulary)
  and ``predict_action``'s un-normalized actions per ``unnorm_key``;
* ``io.json``: unnorm keys, versions and the reference commit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _openvla_common as common  # noqa: E402

VENV = common.ENVS / "openvla"
OUT = common.FIXTURES / "openvla"
FILES = {f"openvla_hf/{n}_prismatic.py": ("openvla", f"prismatic/extern/hf/{n}_prismatic.py")
         for n in ("configuration", "modeling", "processing")}
ACTION_DIM, PROMPT_LEN, BATCH = 7, 6, 2
UNNORM = ["fixture_sim", "fixture_real"]  # sample b is decoded with UNNORM[b]


def build() -> None:
    import numpy as np
    import timm
    import torch
    import transformers
    from openvla_hf.configuration_prismatic import OpenVLAConfig
    from openvla_hf.modeling_prismatic import OpenVLAForActionPrediction
    from openvla_hf.processing_prismatic import PrismaticImageProcessor
    from PIL import Image
    from safetensors.torch import save_file

    towers = common.register_tiny_towers()
    stats = common.statistics(ACTION_DIM, 8, common.SEED)
    config = common.vla_config(OpenVLAConfig, stats, towers)
    torch.manual_seed(common.SEED)
    model = OpenVLAForActionPrediction(config)
    common.redraw(model, common.SEED)
    common.favour_action_tokens(model)
    ckpt = OUT / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(ckpt)
    common.write_json(ckpt / "dataset_statistics.json", stats)
    processor = common.image_processor(PrismaticImageProcessor)
    processor.save_pretrained(ckpt)

    model = OpenVLAForActionPrediction.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    raw = common.raw_images(BATCH, common.SEED + 1)
    pixel_values = processor([Image.fromarray(im) for im in raw], return_tensors="pt")["pixel_values"]
    ids = common.prompts(BATCH, PROMPT_LEN, common.SEED + 2)
    mask = torch.ones_like(ids)

    tokens, actions = [], []
    with torch.no_grad():
        for b in range(BATCH):
            one = dict(pixel_values=pixel_values[b : b + 1], attention_mask=mask[b : b + 1])
            gen = model.generate(ids[b : b + 1], max_new_tokens=ACTION_DIM, do_sample=False, **one)
            tokens.append(gen[0, -ACTION_DIM:])
            actions.append(torch.as_tensor(np.asarray(
                model.predict_action(ids[b : b + 1], unnorm_key=UNNORM[b], do_sample=False, **one))))
        tokens = torch.stack(tokens)
        full = torch.cat([ids, tokens], 1)
        logits = model(input_ids=full, attention_mask=torch.ones_like(full), pixel_values=pixel_values).logits
        at_actions = logits[:, -ACTION_DIM - 1 : -1].float()
    base = common.VOCAB - common.PAD_MULTIPLE
    in_range = ((tokens >= base - 256) & (tokens < base)).float().mean().item()
    tensors = {
        "raw_images": torch.as_tensor(raw), "pixel_values": pixel_values, "input_ids": ids,
        "action_tokens": tokens, "action_logits_tail": at_actions[..., base - 256 :].contiguous(),
        "action_logsumexp": at_actions.logsumexp(-1), "actions": torch.stack(actions).float(),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / "io.safetensors"))
    common.write_json(OUT / "io.json", {
        "unnorm_keys": UNNORM, "seed": common.SEED, "logits_tail_from": base - 256,
        "reference": {"repository": "openvla/openvla", "commit": common.repo_commit("openvla"),
                      "files": sorted(v[1] for v in FILES.values())},
        "versions": {"transformers": transformers.__version__, "timm": timm.__version__,
                     "torch": torch.__version__},
    })
    print(f"[openvla] wrote {OUT}: action tokens {tokens.tolist()} ({in_range:.0%} on action ids), "
          f"actions {tuple(torch.stack(actions).shape)}")


def main() -> int:
    if "--inside" in sys.argv:
        import torch

        common.shim_torchvision_ops()
        torch.set_num_threads(1)
        build()
        return 0
    python = common.ensure_env(VENV)
    package_root = VENV / "reference_code"
    common.write_reference_package(package_root, FILES)
    return common.run_inside(Path(__file__).resolve(), python, package_root)


if __name__ == "__main__":
    raise SystemExit(main())
