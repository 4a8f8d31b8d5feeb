"""OpenVLA-OFT parity fixture, made by OpenVLA-OFT's own classes in an environment of their own.

    python scripts/reference_fixtures/openvla_oft.py     (or: scripts/make_reference_fixtures.py openvla_oft)

Creates ``.reference-envs/openvla_oft``: the OpenVLA pins (transformers 4.40.1, timm 0.9.10, ...) with
``transformers/models/llama/modeling_llama.py`` replaced by the one of OFT's transformers fork
(github.com/moojink/transformers-openvla-oft: SDPA attention made bidirectional, pad keys masked), as
OFT's ``pyproject.toml`` requires. Into it go OFT's ``prismatic/extern/hf/*_prismatic.py``,
``prismatic/models/{action_heads,projectors}.py``, ``prismatic/vla/constants.py`` and
``prismatic/training/train_utils.py`` (LIBERO constants: chunk 8, action dim 7, proprio dim 8, BOUNDS_Q99);
``normalize_proprio`` is executed from OFT's ``experiments/robot/openvla_utils.py`` (that module itself
imports tensorflow, so only the function is compiled). It writes ``tests/fixtures/reference/openvla_oft/``:

* ``checkpoint/``: a tiny random-weight VLA saved by ``save_pretrained`` in bfloat16 and **sharded**
  (``model.safetensors.index.json``), ``dataset_statistics.json``, ``preprocessor_config.json`` and OFT's
  separate ``action_head--100_checkpoint.pt`` (L1RegressionActionHead) and
  ``proprio_projector--100_checkpoint.pt`` (ProprioProjector), with the ``module.`` prefix that OFT's DDP
  training saves;
* ``io.safetensors``: two camera images per sample (third-person + wrist) raw and as pixel values, prompt
  ids, raw and normalized proprio; from ``predict_action`` with the L1 head: the un-normalized chunk and
  the action hidden states; without a head (OFT's discrete-token variant): the un-normalized chunk and
  the LM logits at the 56 action positions (last 320 vocabulary columns + log-sum-exp);
* ``io.json``: constants, unnorm keys, versions, reference commits.

and ``tests/fixtures/reference/openvla_oft_film/`` (OFT+, FiLM): the same kind of folder written the way OFT's
``finetune.py`` leaves a LoRA + FiLM run - bf16 shards, action head, proprio projector and
``vision_backbone--100_checkpoint.pt``, the state of OFT's own ``FiLMedPrismaticVisionBackbone`` wrapped around the
peft-LoRA'd (rank 32, OFT's ``LoraConfig``) backbone, LoRA B and the FiLM projections drawn non-zero. It is
reloaded by OFT's own ``_apply_film_to_vla`` (compiled from ``openvla_utils.py``) in fp32, and ``io.safetensors``
holds ``predict_action(..., use_film=True)`` with the L1 head (chunk and action hidden states).

``--only film`` (or ``--only base``) rebuilds one of the two folders.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _openvla_common as common  # noqa: E402

VENV = common.ENVS / "openvla_oft"
OUT = common.FIXTURES / "openvla_oft"
OUT_FILM = common.FIXTURES / "openvla_oft_film"
PARTS_ENV = "VLARL_OFT_FIXTURE_PARTS"  # which folders the inside run writes ("base,film" by default)
# OFT pins peft 0.11.1 (its pyproject); only the FiLM fixture needs it, for OFT's LoRA-then-FiLM layout
FILM_PINNED = ["torch==2.13.0", "peft==0.11.1", "accelerate==0.34.2"]
LORA_RANK = 32  # OFT's default rank: its LoRA scaling min(r, 16) / r is 0.5, so the merge rule is exercised
FILES = {
    **{f"prismatic/extern/hf/{n}_prismatic.py": ("oft", f"prismatic/extern/hf/{n}_prismatic.py")
       for n in ("configuration", "modeling", "processing")},
    **{f"prismatic/{p}": ("oft", f"prismatic/{p}") for p in (
        "models/action_heads.py", "models/projectors.py", "models/film_vit_wrapper.py", "vla/constants.py",
        "training/train_utils.py")},
}
PROMPT_LEN, BATCH, NUM_IMAGES, STEP = 6, 2, 2, 100
UNNORM = ["fixture_sim", "fixture_real"]


def reference_normalize_proprio():
    """OFT's ``normalize_proprio`` compiled from its source, with the module globals it reads."""
    import numpy as np
    from prismatic.vla import constants

    tree = ast.parse(common.read_repo_file("oft", "experiments/robot/openvla_utils.py"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "normalize_proprio")
    scope = {"np": np, "Any": object, "Dict": dict, "NormalizationType": constants.NormalizationType,
             "ACTION_PROPRIO_NORMALIZATION_TYPE": constants.ACTION_PROPRIO_NORMALIZATION_TYPE}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "openvla_utils.py", "exec"), scope)
    return scope["normalize_proprio"]


