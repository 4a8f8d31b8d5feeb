"""pi0-FAST parity fixture, made by LeRobot 0.4.4's own ``pi0_fast`` classes and the FAST processor's own code.

    python scripts/reference_fixtures/pi0fast.py [--fast-processor FILE] [--openpi DIR]
    python scripts/make_reference_fixtures.py pi0fast
    python scripts/reference_fixtures/pi0fast.py --check-export DIR   # DIR: a vlarl pi0fast save_pretrained

Runs in ``.reference-envs/pi0`` (the pi0 fixture's environment: LeRobot 0.4.4 on openpi's patched
transformers 4.53.2, which pi0-FAST needs too; built by ``pi0.py`` if absent), plus ``scipy`` (the FAST
processor's DCT). The FAST processor (``processing_action_tokenizer.py``, class
``UniversalActionProcessor``) is Hugging Face *remote code*: it lives only in the hub repository
``physical-intelligence/fast``, which LeRobot and openpi both load with ``AutoProcessor.from_pretrained(...,
trust_remote_code=True)``; no package on the registry ships it. Give a local copy of that file with
``--fast-processor`` (or ``$FAST_PROCESSOR_SRC``; default ``.reference-envs/fast_processor/``). It is run,
never copied into vlarl: the fixture keeps only what it *produces* (the BPE vocabulary and the processor
config), and ``io.json`` records the file's sha256.

Writes ``tests/fixtures/reference/pi0fast/checkpoint/``:

* a tiny random-weight PI0FastPolicy saved by LeRobot (``config.json``, ``model.safetensors``, pre/post
  processors with MEAN_STD statistics), ``tiny_dims.json`` (its widths), ``tokenizer/`` (a tiny offline
  text tokenizer standing in for PaliGemma's: byte-level, padded with placeholder entries to 520 ids so
  that FAST's "last ids minus 128 skipped" mapping lands on ids no text uses) and ``action_tokenizer/`` (a
  tiny FAST tokenizer *trained here* with the processor's own ``UniversalActionProcessor.fit``: DCT,
  scale 10, BPE vocabulary 128, on seeded smooth normalized chunks);
* ``io.safetensors``: raw observations; the model-level inputs LeRobot's pre-processing made; the greedy
  action tokens of ``sample_actions_fast_kv_cache`` (checked equal to the no-cache ``sample_actions_fast``)
  and the actions ``predict_action_chunk`` + the post-processor decoded from them; a training batch
  (action chunk -> FAST tokens via LeRobot's ``ActionTokenizerProcessorStep``), its cross-entropy loss from
  ``PI0FastPytorch.forward`` and the chunk LeRobot's ``detokenize_actions`` recovers from those tokens;
* ``io.json``: tasks, versions, the FAST processor file's sha256.

So that the random network's greedy tokens exercise FAST decoding (BPE decode, relaxed padding, inverse
DCT) instead of falling on text ids, the embedding rows (tied to ``lm_head``) of every id outside the FAST
range are scaled by 0.05 after the seeded redraw: a choice of random weights, not a change of code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pi0 as pi0_fixture  # noqa: E402  (the sibling fixture: its venv, torchvision shim, tiny builders, redraw)

ROOT = pi0_fixture.ROOT
OUT = ROOT / "tests" / "fixtures" / "reference" / "pi0fast"
DEFAULT_FAST = ROOT / ".reference-envs" / "fast_processor" / "processing_action_tokenizer.py"
SEED = 0
TASKS = ["pick up the red cube", "open_the top drawer slowly"]
TEXT_VOCAB = 520  # 4 specials + 256 bytes + placeholders; FAST ids land on 263..390, the skipped 128 on 392..519
FAST_VOCAB, FAST_SCALE = 128, 10.0
CAMERAS = {"observation.images.base": (3, 24, 40), "observation.images.wrist": (3, 32, 32)}
STATE_DIM, ACTION_DIM, CHUNK = 6, 3, 8
CONFIG = dict(chunk_size=CHUNK, n_action_steps=CHUNK, max_state_dim=8, max_action_dim=8, max_action_tokens=40,
              image_resolution=(32, 32), empty_cameras=1, tokenizer_max_length=72, max_decoding_steps=14,
              validate_action_token_prefix=False)  # byte-level tiny tokenizer: "Action" is 6 tokens, not one
# LeRobot's pi0-FAST leaves SigLIP at PaliGemma's default 224 px (pi0 sets it from image_resolution): the tiny
# tower gets the fixture's 32 px here.
TINY = {**pi0_fixture.TINY, "vision": {**pi0_fixture.TINY["vision"], "image_size": 32}, "vocab_size": TEXT_VOCAB}


def write_text_tokenizer(folder: Path) -> int:
    """Byte-level tokenizer, ``<bos>`` prepended, placeholder entries up to ``TEXT_VOCAB``; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    symbols = specials + sorted(pre_tokenizers.ByteLevel.alphabet())
    symbols += [f"<unused{i}>" for i in range(TEXT_VOCAB - len(symbols))]
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast.vocab_size


