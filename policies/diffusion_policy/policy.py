"""``policy=diffusion_policy``: LeRobot's Diffusion Policy (``network.py``) as an RL policy, trained by DPPO.

DPPO (Ren et al. 2024) reads the denoising chain as a multi-step MDP inside each env step: every one of the
last ``rl_steps`` denoising steps is a Gaussian policy step ``x_{k+1} ~ N(mean_k(x_k, obs), std_k^2)``, with
``mean_k`` the scheduler's (``scheduler.py``), ``std_k`` the scheduler's own noise scale (DDPM's posterior std,
DDIM's with ``ddim_eta``) floored at ``min_std`` so the likelihood stays proper (DPPO's minimum denoising std;
earlier steps stay deterministic). ``sample`` keeps the chain ``[B, K + 1, horizon, A]`` as ``replay`` and
``evaluate`` re-scores its stochastic steps with gradients. The log-prob of chain positions outside the
executed window (the ``horizon - n_action_steps`` actions the policy denoises but does not run) is added to
the window's first step, so a chunk-level sum is the whole chain's density.

Observations: ``state [B, D]`` is split into ``observation.state`` (the first ``robot_state_dim`` dims; 0 = all)
and ``observation.environment_state`` (the rest); cameras ``images[name] uint8 [B, H, W, 3]`` map to
``observation.images.<name>``. vlarl's env returns the latest observation only, so the ``n_obs_steps``
history is that observation repeated (what LeRobot itself does at an episode's first step).

Normalization is LeRobot's: a loaded checkpoint's statistics are fixed; a network built from config normalizes
the state with running mean/std (``state_norm``; MEAN_STD, no clipping; ``freeze_state_norm`` keeps the SFT
statistics during RL) and the actions to ``[-1, 1]`` from the env's bounds
(MIN_MAX). ``act`` runs the deterministic chain (DDPM's means or DDIM with ``eta = 0``) from a given initial
noise (default zeros): plain tensor code, for export and for DSRL (``policy=noise_steering``).
``save_lerobot`` writes the LeRobot layout back (``checkpoint.save_lerobot``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from policies.base import ActionSample, Policy, PolicySpec
from policies.diffusion_policy.checkpoint import (
    DiffusionCheckpoint,
    load_diffusion_policy,
    normalized_inputs,
    save_lerobot,
)
from policies.diffusion_policy.config import (
    ACTION_KEY,
    ENV_KEY,
    IMAGE_PREFIX,
    STATE_KEY,
    DiffusionNetConfig,
    DiffusionPolicyConfig,
)
from policies.diffusion_policy.network import DiffusionPolicyNet
from policies.diffusion_policy.scheduler import DenoisingSchedule
from policies.flow_vla.smolvla_checkpoint import Normalizer
from policies.heads.gaussian import gaussian_entropy, gaussian_logprob
from policies.processors.normalize import RunningNormalize
from policies.registry import register_policy
from policies.vlm.policy_base import value_mlp

NET_FILE = "network_config.json"  # the resolved network config beside vlarl's weights
TINY = dict(n_obs_steps=1, down_dims=[32, 64], kernel_size=3, n_groups=8, diffusion_step_embed_dim=32,
            spatial_softmax_num_keypoints=16, noise_scheduler_type="DDIM", num_train_timesteps=100,
            num_inference_steps=10, crop_is_random=False)


class FeatureNorm(nn.Module):
    """One LeRobot feature's normalization with its statistics as buffers (saved with the weights)."""

    def __init__(self, norm: Normalizer):
        super().__init__()
        self.mode, self.eps = norm.mode, norm.eps
        self.names = sorted(norm.stats)
        for k in self.names:
            self.register_buffer(k, norm.stats[k].float().clone())

    def normalizer(self) -> Normalizer:
        return Normalizer(self.mode, {k: getattr(self, k) for k in self.names}, self.eps)


def _key(feature: str) -> str:
    return feature.replace(".", "__")  # module names cannot hold dots