def reference_apply_film():
    """OFT's ``_apply_film_to_vla`` (LoRA, FiLM wrapper, load of ``vision_backbone--*checkpoint.pt``) and the
    ``find_checkpoint_file`` it calls, compiled from ``openvla_utils.py`` (whose imports need tensorflow)."""
    import torch
    from prismatic.models.film_vit_wrapper import FiLMedPrismaticVisionBackbone

    tree = ast.parse(common.read_repo_file("oft", "experiments/robot/openvla_utils.py"))
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_apply_film_to_vla",
                                                                                  "find_checkpoint_file")]
    scope = {"torch": torch, "os": os, "Any": object, "FiLMedPrismaticVisionBackbone": FiLMedPrismaticVisionBackbone}
    exec(compile(ast.Module(body=fns, type_ignores=[]), "openvla_utils.py", "exec"), scope)
    return scope["_apply_film_to_vla"]


def reference_vla(towers: list[str]):
    """A tiny random-weight OFT VLA (OFT's classes), its L1 head and proprio projector, and their statistics."""
    import torch
    from prismatic.extern.hf.configuration_prismatic import OpenVLAConfig
    from prismatic.extern.hf.modeling_prismatic import OpenVLAForActionPrediction
    from prismatic.models.action_heads import L1RegressionActionHead
    from prismatic.models.projectors import ProprioProjector
    from prismatic.vla import constants as K

    stats = common.statistics(K.ACTION_DIM, K.PROPRIO_DIM, common.SEED + 10)
    config = common.vla_config(OpenVLAConfig, stats, towers)
    torch.manual_seed(common.SEED)
    model = OpenVLAForActionPrediction(config)
    common.redraw(model, common.SEED + 10)
    common.favour_action_tokens(model)
    llm_dim = config.text_config.hidden_size
    head = L1RegressionActionHead(input_dim=llm_dim, hidden_dim=llm_dim, action_dim=K.ACTION_DIM)
    proprio_projector = ProprioProjector(llm_dim=llm_dim, proprio_dim=K.PROPRIO_DIM)
    common.redraw(head, common.SEED + 11)
    common.redraw(proprio_projector, common.SEED + 12)
    return model, head, proprio_projector, stats


def save_folder(ckpt: Path, model, head, proprio_projector, stats):
    """``save_pretrained`` in bf16, sharded, with the statistics, processor and OFT's component files."""
    import torch
    from prismatic.extern.hf.processing_prismatic import PrismaticImageProcessor

    ckpt.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(ckpt, max_shard_size="700KB")
    common.write_json(ckpt / "dataset_statistics.json", stats)
    processor = common.image_processor(PrismaticImageProcessor)
    processor.save_pretrained(ckpt)
    for name, module in (("action_head", head), ("proprio_projector", proprio_projector)):
        module.to(torch.bfloat16)
        torch.save({f"module.{k}": v for k, v in module.state_dict().items()}, ckpt / f"{name}--{STEP}_checkpoint.pt")
        module.float()
    return processor


