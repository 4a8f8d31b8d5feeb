"""Diffusion Policy parity fixtures, made by LeRobot 0.4.4's own classes in their own environment.

    python scripts/reference_fixtures/diffusion_policy.py             (build the fixtures)
    PYTHONPATH=. .venv/bin/python scripts/reference_fixtures/diffusion_policy.py --roundtrip
        (vlarl exports a seeded policy=diffusion_policy in LeRobot's layout under ``.../roundtrip/``; LeRobot loads
        it with its own from_pretrained and writes its actions for the saved observations and noise)

Runs in ``.reference-envs/smolvla`` (stock lerobot 0.4.4; the environment and the torchvision shim come from
``_lerobot_common.py`` and ``smolvla.py``). Under ``tests/fixtures/reference/diffusion_policy/<variant>/`` it writes a tiny random-weight
Diffusion Policy saved by LeRobot (``config.json``, ``model.safetensors``, ``policy_preprocessor*`` /
``policy_postprocessor*`` with their statistics) and ``io.safetensors``: raw observations (``n_obs_steps`` of
history), the initial noise, the DDPM per-step noise LeRobot's scheduler drew (recorded as it drew it), and
actions of the model-level call (``generate_actions``) under DDPM and DDIM and of the whole pipeline
(pre-processor, ``select_action`` from a fresh queue, post-processor).

The ResNet-18 of the camera variant is 45 MB of float32; its large tensors are not committed: they are the
seeded redraw below (the same rule as the other fixtures: one generator over the sorted parameters), and
``model.safetensors`` keeps only the header and the small tensors (``model.small.safetensors``, ``model.header``)
plus the full file's SHA-256, from which a test rebuilds LeRobot's file byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lerobot_common as common  # noqa: E402  (the LeRobot fixtures' shared helpers)
from smolvla import ensure_env  # noqa: E402  (the same venv: stock lerobot 0.4.4)

redraw, shim_torchvision_ops = common.redraw, common.shim_torchvision_ops

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "reference" / "diffusion_policy"
SEED = 0
BATCH = 2
LARGE = 4096  # tensors with more elements are regenerated from the seed instead of committed ...
SPLIT_ABOVE = 2 << 20  # ... in a checkpoint over 2 MiB (the ResNet's); smaller ones are committed whole

VARIANTS = {
    # two cameras (separate encoders), resize + centre crop at eval, GroupNorm ResNet, FiLM scale, epsilon, DDPM
    "camera": dict(
        cameras={"observation.images.front": (3, 40, 40), "observation.images.wrist": (3, 40, 40)},
        state_dim=4, env_state_dim=0, action_dim=3,
        config=dict(n_obs_steps=2, horizon=8, n_action_steps=4, down_dims=(16, 32), kernel_size=3, n_groups=4,
                    diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8, resize_shape=(36, 36),
                    crop_ratio=0.9, use_separate_rgb_encoder_per_camera=True, noise_scheduler_type="DDPM",
                    num_train_timesteps=50, num_inference_steps=5),
    ),
    # state + environment state (no camera), bias-only FiLM, sample prediction, DDIM, three UNet stages
    "state": dict(
        cameras={}, state_dim=5, env_state_dim=6, action_dim=2,
        config=dict(n_obs_steps=1, horizon=16, n_action_steps=8, down_dims=(16, 32, 64), kernel_size=5, n_groups=8,
                    diffusion_step_embed_dim=32, use_film_scale_modulation=False, prediction_type="sample",
                    noise_scheduler_type="DDIM", num_train_timesteps=100, num_inference_steps=10),
    ),
}


class StepNoiseRecorder:
    """Wraps diffusers' ``randn_tensor`` in the DDPM scheduler's module and keeps every draw."""

    def __init__(self):
        from diffusers.schedulers import scheduling_ddpm

        self.module, self.original, self.draws = scheduling_ddpm, scheduling_ddpm.randn_tensor, []

    def __enter__(self):
        def record(*args, **kwargs):
            x = self.original(*args, **kwargs)
            self.draws.append(x.clone())
            return x

        self.module.randn_tensor = record
        return self

    def __exit__(self, *exc):
        self.module.randn_tensor = self.original


def run_chunk(policy, batch, noise, scheduler: str, seed: int):
    """LeRobot's ``generate_actions`` with ``scheduler`` (its own factory) -> (actions, step noise [K-1, ...])."""
    import torch
    from lerobot.policies.diffusion.modeling_diffusion import _make_noise_scheduler

    cfg = policy.config
    policy.diffusion.noise_scheduler = _make_noise_scheduler(
        scheduler, num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start, beta_end=cfg.beta_end,
        beta_schedule=cfg.beta_schedule, clip_sample=cfg.clip_sample, clip_sample_range=cfg.clip_sample_range,
        prediction_type=cfg.prediction_type)
    torch.manual_seed(seed)
    with StepNoiseRecorder() as rec, torch.no_grad():
        actions = policy.diffusion.generate_actions(batch, noise=noise.clone())
    return actions, (torch.stack(rec.draws) if rec.draws else torch.zeros(0))


