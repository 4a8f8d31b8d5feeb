"""Chunked SAC and RLPD: soft actor-critic over whole action chunks, learning from a replay buffer.

Each iteration the collector steps every env ``num_steps`` chunks (as PPO does); ``sac_update`` puts those chunk
transitions into the replay buffer (``vlarl.algorithms.replay``) and takes ``utd_ratio`` gradient steps per new
transition, each on a batch that mixes in demonstrations at ``demo_ratio``:

* critics: an ensemble of ``num_critics`` MLPs (layer norm) scoring ``Q(s, a_0..a_{T-1})``. Target
  ``y = sum_{i<k} gamma^i r_i + gamma^k (1 - terminated) min_{j in random subset} Q'_j(s', a' ~ pi(s'))``
  (``vlarl.algorithms.chunk_td``); regression (``critic_loss=mse``) or HL-Gauss classification (``hl_gauss``);
* target critics: polyak averages (``tau``) of the critics;
* actor: the policy's reparameterized, tanh-squashed chunk (``Policy.rsample``), maximizing the ensemble mean of
  Q minus ``alpha * log pi``;
* temperature: ``log alpha`` follows ``-(log pi + target_entropy)``, so alpha rises when the policy's entropy is
  below the target and falls when it is above.

Pixel SAC (``policy=cnn policy.squash=true``): a policy whose ``critic_encoder()`` returns a module
``obs -> features [B, F]`` gets critics over ``cat(features, chunk)``; the encoder is the critics' own (trained by
the critic loss, in ``q_opt``), the actor keeps its own encoder trained by the actor loss (DrQ / SERL), and the
replay keeps each transition's camera images and next images (uint8). A policy without one (``policy=mlp``)
gives critics over the raw state, as before.

``algorithm=rlpd`` is the same update with RLPD's settings (10 critics, subsets of 2, 50/50 demonstrations).
The critics, targets, temperature, their optimizers and the replay buffer live in ``SACState`` (built once by the
actor worker through ``AlgorithmSpec.make_state`` and saved beside each checkpoint).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vlarl.algorithms.chunk_td import chunk_td_target
from vlarl.algorithms.critic_files import read_critics, shape_problem
from vlarl.algorithms.hl_gauss import HLGaussSupport, bins_to_value, hl_gauss_loss
from vlarl.algorithms.replay import MixedReplay, demo_transitions, trajectory_transitions
from vlarl.algorithms.spec import AlgorithmSpec, register_algorithm, unused_value_head_problem
from vlarl.algorithms.update import choice_problem
from vlarl.data.trajectory import Trajectory

CRITIC_LOSSES = ("mse", "hl_gauss")
MAX_REPLAY_IMAGE_BYTES = 4 * 2**30  # camera images a pixel replay may hold (obs and next obs, uint8)


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers applied in one batched matmul: x [E, B, in] -> [E, B, out]."""

    def __init__(self, num: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default initialization, per member
        self.weight = nn.Parameter(torch.empty(num, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """``members``: only those (indices into the ensemble; x is then [len(members), B, in])."""
        if members is None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias[members], x, self.weight[members])


class QEnsemble(nn.Module):
    """``num`` critics Q(state, chunk) -> [E, B, out] (out = 1, or the HL-Gauss bins); hidden layers are
    Linear -> LayerNorm (per member affine) -> ReLU."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int, num: int, layer_norm: bool):
        super().__init__()
        self.num, self.layer_norm = num, layer_norm
        dims = [in_dim, *hidden]
        self.hidden = nn.ModuleList(EnsembleLinear(num, a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.ln_scale = nn.ParameterList(nn.Parameter(torch.ones(num, 1, h)) for h in hidden)
        self.ln_shift = nn.ParameterList(nn.Parameter(torch.zeros(num, 1, h)) for h in hidden)
        self.out = EnsembleLinear(num, dims[-1], out_dim)

    def shape(self) -> dict[str, Any]:
        """What a saved ensemble must match to be loaded into this one (``vlarl.algorithms.critic_files``)."""
        return {"in_dim": self.hidden[0].weight.shape[1] if len(self.hidden) else self.out.weight.shape[1],
                "hidden": [layer.weight.shape[2] for layer in self.hidden], "out": self.out.weight.shape[2],
                "num": self.num, "layer_norm": self.layer_norm}

    def forward(self, state: torch.Tensor, actions: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """state [B, D], actions [B, T, A] (normalized to [-1, 1]) -> [E, B, out]; with ``members`` (indices) only
        those critics are computed -> [len(members), B, out] (SAC's target needs only its random subset)."""
        n = self.num if members is None else members.numel()
        x = torch.cat([state, actions.flatten(1)], dim=-1).expand(n, -1, -1)
        for layer, scale, shift in zip(self.hidden, self.ln_scale, self.ln_shift, strict=True):
            x = layer(x, members)
            if self.layer_norm:
                if members is not None:
                    scale, shift = scale[members], shift[members]
                x = F.layer_norm(x, x.shape[-1:]) * scale + shift
            x = F.relu(x)
        return self.out(x, members)


def actor_problem(policy: Any, cfg: Any) -> str | None:
    """SAC's actor must be tanh-squashed with a reparameterized sample (``Policy.rsample``); a pixel actor's replay
    must fit in memory and has no demonstrations."""
    if not callable(getattr(policy, "rsample", None)) or not getattr(policy, "squash", False):
        return (f"algorithm={cfg.name} needs a tanh-squashed actor with a reparameterized sample: "
                f"use policy=mlp policy.squash=true (state), policy=cnn policy.squash=true (cameras) or "
                f"policy=openvla_oft policy.action_head=l1 policy.squash=true (a VLA's continuous head)")
    return pixel_problem(policy, cfg) or unused_value_head_problem(policy, cfg)


def critic_cameras(policy: Any) -> list[str]:
    """The cameras the critics read, so the replay keeps them: a policy with a ``critic_encoder`` gives its
    critics its ``critic_image_keys`` (the cameras its model reads: OpenVLA-OFT's first ``num_images``, none on
    blank frames), else all of ``spec.image_keys`` (policy=cnn); none for a policy without one (the critics read
    the raw state)."""
    if not callable(getattr(policy, "critic_encoder", None)):
        return []
    return list(getattr(policy, "critic_image_keys", policy.spec.image_keys))


def pixel_problem(policy: Any, cfg: Any) -> str | None:
    """Pixel SAC's refusals: state-only demonstrations, and a replay whose images would not fit in memory
    (``buffer_size`` x 2 (obs, next obs) x cameras x H x W x 3 bytes over ``MAX_REPLAY_IMAGE_BYTES``)."""
    cameras = critic_cameras(policy)
    if not cameras:
        return None
    if cfg.demos:
        return (f"algorithm.demos='{cfg.demos}' holds state-only demonstrations and policy={policy.config.name} "
                f"learns from camera images (pixel demonstrations are not built): set algorithm.demos='' and "
                f"algorithm.demo_ratio=0, or use policy=mlp")
    if not policy.spec.image_size:
        return None
    h, w = (list(policy.spec.image_size) * 2)[:2]
    per_row = 2 * len(cameras) * int(h) * int(w) * 3
    if cfg.buffer_size * per_row > MAX_REPLAY_IMAGE_BYTES:
        return (f"algorithm.buffer_size={cfg.buffer_size} would keep {cfg.buffer_size * per_row / 2**30:.1f} GiB of "
                f"camera images (2 x {len(cameras)} camera(s) x {h}x{w}x3 bytes per transition), over the "
                f"{MAX_REPLAY_IMAGE_BYTES // 2**30} GiB bound: lower algorithm.buffer_size to at most "
                f"{MAX_REPLAY_IMAGE_BYTES // per_row}")
    return None


class SACState:
    """What SAC keeps across updates: critics, target critics, temperature, their optimizers, the replay."""

    def __init__(self, policy: Any, cfg: Any, spec: Any):
        problem = actor_problem(policy, cfg)
        if problem:
            raise ValueError(problem)
        T, A, D = policy.chunk_size, spec.action_dim, spec.state_dim
        device = next(policy.parameters()).device
        self.support = (HLGaussSupport(cfg.hl_gauss_v_min, cfg.hl_gauss_v_max, cfg.hl_gauss_bins,
                                       cfg.hl_gauss_sigma_ratio) if cfg.critic_loss == "hl_gauss" else None)
        out = self.support.num_bins if self.support else 1
        # the critics' own image encoder (pixel SAC) or None (the raw state); see ``critic_inputs``
        self.encoder: nn.Module | None = policy.critic_encoder() if critic_cameras(policy) else None
        self.cameras = list(self.encoder.image_keys) if self.encoder is not None else []
        if self.encoder is not None:
            self.encoder.to(device)
            D = self.encoder.out_dim
        self.q = QEnsemble(D + T * A, list(cfg.critic_hidden_sizes), out, cfg.num_critics, cfg.critic_layer_norm)
        self.q.to(device)
        if cfg.critics_from:  # e.g. offline IQL's critics, which trained the actor this run starts from
            saved = read_critics(cfg.critics_from)
            problem = shape_problem(saved["shape"], self.q.shape())
            if problem:
                raise ValueError(problem)
            self.q.load_state_dict(saved["q"])
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        if cfg.critics_from:
            self.q_target.load_state_dict(saved["q_target"])
        self.q_params, self.target_params = list(self.q.parameters()), list(self.q_target.parameters())
        # The target critics keep a polyak copy of the encoder (DrQ, SERL) rather than reading the online one: a
        # target through the online encoder would move with every critic step, the drift the slow targets are for.
        self.encoder_target: nn.Module | None = None
        if self.encoder is not None:
            self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
            trained = [p for p in self.encoder.parameters() if p.requires_grad]  # not a frozen pretrained encoder
            self.q_params += trained
            self.target_params += [t for p, t in zip(self.encoder.parameters(), self.encoder_target.parameters(),
                                                     strict=True) if p.requires_grad]
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.q_opt = torch.optim.Adam(self.q_params, lr=cfg.q_lr, foreach=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr)
        self.target_entropy = cfg.target_entropy_per_dim * T * A
        self.low = torch.tensor(spec.action_low, dtype=torch.float32, device=device)
        self.high = torch.tensor(spec.action_high, dtype=torch.float32, device=device)
        self.replay = MixedReplay(cfg.buffer_size, cfg.demo_ratio)
        if cfg.demos:  # state-only (pixel_problem refuses them for a pixel actor)
            from vlarl.data.demonstrations import read_demonstrations

            episodes = read_demonstrations(cfg.demos, max_episodes=cfg.num_demos, cameras=[])
            self.replay.add_demos(demo_transitions(episodes, T))
        self.update_credit = 0.0  # fractional gradient steps carried to the next iteration
        self.critic_steps = 0

    def values(self, net: QEnsemble, state: torch.Tensor, actions: torch.Tensor,
               members: torch.Tensor | None = None) -> torch.Tensor:
        """Q of every member (or of ``members``) as a scalar: [E, B] (the bins' expectation for an HL-Gauss
        critic)."""
        scaled = 2 * (actions - self.low) / (self.high - self.low) - 1
        out = net(state, scaled, members)
        return bins_to_value(out, self.support) if self.support else out.squeeze(-1)

    def critic_inputs(self, batch: Any, next_obs: bool = False, target: bool = False) -> torch.Tensor:
        """What the critics read of a batch's observations (``next_obs``: the next ones): the raw state [B, D], or
        with an encoder its features of the state and camera images [B, F] (``target``: the polyak copy's)."""
        state = batch["next_state" if next_obs else "state"]
        if self.encoder is None:
            return state
        encoder = self.encoder_target if target else self.encoder
        return encoder(replay_obs(batch, self.cameras, next_obs))

    def state_dict(self, with_replay: bool = True) -> dict[str, Any]:
        """``with_replay=False``: leave the replay out (the robot loop rebuilds it from its recorded episodes)."""
        out = {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(), "log_alpha": self.log_alpha.detach(),
               "q_opt": self.q_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(),
               "update_credit": self.update_credit, "critic_steps": self.critic_steps}
        if self.encoder is not None:
            out["encoder"], out["encoder_target"] = self.encoder.state_dict(), self.encoder_target.state_dict()
        if with_replay:
            out["replay"] = self.replay.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        if self.encoder is not None:
            self.encoder.load_state_dict(state["encoder"])
            self.encoder_target.load_state_dict(state["encoder_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.q_opt.load_state_dict(state["q_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        self.update_credit = float(state["update_credit"])
        self.critic_steps = int(state["critic_steps"])


def make_sac_state(policy: Any, cfg: Any, spec: Any) -> SACState:
    return SACState(policy, cfg, spec)


def _obs(state: torch.Tensor) -> dict[str, Any]:
    return {"state": state, "images": {}, "instruction": []}


def replay_obs(batch: Any, cameras: list[str], next_obs: bool = False) -> dict[str, Any]:
    """A policy observation of a replayed batch: state and the ``cameras``' images (``next_obs``: the next ones);
    no instruction (the policy uses the env's)."""
    if not cameras:
        return _obs(batch["next_state" if next_obs else "state"])
    prefix = "next_" if next_obs else ""
    return {"state": batch[f"{prefix}state"], "images": {k: batch[f"{prefix}images", k] for k in cameras},
            "instruction": []}


def _clip(params, max_norm: float) -> float:
    params = list(params)
    if max_norm > 0:
        return float(nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))


def critic_step(policy: Any, st: SACState, batch: Any, cfg: Any, generator: torch.Generator | None) -> dict[str, float]:
    """One gradient step of every critic on ``batch``, then the polyak update of the targets."""
    a = batch["actions"]
    with torch.no_grad():
        a2, logp2 = policy.rsample(replay_obs(batch, st.cameras, next_obs=True))
        subset = torch.randperm(st.q.num, generator=generator)[:cfg.critic_subset].to(a2.device)
        s2 = st.critic_inputs(batch, next_obs=True, target=True)
        v_next = st.values(st.q_target, s2, a2, subset).min(0).values  # only the subset's members are computed
        if cfg.backup_entropy:
            v_next = v_next - st.log_alpha.exp() * logp2.sum((-2, -1))
        y = chunk_td_target(batch["step_rewards"] * cfg.reward_scale, batch["step_mask"], batch["terminated"],
                            v_next, cfg.gamma)
    out = st.q(st.critic_inputs(batch), 2 * (a - st.low) / (st.high - st.low) - 1)  # [E, B, out]
    if st.support is not None:
        loss = hl_gauss_loss(out, y.expand(st.q.num, -1), st.support).mean(1).sum()
        q = bins_to_value(out.detach(), st.support)
    else:
        q = out.squeeze(-1)
        loss = (q - y).pow(2).mean(1).sum()
    st.q_opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = _clip(st.q_params, cfg.max_grad_norm)
    st.q_opt.step()
    with torch.no_grad():
        torch._foreach_lerp_(st.target_params, st.q_params, cfg.tau)
    st.critic_steps += 1
    return {"critic_loss": loss.item() / st.q.num, "q": q.detach().mean().item(), "td_target": y.mean().item(),
            "critic_grad_norm": grad_norm}


def actor_step(policy: Any, optimizer: torch.optim.Optimizer, st: SACState, batch: Any, cfg: Any) -> dict[str, float]:
    """One step of the actor (max mean-ensemble Q - alpha log pi) and of the temperature."""
    actions, logp = policy.rsample(replay_obs(batch, st.cameras))
    logp = logp.sum((-2, -1))
    alpha = st.log_alpha.exp().detach()
    with torch.no_grad():  # the critic's encoder is the critic loss's: the actor reads its features without moving it
        s = st.critic_inputs(batch)
    st.q.requires_grad_(False)  # gradients reach the actions through Q, not Q's own weights (the critic step owns them)
    try:
        q = st.values(st.q, s, actions).mean(0)
    finally:
        st.q.requires_grad_(True)
    actor_loss = (alpha * logp - q).mean()
    bc = demo_bc_loss(actions, batch, st.low, st.high) if cfg.bc_weight > 0 else None
    if bc is not None:
        actor_loss = actor_loss + cfg.bc_weight * bc
    optimizer.zero_grad(set_to_none=True)
    actor_loss.backward()
    grad_norm = _clip([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
    optimizer.step()
    alpha_loss = -(st.log_alpha * (logp.detach() + st.target_entropy)).mean()
    st.alpha_opt.zero_grad(set_to_none=True)
    alpha_loss.backward()
    st.alpha_opt.step()
    out = {"actor_loss": actor_loss.item(), "entropy": -logp.detach().mean().item(), "alpha": alpha.item(),
           "actor_grad_norm": grad_norm}
    if bc is not None:
        out["bc_loss"] = bc.item()
    return out


def demo_bc_loss(actions: torch.Tensor, batch: Any, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor | None:
    """Mean squared distance, in the normalized [-1, 1] action box, between the actor's sampled chunks and the
    demonstrated ones on the batch's demonstration rows (executed steps only); None without demonstration rows.
    ``algorithm.bc_weight`` adds it to the actor loss (TD3+BC's regularizer), which holds an actor started from
    imitation or offline RL near its data while the online critics are still wrong away from it."""
    demo = batch["is_demo"].to(actions.device)
    if not bool(demo.any()):
        return None
    scale = 2 / (high - low)
    diff = (actions[demo] - batch["actions"][demo]) * scale  # [n, T, A]
    mask = batch["step_mask"][demo].to(diff.dtype).unsqueeze(-1)
    return (diff.pow(2) * mask).sum() / (mask.sum() * diff.shape[-1]).clamp_min(1.0)


def sac_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    traj: Trajectory,
    cfg: Any,
    generator: torch.Generator | None = None,
    reference: Any | None = None,
    version: int = 0,
    state: SACState | None = None,
) -> dict[str, float]:
    """Add ``traj``'s chunk transitions to the replay, then ``utd_ratio`` critic steps per new transition
    (an actor and temperature step every ``actor_every``); returns mean diagnostics."""
    if state is None:
        raise ValueError(f"algorithm={cfg.name} keeps a replay buffer: the actor worker builds it with "
                         f"AlgorithmSpec.make_state and passes it as state=")
    new = trajectory_transitions(traj, cameras=state.cameras)
    state.replay.online.extend(new)
    out: dict[str, float] = {"replay_size": float(len(state.replay)), "critic_steps": 0.0}
    if len(state.replay) < cfg.learning_starts:
        return out
    state.update_credit += cfg.utd_ratio * new.batch_size[0]
    steps = int(state.update_credit)
    state.update_credit -= steps
    out.update(sac_steps(policy, optimizer, state, cfg, steps, generator))
    return out


def sac_steps(policy: Any, optimizer: torch.optim.Optimizer, state: SACState, cfg: Any, steps: int,
              generator: torch.Generator | None = None) -> dict[str, float]:
    """``steps`` critic steps on batches from ``state.replay`` (an actor and temperature step every
    ``actor_every``); returns mean diagnostics. Callers that fill the replay themselves (the robot loop's
    learner, episode by episode) call this directly."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    device = next(policy.parameters()).device
    for i in range(steps):
        batch = state.replay.sample(cfg.batch_size).to(device)
        metrics = critic_step(policy, state, batch, cfg, generator)
        # the actor waits until the critics have taken actor_warmup_steps steps (counted over the whole run): an
        # actor started from imitation or offline RL is not pulled by critics that have not yet seen its own data
        if (i + 1) % cfg.actor_every == 0 and state.critic_steps > cfg.actor_warmup_steps:
            metrics.update(actor_step(policy, optimizer, state, batch, cfg))
        metrics["demo_fraction"] = float(batch["is_demo"].float().mean())
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + 1
    out = {k: sums[k] / counts[k] for k in sums}
    out["critic_steps"] = float(steps)
    out["alpha"] = state.log_alpha.detach().exp().item()
    return out


def validate_sac(alg: Any, num_envs: int) -> str | None:
    checks = (
        (alg.num_steps >= 1, f"algorithm.num_steps={alg.num_steps} must be >= 1"),
        (alg.batch_size >= 1, f"algorithm.batch_size={alg.batch_size} must be >= 1"),
        (alg.buffer_size >= alg.batch_size, f"algorithm.buffer_size={alg.buffer_size} must be >= batch_size"),
        (0 < alg.tau <= 1, f"algorithm.tau={alg.tau} must lie in (0, 1]"),
        (alg.utd_ratio > 0, f"algorithm.utd_ratio={alg.utd_ratio} must be > 0"),
        (alg.actor_every >= 1, f"algorithm.actor_every={alg.actor_every} must be >= 1"),
        (alg.learning_starts >= 0, f"algorithm.learning_starts={alg.learning_starts} must be >= 0"),
        (alg.init_alpha > 0, f"algorithm.init_alpha={alg.init_alpha} must be > 0"),
        (alg.q_lr > 0 and alg.alpha_lr > 0, "algorithm.q_lr and algorithm.alpha_lr must be > 0"),
        (alg.num_critics >= 1, f"algorithm.num_critics={alg.num_critics} must be >= 1"),
        (1 <= alg.critic_subset <= alg.num_critics,
         f"algorithm.critic_subset={alg.critic_subset} must lie in [1, num_critics={alg.num_critics}]"),
        (0 <= alg.demo_ratio <= 1, f"algorithm.demo_ratio={alg.demo_ratio} must lie in [0, 1]"),
        (alg.demo_ratio == 0 or alg.demos, f"algorithm.demo_ratio={alg.demo_ratio} needs algorithm.demos=<path> "
                                           f"(write them with scripts/pushcube_expert.py), or set demo_ratio=0"),
        (not alg.demos or Path(alg.demos).exists(),
         f"algorithm.demos='{alg.demos}' does not exist; write demonstrations with scripts/pushcube_expert.py"),
        (alg.num_demos >= 1, f"algorithm.num_demos={alg.num_demos} must be >= 1"),
        (alg.bc_weight >= 0, f"algorithm.bc_weight={alg.bc_weight} must be >= 0 (0 = no imitation term)"),
        (alg.actor_warmup_steps >= 0, f"algorithm.actor_warmup_steps={alg.actor_warmup_steps} must be >= 0"),
        (alg.bc_weight == 0 or alg.demo_ratio > 0,
         f"algorithm.bc_weight={alg.bc_weight} imitates the batch's demonstration rows: set algorithm.demo_ratio > 0 "
         f"with algorithm.demos=<path>, or bc_weight=0"),
        (alg.hl_gauss_v_max > alg.hl_gauss_v_min and alg.hl_gauss_bins >= 2 and alg.hl_gauss_sigma_ratio > 0,
         "algorithm.hl_gauss_* need v_max > v_min, bins >= 2 and sigma_ratio > 0"),
    )
    for ok, msg in checks:
        if not ok:
            return msg
    return choice_problem(alg, "critic_loss", CRITIC_LOSSES) or critics_from_problem(alg)


def critics_from_problem(alg: Any) -> str | None:
    """``algorithm.critics_from`` must name a critics file shaped as this config's ensemble (the input width is
    checked when the env is known, in ``SACState``)."""
    if not alg.critics_from:
        return None
    if not Path(alg.critics_from).is_file():
        return (f"algorithm.critics_from='{alg.critics_from}' does not exist; write one with "
                f"scripts/offline_then_online.py (<out>/offline/critics.pt) or leave it empty")
    try:
        saved = read_critics(alg.critics_from)
    except ValueError as e:
        return str(e)
    out = alg.hl_gauss_bins if alg.critic_loss == "hl_gauss" else 1
    return shape_problem(saved["shape"], {"num": alg.num_critics, "hidden": list(alg.critic_hidden_sizes),
                                          "out": out, "layer_norm": alg.critic_layer_norm})


for _name in ("sac", "rlpd"):
    register_algorithm(AlgorithmSpec(name=_name, update=sac_update, validate=validate_sac,
                                     discount=lambda alg: alg.gamma, make_state=make_sac_state,
                                     check_policy=actor_problem, replays_stale_data=True))