def fixed_inputs(processor, stats, normalize_proprio):
    """Two samples: raw third-person + wrist images and their pixel values, prompt ids, raw / normalized proprio."""
    import numpy as np
    import torch
    from PIL import Image
    from prismatic.vla import constants as K

    raw = common.raw_images(BATCH * NUM_IMAGES, common.SEED + 13).reshape(BATCH, NUM_IMAGES, common.IMAGE,
                                                                          common.IMAGE, 3)
    pixel_values = torch.cat([
        processor([Image.fromarray(im) for im in raw[:, i]], return_tensors="pt")["pixel_values"]
        for i in range(NUM_IMAGES)], 1)
    ids = common.prompts(BATCH, PROMPT_LEN, common.SEED + 14)
    mask = torch.ones_like(ids)
    proprio_raw = np.random.default_rng(common.SEED + 15).uniform(-2.5, 2.5, (BATCH, K.PROPRIO_DIM))
    proprio = np.stack([normalize_proprio(proprio_raw[b], stats[UNNORM[b]]["proprio"]) for b in range(BATCH)])
    return raw, pixel_values, ids, mask, proprio_raw, proprio


def reference_info(film: bool) -> dict:
    import timm
    import torch
    import transformers

    return {
        "reference": {"repository": "moojink/openvla-oft", "commit": common.repo_commit("oft"),
                      "transformers_fork_commit": common.repo_commit("oft_transformers"),
                      "files": sorted(v[1] for v in FILES.values() if film or "film" not in v[1])
                      + ["experiments/robot/openvla_utils.py"]},
        "versions": {"transformers": transformers.__version__, "timm": timm.__version__,
                     "torch": torch.__version__},
    }


def build(towers: list[str]) -> None:
    import torch
    from prismatic.extern.hf.modeling_prismatic import OpenVLAForActionPrediction
    from prismatic.vla import constants as K
    from safetensors.torch import save_file

    model, head, proprio_projector, stats = reference_vla(towers)
    ckpt = OUT / "checkpoint"
    processor = save_folder(ckpt, model, head, proprio_projector, stats)

    model = OpenVLAForActionPrediction.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="sdpa")
    assert model.language_model.config._attn_implementation == "sdpa"  # the fork's bidirectional path
    model.vision_backbone.set_num_images_in_input(NUM_IMAGES)
    model.eval()
    normalize_proprio = reference_normalize_proprio()
    raw, pixel_values, ids, mask, proprio_raw, proprio = fixed_inputs(processor, stats, normalize_proprio)

    captured = []
    lm_forward = model.language_model.forward

    def record(*args, **kwargs):
        out = lm_forward(*args, **kwargs)
        captured.append(out.logits.detach().clone())
        return out

    model.language_model.forward = record
    l1_actions, l1_hidden, tok_actions, tok_logits = [], [], [], []
    with torch.no_grad():
        for b in range(BATCH):
            one = dict(input_ids=ids[b : b + 1], unnorm_key=UNNORM[b], pixel_values=pixel_values[b : b + 1],
                       attention_mask=mask[b : b + 1], proprio=proprio[b], proprio_projector=proprio_projector)
            actions, hidden = model.predict_action(**one, action_head=head)
            l1_actions.append(torch.as_tensor(actions))
            l1_hidden.append(hidden[0])
            captured.clear()
            actions, _ = model.predict_action(**one)
            tok_actions.append(torch.as_tensor(actions))
            n_patches = model.vision_backbone.get_num_patches() * NUM_IMAGES + 1  # + the proprio token
            start = n_patches + PROMPT_LEN - 1
            tok_logits.append(captured[-1][0, start : start + K.ACTION_DIM * K.NUM_ACTIONS_CHUNK].float())
    tok_logits = torch.stack(tok_logits)
    base = common.VOCAB - common.PAD_MULTIPLE
    tensors = {
        "raw_images": torch.as_tensor(raw), "pixel_values": pixel_values, "input_ids": ids,
        "proprio_raw": torch.as_tensor(proprio_raw), "proprio": torch.as_tensor(proprio),
        "l1_actions": torch.stack(l1_actions).float(), "l1_hidden": torch.stack(l1_hidden).float(),
        "token_actions": torch.stack(tok_actions).float(),
        "action_logits_tail": tok_logits[..., base - 256 :].contiguous(),
        "action_logsumexp": tok_logits.logsumexp(-1),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / "io.safetensors"))
    common.write_json(OUT / "io.json", {
        "unnorm_keys": UNNORM, "seed": common.SEED, "num_images": NUM_IMAGES, "logits_tail_from": base - 256,
        "constants": {"NUM_ACTIONS_CHUNK": K.NUM_ACTIONS_CHUNK, "ACTION_DIM": K.ACTION_DIM,
                      "PROPRIO_DIM": K.PROPRIO_DIM, "normalization": str(K.ACTION_PROPRIO_NORMALIZATION_TYPE.value)},
        **reference_info(film=False),
    })
    in_range = ((tok_logits.argmax(-1) >= base - 256) & (tok_logits.argmax(-1) < base)).float().mean().item()
    print(f"[openvla_oft] wrote {OUT}: L1 chunk {tuple(tensors['l1_actions'].shape)}, token chunk "
          f"{tuple(tensors['token_actions'].shape)} ({in_range:.0%} of greedy tokens on action ids)")