def smooth_chunks(n: int, rng) -> list:
    """Seeded smooth chunks ``[CHUNK, ACTION_DIM]`` in [-1, 1] (normalized actions) to fit FAST on."""
    import numpy as np

    t = np.linspace(0.0, 1.0, CHUNK)[:, None]
    out = []
    for _ in range(n):
        offset, amp = rng.normal(size=(1, ACTION_DIM)) * 0.5, rng.uniform(0.1, 0.6, size=(1, ACTION_DIM))
        freq, phase = rng.uniform(0.3, 1.5, size=(1, ACTION_DIM)), rng.uniform(0, 6.3, size=(1, ACTION_DIM))
        out.append(np.clip(offset + amp * np.sin(2 * np.pi * freq * t + phase), -1.0, 1.0))
    return out


def fit_fast(source: Path, folder: Path) -> dict:
    """Train the tiny FAST tokenizer with the processor's own ``fit`` and save it as the hub repo lays it out."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("processing_action_tokenizer", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["processing_action_tokenizer"] = module
    spec.loader.exec_module(module)
    cls = module.UniversalActionProcessor
    proc = cls.fit(smooth_chunks(400, np.random.default_rng(SEED)), scale=FAST_SCALE, vocab_size=FAST_VOCAB,
                   time_horizon=CHUNK, action_dim=ACTION_DIM)
    cls.register_for_auto_class("AutoProcessor")  # processor_config.json gets the hub repo's auto_map
    proc.save_pretrained(folder)
    return {"min_token": proc.min_token, "bpe_size": len(proc.bpe_tokenizer)}


def build(fast_source: Path, openpi: str) -> None:
    import lerobot
    import numpy as np
    import torch
    import transformers
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0_fast import modeling_pi0_fast as modeling
    from lerobot.policies.pi0_fast import processor_pi0_fast as processing
    from lerobot.policies.pi0_fast.configuration_pi0_fast import PI0FastConfig
    from safetensors.torch import save_file

    pi0_fixture.TINY = TINY  # tiny_builders reads the module-level sizes
    pi0_fixture.tiny_builders(modeling)
    torch.manual_seed(SEED)
    ckpt = OUT / "checkpoint"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    ckpt.mkdir(parents=True)
    assert write_text_tokenizer(ckpt / "tokenizer") == TEXT_VOCAB
    fast_info = fit_fast(fast_source, ckpt / "action_tokenizer")
    (ckpt / "tiny_dims.json").write_text(json.dumps(TINY, indent=2) + "\n")
    os.chdir(ckpt)  # the config and processors record the two tokenizer folders relative to the checkpoint
    cfg = PI0FastConfig(
        device="cpu", dtype="float32", text_tokenizer_name="tokenizer", action_tokenizer_name="action_tokenizer",
        input_features={
            **{k: PolicyFeature(type=FeatureType.VISUAL, shape=s) for k, s in CAMERAS.items()},
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
        **CONFIG,
    )
    policy = modeling.PI0FastPolicy(cfg)
    pi0_fixture.redraw(policy, SEED)
    pg_tok = policy._paligemma_tokenizer  # noqa: SLF001
    fast_hi = pg_tok.vocab_size - 1 - cfg.fast_skip_tokens
    fast_ids = torch.arange(fast_hi - FAST_VOCAB + 1, fast_hi + 1)
    embed = policy.model.paligemma_with_expert.paligemma.lm_head.weight
    with torch.no_grad():
        keep = torch.zeros(embed.shape[0], dtype=torch.bool)
        keep[fast_ids] = True
        keep[pg_tok.convert_tokens_to_ids("|")] = True
        embed[~keep] *= 0.05
    policy.eval()
    g = torch.Generator().manual_seed(SEED + 1)

    def feature_stats(dim: int) -> dict:
        return {"mean": torch.randn(dim, generator=g), "std": 0.5 + torch.rand(dim, generator=g)}

    stats = {"observation.state": feature_stats(STATE_DIM), "action": feature_stats(ACTION_DIM)}
    pre, post = processing.make_pi0_fast_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(ckpt)
    pre.save_pretrained(ckpt)
    post.save_pretrained(ckpt)

    batch = 2
    raw = {k: torch.rand(batch, *s, generator=g) for k, s in CAMERAS.items()}
    raw["observation.state"] = 0.8 * torch.randn(batch, STATE_DIM, generator=g)
    processed = pre({**{k: v.clone() for k, v in raw.items()}, "task": list(TASKS)})
    images, img_masks = policy._preprocess_images(processed)  # noqa: SLF001
    tokens = processed["observation.language.tokens"]
    token_mask = processed["observation.language.attention_mask"]
    with torch.no_grad():
        greedy = policy.model.sample_actions_fast_kv_cache(images, img_masks, tokens, token_mask,
                                                           max_decoding_steps=cfg.max_decoding_steps)
        greedy_nocache = policy.model.sample_actions_fast(images, img_masks, tokens, token_mask,
                                                          max_decoding_steps=cfg.max_decoding_steps)
        policy.reset()
        normalized = policy.predict_action_chunk(processed)
        actions = post(normalized)
    assert torch.equal(greedy, greedy_nocache), (greedy, greedy_nocache)

    # training: a normalized-space chunk -> raw action (so the pre-processor's normalizer maps it back)
    chunks = torch.tensor(np.stack(smooth_chunks(batch, np.random.default_rng(SEED + 7))), dtype=torch.float32)
    train_action = chunks * stats["action"]["std"] + stats["action"]["mean"]
    train = pre({**{k: v.clone() for k, v in raw.items()}, "action": train_action.clone(), "task": list(TASKS)})
    act_tokens, act_mask = train["action.tokens"], train["action.token_mask"]
    with torch.no_grad():
        loss, _ = policy.forward(train)
        train_loss = policy.model.forward(images, img_masks, train["observation.language.tokens"],
                                          train["observation.language.attention_mask"], act_tokens, act_mask)["loss"]
        recovered = policy.detokenize_actions(act_tokens[:, 1:], action_horizon=CHUNK, action_dim=ACTION_DIM)
    tensors = {
        **{f"raw.{k}": v for k, v in raw.items()},
        **{f"model.image.{i}": im for i, im in enumerate(images)},
        **{f"model.image_mask.{i}": m for i, m in enumerate(img_masks)},
        "model.tokens": tokens,
        "model.token_mask": token_mask.bool(),
        "greedy_tokens": greedy,
        "normalized_actions": normalized,
        "actions": actions,
        "train.chunk": chunks,
        "train.action": train_action,
        "train.action_tokens": act_tokens,
        "train.action_token_mask": act_mask.bool(),
        "train.loss": train_loss.reshape(1),
        "train.recovered": recovered,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ckpt / "io.safetensors"))
    (ckpt / "action_tokenizer" / "processing_action_tokenizer.py").unlink()  # the reference's code stays out
    meta = {
        "tasks": TASKS, "cameras": list(CAMERAS), "seed": SEED, "policy": "pi0_fast",
        "fast": {**fast_info, "scale": FAST_SCALE, "vocab_size": FAST_VOCAB,
                 "processor_sha256": hashlib.sha256(fast_source.read_bytes()).hexdigest()},
        "versions": {"lerobot": lerobot.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__, "openpi_transformers_replace": openpi},
    }
    (ckpt / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    print(f"[pi0fast] wrote {ckpt} ({size / 1e3:.0f} kB): greedy {greedy.tolist()}, loss {train_loss.item():.4f}, "
          f"|actions| {actions.abs().max():.3f}, recovered err {(recovered - chunks).abs().max():.3f}")


def vlarl_outputs(ckpt_dir: Path, out: Path) -> None:
    """(vlarl's side of ``--check-export``) the exported LeRobot folder, read by vlarl, on the fixture's inputs:
    greedy tokens, actions, training loss."""
    sys.path.insert(0, str(ROOT))
    import torch
    from safetensors.torch import load_file, save_file

    from policies.ar_vla.pi0fast import FastInputs
    from policies.ar_vla.pi0fast_checkpoint import load_pi0fast
    from policies.ar_vla.pi0fast_tokenizer import detokenize

    torch.set_num_threads(1)
    ck = load_pi0fast(ckpt_dir / "lerobot")
    io = load_file(str(OUT / "checkpoint" / "io.safetensors"))
    cams = sorted(k for k in io if k.startswith("model.image."))
    inputs = FastInputs([io[k] for k in cams], [io[k.replace("image.", "image_mask.")] for k in cams],
                        io["model.tokens"], io["model.token_mask"])
    tokens = ck.model.generate(inputs, ck.vocab.bos_id, ck.config.max_decoding_steps)
    actions = ck.action_norm.unnormalize(detokenize(tokens, ck.vocab, ck.fast, ck.config.n_action_steps, ck.action_dim))
    with torch.no_grad():
        loss = ck.model.answer_loss(inputs, io["train.action_tokens"], io["train.action_token_mask"])
    save_file({"tokens": tokens, "actions": actions, "loss": loss.reshape(1)}, str(out))


def check_export(lerobot_dir: Path, fast_source: Path, ours_file: Path) -> int:
    """(LeRobot's side) ``PI0FastPolicy.from_pretrained`` on a copy of the export (plus the FAST processor's
    file, which a hub snapshot would hold), the same inputs: tokens equal, actions and loss within 1e-4."""
    import tempfile

    import torch
    from lerobot.policies.pi0_fast import modeling_pi0_fast as modeling
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
    from safetensors.torch import load_file

    copy = Path(tempfile.mkdtemp()) / "lerobot"
    shutil.copytree(lerobot_dir, copy)
    shutil.copy2(fast_source, copy / "action_tokenizer" / fast_source.name)
    pi0_fixture.TINY = json.loads((copy / "tiny_dims.json").read_text())
    pi0_fixture.tiny_builders(modeling)
    os.chdir(copy)
    policy = modeling.PI0FastPolicy.from_pretrained(".", strict=True).eval()
    post = PolicyProcessorPipeline.from_pretrained(".", config_filename="policy_postprocessor.json",
                                                   to_transition=policy_action_to_transition,
                                                   to_output=transition_to_policy_action)
    io, ours = load_file(str(OUT / "checkpoint" / "io.safetensors")), load_file(str(ours_file))
    cams = sorted(k for k in io if k.startswith("model.image."))
    images, masks = [io[k] for k in cams], [io[k.replace("image.", "image_mask.")] for k in cams]
    cfg = policy.config
    with torch.no_grad():
        tokens = policy.model.sample_actions_fast_kv_cache(images, masks, io["model.tokens"], io["model.token_mask"],
                                                           max_decoding_steps=cfg.max_decoding_steps)
        actions = post(policy.detokenize_actions(tokens, action_horizon=cfg.n_action_steps,
                                                 action_dim=cfg.output_features["action"].shape[0]))
        loss = policy.model.forward(images, masks, io["model.tokens"], io["model.token_mask"],
                                    io["train.action_tokens"], io["train.action_token_mask"])["loss"]
    err, loss_err = (actions - ours["actions"]).abs().max().item(), abs(loss.item() - ours["loss"].item())
    same = torch.equal(tokens, ours["tokens"])
    print(f"[pi0fast export] LeRobot loads {lerobot_dir}: tokens equal {same}, actions max |diff| {err:.2e}, "
          f"loss |diff| {loss_err:.2e}")
    return 0 if same and err < 1e-4 and loss_err < 1e-4 else 1


def ensure_scipy(python: Path) -> None:
    if subprocess.call([str(python), "-c", "import scipy"], stderr=subprocess.DEVNULL) != 0:
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "scipy"])


def main() -> int:
    args = sys.argv[1:]
    if "--inside" in args:
        import torch

        pi0_fixture.shim_torchvision_ops()
        torch.set_num_threads(1)
        fast = Path(args[args.index("--fast-processor") + 1])
        if "--check-export" in args:
            return check_export(Path(args[args.index("--check-export") + 1]), fast, Path(args[args.index("--ours") + 1]))
        build(fast, args[args.index("--inside") + 1])
        return 0
    fast = Path(args[args.index("--fast-processor") + 1]) if "--fast-processor" in args else Path(
        os.environ.get("FAST_PROCESSOR_SRC", DEFAULT_FAST))
    if not fast.is_file():
        print(f"pi0fast fixture: error: FAST processor source {fast} not found; save processing_action_tokenizer.py "
              "of the hub repository physical-intelligence/fast there or pass --fast-processor FILE", file=sys.stderr)
        return 2
    openpi = Path(args[args.index("--openpi") + 1]) if "--openpi" in args else Path(
        os.environ.get("OPENPI_SRC", pi0_fixture.DEFAULT_OPENPI))
    if not openpi.exists():
        print(f"pi0fast fixture: error: openpi source {openpi} not found; pass --openpi <openpi checkout or git dir>",
              file=sys.stderr)
        return 2
    python = pi0_fixture.ensure_env(openpi)
    ensure_scipy(python)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    if "--check-export" in args:
        ckpt_dir = Path(args[args.index("--check-export") + 1]).resolve()
        if not (ckpt_dir / "lerobot" / "config.json").is_file():
            print(f"pi0fast fixture: error: {ckpt_dir} has no lerobot/config.json; pass a vlarl pi0fast checkpoint "
                  "saved from a LeRobot-origin model", file=sys.stderr)
            return 2
        ours = ckpt_dir.parent / f".{ckpt_dir.name}.vlarl_outputs.safetensors"
        vlarl_outputs(ckpt_dir, ours)
        try:
            return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", "-", "--check-export",
                                    str(ckpt_dir / "lerobot"), "--ours", str(ours), "--fast-processor",
                                    str(fast.resolve())], env=env)
        finally:
            ours.unlink(missing_ok=True)
    return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", pi0_fixture.openpi_commit(openpi),
                            "--fast-processor", str(fast.resolve())], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