@register_policy("diffusion_policy", DiffusionPolicyConfig)
class DiffusionPolicyRL(Policy):
    """Diffusion Policy (``self.net``, LeRobot's parameter names under ``net.``) with DPPO's chain likelihood,
    a value MLP on the normalized state, LeRobot's normalizers (``self.norms``) and the way back out."""

    def __init__(self, config: DiffusionPolicyConfig, spec: PolicySpec, *, restore_dir: Path | None = None):
        if config.min_std <= 0:
            raise ValueError(f"policy.min_std must be > 0 (it keeps log-densities finite), got {config.min_std}")
        if config.noise_scheduler_type not in ("", "DDPM", "DDIM"):
            raise ValueError(f"policy.noise_scheduler_type='{config.noise_scheduler_type}': use DDPM, DDIM or ''")
        S = spec.state_dim
        probing = torch.empty(0).device.type == "meta"  # config-time build: the env's sizes are placeholders
        if probing:
            config = dataclasses.replace(config, robot_state_dim=min(config.robot_state_dim, S))
        elif not 0 <= config.robot_state_dim <= S:
            raise ValueError(f"policy.robot_state_dim={config.robot_state_dim} must be in [0, state dim {S}]")
        ckpt, net_cfg, norms, norm_map, fixed = self._resolve(config, spec, restore_dir, probing)
        over = {k: v for k, v in (("num_inference_steps", config.num_inference_steps),
                                  ("noise_scheduler_type", config.noise_scheduler_type),
                                  ("n_action_steps", config.chunk_size)) if v}
        net_cfg = dataclasses.replace(net_cfg, **over)
        try:
            net_cfg.validate()
        except ValueError as e:
            raise ValueError(f"policy=diffusion_policy: {e}") from None
        config = dataclasses.replace(config, chunk_size=net_cfg.n_action_steps)
        super().__init__(config, spec)
        if ckpt is not None:  # the loaded network, with the schedule and window this config asks for
            self.net = ckpt.net
            self.net.diffusion.config = net_cfg
            self.net.diffusion.schedule = DenoisingSchedule(net_cfg)
        else:
            self.net = DiffusionPolicyNet(net_cfg)
        self.fixed_norm = fixed
        self.norms = nn.ModuleDict({_key(k): FeatureNorm(v) for k, v in norms.items()})
        self.norm_map = norm_map
        # a network built here: running state statistics over the whole env state (SFT fits them from the
        # demonstrations, RL keeps folding rollouts in unless freeze_state_norm); LeRobot's MEAN_STD of each part
        self.state_norm = None if fixed else RunningNormalize("state", spec.state_dim, 10.0)
        low_dim = net_cfg.state_dim + net_cfg.env_state_dim
        self.value_head = value_mlp(low_dim, config.value_hidden, layers=2)
        self.cameras = [k[len(IMAGE_PREFIX):] for k in net_cfg.camera_keys] if probing else self._camera_map(net_cfg, spec)
        K = len(self.net.diffusion.schedule)
        self.n_rl = K if config.rl_steps <= 0 else min(config.rl_steps, K)
        if config.freeze_vision and net_cfg.camera_keys:
            self.net.diffusion.rgb_encoder.requires_grad_(False)

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def _resolve(cls, config: DiffusionPolicyConfig, spec: PolicySpec, restore_dir: Path | None, probing: bool = False,
                 ) -> tuple[DiffusionCheckpoint | None, DiffusionNetConfig, dict[str, Normalizer], dict[str, str], bool]:
        """(loaded checkpoint or None, network config, normalizers, LeRobot normalization mapping, fixed?)."""
        if restore_dir is not None:  # vlarl's own checkpoint: the resolved network; the buffers load after
            saved = json.loads((restore_dir / NET_FILE).read_text())
            norms = {k: Normalizer(n["mode"], {s: torch.zeros(shape) for s, shape in n["shapes"].items()})
                     for k, n in saved["norms"].items()}
            return (None, DiffusionNetConfig(**saved["network"]), norms, dict(saved["norm_map"]),
                    bool(saved["fixed_normalization"]))
        if not config.pretrained_path:
            net_cfg = cls._fresh_config(config, spec)
            return (None, net_cfg, cls._fresh_normalizers(net_cfg, spec),
                    {"STATE": "MEAN_STD", "ENV": "MEAN_STD", "ACTION": "MIN_MAX"}, False)
        with warnings.catch_warnings():  # built on the meta device (config checks), loading weights is a no-op
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
            ckpt = load_diffusion_policy(config.pretrained_path)
        cfg = ckpt.config
        split = config.robot_state_dim or spec.state_dim
        if probing:  # the checkpoint's sizes are checked against the real env when the workers build it
            return ckpt, cfg, ckpt.normalizers, dict(ckpt.norm_map), True
        if (cfg.state_dim, cfg.env_state_dim) != (split, spec.state_dim - split) or cfg.action_dim != spec.action_dim:
            raise ValueError(f"the checkpoint {config.pretrained_path} reads a state of {cfg.state_dim} + environment "
                             f"state of {cfg.env_state_dim} dims and acts in {cfg.action_dim}; this env gives state "
                             f"{spec.state_dim} (split at policy.robot_state_dim={config.robot_state_dim}) and "
                             f"actions {spec.action_dim}")
        return ckpt, cfg, ckpt.normalizers, dict(ckpt.norm_map), True

    @staticmethod
    def _fresh_config(config: DiffusionPolicyConfig, spec: PolicySpec) -> DiffusionNetConfig:
        known = {f.name for f in dataclasses.fields(DiffusionNetConfig)}
        unknown = sorted(set(config.arch) - known)
        if unknown:
            raise ValueError(f"policy.arch has keys {unknown} that Diffusion Policy does not know; known: {sorted(known)}")
        split = config.robot_state_dim or spec.state_dim
        kw: dict[str, Any] = {**TINY, **dict(config.arch)}
        n_obs = int(kw.get("n_obs_steps", 1))
        chunk = config.chunk_size or 4
        factor = 2 ** len(kw["down_dims"])
        kw.setdefault("horizon", -(-(chunk + n_obs - 1) // factor) * factor)
        kw.setdefault("n_action_steps", chunk)
        cams = [IMAGE_PREFIX + k for k in spec.image_keys]
        size = list(spec.image_size) if spec.image_size else [0, 0]
        if len(size) == 1:
            size = size * 2
        return DiffusionNetConfig(state_dim=split, env_state_dim=spec.state_dim - split, action_dim=spec.action_dim,
                                  camera_keys=cams, image_shape=[3, *size[-2:]] if cams else [], **kw)

    @staticmethod
    def _fresh_normalizers(cfg: DiffusionNetConfig, spec: PolicySpec) -> dict[str, Normalizer]:
        lo, hi = torch.tensor(spec.action_low).float(), torch.tensor(spec.action_high).float()
        out = {ACTION_KEY: Normalizer("MIN_MAX", {"min": lo, "max": hi})}  # the state's: ``state_norm``
        for k in cfg.camera_keys:
            out[k] = Normalizer("IDENTITY", {})
        return out

    @staticmethod
    def _camera_map(cfg: DiffusionNetConfig, spec: PolicySpec) -> list[str]:
        """The env camera feeding each of the network's cameras: by name (``observation.images.<name>``), else
        by position when the env has exactly as many cameras."""
        names = [k[len(IMAGE_PREFIX):] for k in cfg.camera_keys]
        if all(n in spec.image_keys for n in names):
            return names
        if len(spec.image_keys) == len(names):
            return list(spec.image_keys)
        raise ValueError(f"the network reads cameras {names}; the env gives {list(spec.image_keys)}")

    @property
    def net_config(self) -> DiffusionNetConfig:
        return self.net.config

    @property
    def device(self) -> torch.device:
        return self.value_head[0].weight.device

    def normalizers(self) -> dict[str, Normalizer]:
        """LeRobot's normalizer of every feature (a network built here: the state's from ``state_norm`` now)."""
        out = {k.replace("__", "."): m.normalizer() for k, m in self.norms.items()}
        if self.state_norm is not None:
            S = self.net_config.state_dim
            mean, std = self.state_norm.mean, self.state_norm.var.sqrt()
            out[STATE_KEY] = Normalizer("MEAN_STD", {"mean": mean[:S], "std": std[:S]})
            if self.net_config.env_state_dim:
                out[ENV_KEY] = Normalizer("MEAN_STD", {"mean": mean[S:], "std": std[S:]})
        return out

    # -- observations ----------------------------------------------------------------------------------------
    def raw_features(self, obs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """vlarl's observation -> LeRobot's raw features with the history axis ``[B, n_obs, ...]``."""
        cfg = self.net_config
        state = torch.as_tensor(obs["state"], dtype=torch.float32, device=self.device)
        n = cfg.n_obs_steps
        rep = (lambda x: x.unsqueeze(1).expand(-1, n, *x.shape[1:]))  # noqa: E731
        out = {STATE_KEY: rep(state[:, : cfg.state_dim])}
        if cfg.env_state_dim:
            out[ENV_KEY] = rep(state[:, cfg.state_dim:])
        for key, cam in zip(cfg.camera_keys, self.cameras, strict=True):
            im = torch.as_tensor(obs["images"][cam], device=self.device)
            if tuple(im.shape[1:3]) != tuple(cfg.image_shape[1:]):
                raise ValueError(f"camera '{cam}' gives {tuple(im.shape[1:3])} images; the network reads "
                                 f"{tuple(cfg.image_shape[1:])}")
            out[key] = rep(im.permute(0, 3, 1, 2).float() / 255.0)
        return out

    def _cond(self, obs: dict[str, Any], augment: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(conditioning ``[B, G]``, normalized low-dimensional state ``[B, S + E]`` for the value head).

        The image encoders run as at evaluation (centre crop, BatchNorm's running statistics) unless ``augment``
        (SFT in training mode: LeRobot's random crop), so ``sample`` and ``evaluate`` condition on the same
        features and PPO's ratio compares like with like."""
        x = normalized_inputs(self.net_config, self.normalizers(), self.raw_features(obs))
        enc = getattr(self.net.diffusion, "rgb_encoder", None)
        was = enc.training if enc is not None else False
        if enc is not None and not augment:
            enc.eval()
        try:
            cond = self.net.diffusion.global_cond(x["state"], x["images"], x["env_state"])
        finally:
            if enc is not None:
                enc.train(was)
        low = x["state"][:, -1] if x["env_state"] is None else torch.cat([x["state"][:, -1], x["env_state"][:, -1]], -1)
        return cond, low

    def update_normalization(self, obs: dict[str, Any]) -> None:
        """RL rollouts fold into the running state statistics (not a checkpoint's, nor with freeze_state_norm)."""
        if self.state_norm is not None and not self.config.freeze_state_norm:
            self.state_norm.update(torch.as_tensor(obs["state"], dtype=torch.float32, device=self.device))

    def normalization_stats(self) -> dict[str, list[float]]:
        return {f"{k}.{n}": v.flatten().tolist() for k, norm in self.normalizers().items() for n, v in norm.stats.items()}

    # -- the chain -------------------------------------------------------------------------------------------
    def chunk_shape(self, batch: int) -> tuple[int, int, int]:
        """The initial noise's shape ``(B, horizon, A)`` (normalized action space)."""
        return (batch, self.net_config.horizon, self.net_config.action_dim)

    def _stochastic(self, k: int) -> bool:
        return k >= len(self.net.diffusion.schedule) - self.n_rl

    def _step_gaussian(self, k: int, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``k``'s mean ``[B, H, A]`` and floored std (scalar tensor), DPPO's policy step."""
        sch = self.net.diffusion.schedule
        out = self.net.diffusion.unet(x, sch.timesteps[k].expand(x.shape[0]).to(x.dtype), cond)
        raw = sch.noise_std(k, self.config.ddim_eta)
        return sch.mean(k, out, x, raw), torch.as_tensor(raw, device=x.device).clamp_min(self.config.min_std)

    def _window(self, per_pos: torch.Tensor) -> torch.Tensor:
        """``[B, H, A]`` per chain position -> ``[B, T, A]`` on the executed window, the rest folded into its
        first step (a chunk-level sum is the whole chain's)."""
        start, T = self.net_config.n_obs_steps - 1, self.net_config.n_action_steps
        win = per_pos[:, start:start + T].clone()
        win[:, 0] = win[:, 0] + per_pos[:, :start].sum(1) + per_pos[:, start + T:].sum(1)
        return win

    def _unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalizers()[ACTION_KEY].unnormalize(self.net.diffusion.executed(x))

    @torch.no_grad()
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        cond, low = self._cond(obs)
        B = cond.shape[0]
        x = torch.randn(self.chunk_shape(B), device=self.device)
        chain, lp = [x], torch.zeros_like(x)
        for k in range(len(self.net.diffusion.schedule)):
            mean, std = self._step_gaussian(k, x, cond)
            if self._stochastic(k):
                x = mean + std * torch.randn_like(mean)
                lp = lp + gaussian_logprob(x, mean, std)
            else:
                x = mean
            chain.append(x)
        value = self.value_head(low).squeeze(-1)
        return ActionSample(self._unnormalize(x), self._window(lp), value, {"chain": torch.stack(chain, 1)})

    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        """(log-prob ``[B, T, A]``, entropy ``[B, T, A]``, value ``[B]``) of the recorded chain, with gradients."""
        cond, low = self._cond(obs)
        chain = replay["chain"].to(self.device)
        lp = torch.zeros_like(chain[:, 0])
        ent = torch.zeros_like(lp)
        for k in range(len(self.net.diffusion.schedule)):
            if not self._stochastic(k):
                continue
            mean, std = self._step_gaussian(k, chain[:, k], cond)
            lp = lp + gaussian_logprob(chain[:, k + 1], mean, std)
            ent = ent + gaussian_entropy(std).expand_as(lp)
        return self._window(lp), self._window(ent), self.value_head(low).squeeze(-1)

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        return self.value_head(self._cond(obs)[1]).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: dict[str, Any], noise: torch.Tensor | None = None) -> torch.Tensor:
        """The deterministic chain from ``noise [B, horizon, A]`` (normalized; default zeros) -> ``[B, T, A]``."""
        cond, _ = self._cond(obs)
        x = torch.zeros(self.chunk_shape(cond.shape[0]), device=cond.device) if noise is None else noise.to(cond)
        return self._unnormalize(self.net.diffusion.denoise(cond, x))

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor, generator: torch.Generator | None = None):
        """Diffusion Policy's training loss on demonstration chunks ``actions [B, T, A]`` (env units), placed at the
        executed window of the horizon; the other positions repeat the nearest demonstrated action (LeRobot's
        copy padding at episode edges)."""
        cfg = self.net_config
        a = self.normalizers()[ACTION_KEY].normalize(actions.to(self.device).float())
        start = cfg.n_obs_steps - 1
        T = a.shape[1]
        idx = (torch.arange(cfg.horizon, device=a.device) - start).clamp(0, T - 1)
        target = a[:, idx]
        cond, _ = self._cond(obs, augment=self.training)
        B = a.shape[0]
        noise = torch.randn(target.shape, generator=generator).to(self.device)
        t = torch.randint(0, cfg.num_train_timesteps, (B,), generator=generator).to(self.device)
        return self.net.diffusion.loss(cond, target, noise, t)

    # -- persistence -----------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        d = Policy.save_pretrained(self, directory)
        norms = {k.replace("__", "."): {"mode": m.mode, "shapes": {n: list(getattr(m, n).shape) for n in m.names}}
                 for k, m in self.norms.items()}
        (d / NET_FILE).write_text(json.dumps({"network": dataclasses.asdict(self.net_config), "norms": norms,
                                              "norm_map": self.norm_map,
                                              "fixed_normalization": self.fixed_norm}, indent=2))
        return d

    def _saved_config(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.config), "pretrained_path": ""}  # the network is beside the weights

    @classmethod
    def _restore(cls, config: DiffusionPolicyConfig, spec: PolicySpec, directory: Path) -> Policy:
        return cls(config, spec, restore_dir=directory)

    def save_lerobot(self, directory: str | os.PathLike) -> Path:
        """This policy's network and normalization as a LeRobot ``diffusion`` directory (the value head stays)."""
        return save_lerobot(directory, self.net, self.normalizers(), self.norm_map)