def draw_trained_film(film, seed: int) -> None:
    """LoRA A and B and the FiLM projections from a seeded normal, as after training (peft starts B at zero,
    which would hide the merge; FiLM at zero would be the identity)."""
    import re

    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(film.named_parameters()):
            if "lora_" in name or re.search(r"blocks\.\d+\.(scale|shift)\.", name):
                scale = 0.1 if p.ndim == 1 else p.shape[-1] ** -0.5
                p.copy_(scale * torch.randn(p.shape, generator=g))


def build_film(towers: list[str]) -> None:
    """OFT+: the folder a LoRA + FiLM run of OFT's ``finetune.py`` leaves, and ``predict_action(use_film=True)``."""
    from types import SimpleNamespace

    import torch
    from peft import LoraConfig, get_peft_model
    from prismatic.extern.hf.modeling_prismatic import OpenVLAForActionPrediction
    from prismatic.models.film_vit_wrapper import FiLMedPrismaticVisionBackbone
    from prismatic.vla import constants as K
    from safetensors.torch import save_file

    model, head, proprio_projector, stats = reference_vla(towers)
    ckpt = OUT_FILM / "checkpoint"
    processor = save_folder(ckpt, model, head, proprio_projector, stats)
    # finetune.py with use_lora + use_film: LoRA on every linear layer, then the FiLM wrapper around the LoRA'd
    # backbone; it saves that wrapper's whole state as vision_backbone--<step>_checkpoint.pt
    lora = LoraConfig(r=LORA_RANK, lora_alpha=min(LORA_RANK, 16), lora_dropout=0.0, target_modules="all-linear",
                      init_lora_weights="gaussian")
    vla = get_peft_model(model, lora)
    vla.model.vision_backbone = FiLMedPrismaticVisionBackbone(vision_backbone=vla.model.vision_backbone,
                                                              llm_dim=vla.model.llm_dim)
    film = vla.model.vision_backbone
    draw_trained_film(film, common.SEED + 16)
    film.to(torch.bfloat16)
    torch.save(film.state_dict(), ckpt / f"vision_backbone--{STEP}_checkpoint.pt")

    # OFT's deploy path: from_pretrained, then _apply_film_to_vla (LoRA + FiLM wrapper + that file), here in fp32
    model = OpenVLAForActionPrediction.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="sdpa")
    model = reference_apply_film()(model, SimpleNamespace(lora_rank=LORA_RANK, pretrained_checkpoint=str(ckpt)))
    model = model.float()  # it leaves the backbone in bf16; the file's values are bf16 already, so this is exact
    model.vision_backbone.set_num_images_in_input(NUM_IMAGES)
    model.eval()
    normalize_proprio = reference_normalize_proprio()
    raw, pixel_values, ids, mask, proprio_raw, proprio = fixed_inputs(processor, stats, normalize_proprio)
    l1_actions, l1_hidden = [], []
    with torch.no_grad():
        for b in range(BATCH):
            actions, hidden = model.predict_action(
                input_ids=ids[b : b + 1], unnorm_key=UNNORM[b], pixel_values=pixel_values[b : b + 1],
                attention_mask=mask[b : b + 1], proprio=proprio[b], proprio_projector=proprio_projector,
                action_head=head, use_film=True)
            l1_actions.append(torch.as_tensor(actions))
            l1_hidden.append(hidden[0])
    tensors = {
        "raw_images": torch.as_tensor(raw), "pixel_values": pixel_values, "input_ids": ids,
        "proprio_raw": torch.as_tensor(proprio_raw), "proprio": torch.as_tensor(proprio),
        "l1_actions": torch.stack(l1_actions).float(), "l1_hidden": torch.stack(l1_hidden).float(),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT_FILM / "io.safetensors"))
    common.write_json(OUT_FILM / "io.json", {
        "unnorm_keys": UNNORM, "seed": common.SEED, "num_images": NUM_IMAGES,
        "lora": {"rank": LORA_RANK, "alpha": min(LORA_RANK, 16), "target_modules": "all-linear"},
        "constants": {"NUM_ACTIONS_CHUNK": K.NUM_ACTIONS_CHUNK, "ACTION_DIM": K.ACTION_DIM,
                      "PROPRIO_DIM": K.PROPRIO_DIM, "normalization": str(K.ACTION_PROPRIO_NORMALIZATION_TYPE.value)},
        **reference_info(film=True),
    })
    print(f"[openvla_oft] wrote {OUT_FILM}: FiLM + L1 chunk {tuple(tensors['l1_actions'].shape)}")