def model_batch(policy, processed: dict) -> dict:
    """The batch ``generate_actions`` takes: images stacked as ``observation.images [B, n_obs, N, C, H, W]``."""
    import torch

    batch = {k: v for k, v in processed.items() if k in ("observation.state", "observation.environment_state")}
    if policy.config.image_features:
        batch["observation.images"] = torch.stack([processed[k] for k in policy.config.image_features], dim=-4)
    return batch


def write_split_weights(ckpt: Path) -> str:
    """Keep the header and the small tensors of LeRobot's ``model.safetensors``; return the file's SHA-256."""
    from safetensors.torch import load_file, save_file

    raw = (ckpt / "model.safetensors").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    header_len = int.from_bytes(raw[:8], "little")
    tensors = load_file(str(ckpt / "model.safetensors"))
    if len(raw) > SPLIT_ABOVE:
        (ckpt / "model.header").write_bytes(raw[: 8 + header_len])
        save_file({k: v for k, v in tensors.items() if v.numel() <= LARGE}, str(ckpt / "model.small.safetensors"))
        (ckpt / "model.safetensors").unlink()
    return digest


def build(name: str, cameras: dict, state_dim: int, env_state_dim: int, action_dim: int, config: dict) -> None:
    import lerobot
    import torch
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    ckpt = OUT / name
    ckpt.mkdir(parents=True, exist_ok=True)
    features = {k: PolicyFeature(type=FeatureType.VISUAL, shape=s) for k, s in cameras.items()}
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    if env_state_dim:
        features["observation.environment_state"] = PolicyFeature(type=FeatureType.ENV, shape=(env_state_dim,))
    norm_map = {"VISUAL": NormalizationMode.MEAN_STD, "STATE": NormalizationMode.MIN_MAX,
                "ENV": NormalizationMode.MEAN_STD, "ACTION": NormalizationMode.MIN_MAX}
    cfg = DiffusionConfig(device="cpu", input_features=features, normalization_mapping=norm_map,
                          output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
                          **config)
    policy = DiffusionPolicy(cfg)
    redraw(policy, SEED)
    policy.eval()
    g = torch.Generator().manual_seed(SEED + 1)
    stats = {"observation.state": {"min": -1 - torch.rand(state_dim, generator=g),
                                   "max": 1 + torch.rand(state_dim, generator=g)},
             "action": {"min": -2 * torch.rand(action_dim, generator=g) - 0.5,
                        "max": 2 * torch.rand(action_dim, generator=g) + 0.5}}
    if env_state_dim:
        stats["observation.environment_state"] = {"mean": torch.randn(env_state_dim, generator=g),
                                                  "std": 0.5 + torch.rand(env_state_dim, generator=g)}
    for k in cameras:
        stats[k] = {"mean": 0.3 + 0.4 * torch.rand(3, 1, 1, generator=g),
                    "std": 0.2 + 0.1 * torch.rand(3, 1, 1, generator=g)}
    pre, post = make_diffusion_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(ckpt)
    pre.save_pretrained(ckpt)
    post.save_pretrained(ckpt)

    n_obs = cfg.n_obs_steps
    # camera frames are 8-bit (k / 255), as an env's uint8 images become in [0, 1]
    raw = {k: torch.randint(0, 256, (BATCH, n_obs, *s), generator=g).float() / 255 for k, s in cameras.items()}
    raw["observation.state"] = torch.randn(BATCH, n_obs, state_dim, generator=g)
    if env_state_dim:
        raw["observation.environment_state"] = torch.randn(BATCH, n_obs, env_state_dim, generator=g)
    noise = torch.randn(BATCH, cfg.horizon, action_dim, generator=g)
    processed = pre({k: v.clone() for k, v in raw.items()})
    batch = model_batch(policy, processed)
    tensors = {**{f"raw.{k}": v for k, v in raw.items()}, **{f"model.{k}": v for k, v in batch.items()},
               "noise": noise}
    for sched in ("DDPM", "DDIM"):
        actions, draws = run_chunk(policy, batch, noise, sched, seed=SEED + 2)
        tensors[f"{sched.lower()}.actions"] = actions
        tensors[f"{sched.lower()}.step_noise"] = draws
        tensors[f"{sched.lower()}.env_actions"] = post(actions.clone())
    # the deployed pipeline from a fresh queue on the latest observation alone (it is copied n_obs times)
    run_chunk(policy, batch, noise, cfg.noise_scheduler_type, seed=SEED + 2)  # the checkpoint's own scheduler
    latest = pre({k: v[:, -1].clone() for k, v in raw.items()})
    policy.reset()
    torch.manual_seed(SEED + 3)
    with StepNoiseRecorder() as rec, torch.no_grad():
        steps = [policy.select_action(dict(latest), noise=noise.clone()) for _ in range(cfg.n_action_steps)]
    tensors["pipeline.env_actions"] = post(torch.stack(steps, 1))
    tensors["pipeline.step_noise"] = torch.stack(rec.draws) if rec.draws else torch.zeros(0)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ckpt / "io.safetensors"))
    digest = write_split_weights(ckpt)
    meta = {"seed": SEED, "cameras": list(cameras), "model_sha256": digest,
            "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__}}
    (ckpt / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"[diffusion_policy] wrote {ckpt}: actions {tuple(tensors['ddpm.actions'].shape)}")


def roundtrip(directory: Path, out: Path) -> None:
    """LeRobot loads vlarl's export and acts on the observations and noise saved beside it (``inputs.safetensors``:
    ``raw.*`` latest observations, ``noise``) with DDIM (deterministic); writes ``actions`` to ``out``."""
    import torch
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
    from safetensors.torch import load_file, save_file

    policy = DiffusionPolicy.from_pretrained(str(directory), strict=True).eval()  # every key used, none missing
    pre = PolicyProcessorPipeline.from_pretrained(str(directory), config_filename="policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(directory), config_filename="policy_postprocessor.json", to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action)
    io = load_file(str(directory / "inputs.safetensors"))
    latest = pre({k[len("raw."):]: v for k, v in io.items() if k.startswith("raw.")})
    policy.reset()
    with torch.no_grad():
        steps = [policy.select_action(dict(latest), noise=io["noise"].clone())
                 for _ in range(policy.config.n_action_steps)]
    save_file({"actions": post(torch.stack(steps, 1)).contiguous()}, str(out))
    print(f"[diffusion_policy] LeRobot loaded {directory} and wrote {out}")


ROUNDTRIP = dict(state_dim=7, robot_state_dim=3, action_dim=2, chunk_size=4,
                 arch=dict(n_obs_steps=2, horizon=8, down_dims=[16, 32], n_groups=4, diffusion_step_embed_dim=16))


def export_from_vlarl() -> Path:
    """Run by the project's Python: a seeded ``policy=diffusion_policy`` (every weight redrawn, running state
    statistics from random observations) written with ``save_lerobot``, and the observations + noise to act on."""
    import torch
    from safetensors.torch import save_file

    from policies.base import PolicySpec
    from policies.registry import make_policy, policy_config_class

    torch.manual_seed(SEED)
    rt = ROUNDTRIP
    spec = PolicySpec(state_dim=rt["state_dim"], action_dim=rt["action_dim"], action_low=[-2.0, -0.5],
                      action_high=[1.0, 3.0])
    config = policy_config_class("diffusion_policy")(chunk_size=rt["chunk_size"], robot_state_dim=rt["robot_state_dim"],
                                                     arch=dict(rt["arch"]))
    policy = make_policy(config, spec).eval()
    redraw(policy.net, SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    for _ in range(3):
        policy.update_normalization({"state": 2 * torch.randn(16, rt["state_dim"], generator=g) + 1})
    out = OUT / "roundtrip"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    policy.save_lerobot(out)
    state = torch.randn(BATCH, rt["state_dim"], generator=g) * 2 + 1
    noise = torch.randn(policy.chunk_shape(BATCH), generator=g)
    S = rt["robot_state_dim"]
    with torch.no_grad():
        vlarl_actions = policy.act({"state": state}, noise=noise)
    save_file({"raw.observation.state": state[:, :S].contiguous(),
               "raw.observation.environment_state": state[:, S:].contiguous(), "noise": noise,
               "vlarl.actions": vlarl_actions}, str(out / "inputs.safetensors"))
    return out


def main() -> int:
    if "--roundtrip" in sys.argv and "--inside" not in sys.argv:
        out = export_from_vlarl()
        python = ensure_env()
        env = common.offline_env()
        return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", "--roundtrip", str(out),
                                str(out / "reference_actions.safetensors")], env=env)
    if "--inside" in sys.argv:
        import torch

        shim_torchvision_ops()
        torch.set_num_threads(1)
        if "--roundtrip" in sys.argv:
            i = sys.argv.index("--roundtrip")
            roundtrip(Path(sys.argv[i + 1]), Path(sys.argv[i + 2]))
            return 0
        for name, spec in VARIANTS.items():
            build(name, **spec)
        return 0
    python = ensure_env()
    return subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", *sys.argv[1:]],
                           env=common.offline_env())


if __name__ == "__main__":
    raise SystemExit(main())