def ensure_peft(python: Path) -> None:
    """The FiLM fixture needs OFT's peft pin in the reference venv (added to an existing venv once)."""
    if subprocess.call([str(python), "-c", "import peft"], stderr=subprocess.DEVNULL) != 0:
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", *FILM_PINNED])


def main() -> int:
    if "--inside" in sys.argv:
        import torch

        common.shim_torchvision_ops()
        torch.set_num_threads(1)
        towers = common.register_tiny_towers()
        parts = os.environ.get(PARTS_ENV, "base,film").split(",")
        if "base" in parts:
            build(towers)
        if "film" in parts:
            build_film(towers)
        return 0
    parts = "base,film"
    if "--only" in sys.argv:
        i = sys.argv.index("--only")
        parts = sys.argv[i + 1] if i + 1 < len(sys.argv) else ""
        if parts not in ("base", "film"):
            print("openvla_oft fixtures: --only takes 'base' (openvla_oft/) or 'film' (openvla_oft_film/)",
                  file=sys.stderr)
            return 2
    python = common.ensure_env(VENV, patch_llama=True)
    if "film" in parts:
        ensure_peft(python)
    package_root = VENV / "reference_code"
    common.write_reference_package(package_root, FILES)
    os.environ[PARTS_ENV] = parts
    os.environ["_CHECK_PEFT"] = "0"  # diffusers (OFT's DDIM head import) would demand a peft newer than OFT's pin
    return common.run_inside(Path(__file__).resolve(), python, package_root)


if __name__ == "__main__":
    raise SystemExit(main())
