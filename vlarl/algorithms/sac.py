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
gives critics over the raw state, as before. A CNN policy with ``critic_shares_encoder`` hands the critics its own
CNN instead (DrQ-v2): the critic loss trains it and the actor step reads it with its gradient stopped
(``SACState.shared_params``). ``algorithm.image_shift`` shifts every replayed frame (DrQ, ``image_aug``).

``algorithm=rlpd`` is the same update with RLPD's settings (10 critics, subsets of 2, 50/50 demonstrations).
The critics, targets, temperature, their optimizers and the replay buffer live in ``SACState`` (built once by the
actor worker through ``AlgorithmSpec.make_state`` and saved beside each checkpoint).
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from policies.capabilities import REPARAMETERIZED, critic_cameras
from policies.processors.normalize import RunningNormalize
from vlarl.algorithms.chunk_td import chunk_td_target
from vlarl.algorithms.critic_files import read_critics, shape_problem
from vlarl.algorithms.hl_gauss import HLGaussSupport, bins_to_value, hl_gauss_loss
from vlarl.algorithms.image_aug import shift_batch
from vlarl.algorithms.optim_state import load_keeping_config
from vlarl.algorithms.q_ensemble import QEnsemble
from vlarl.algorithms.replay import InstructionIds, MixedReplay, demo_transitions, trajectory_transitions
from vlarl.algorithms.soft_critic_config import (
    RLPDConfig,
    SACConfig,
    SoftCriticConfig,
    validate_sac,
)
from vlarl.algorithms.spec import (
    AlgorithmConfig,
    AlgorithmSpec,
    register_algorithm,
    unused_value_head_problem,
)
from vlarl.data.trajectory import Trajectory

MAX_REPLAY_IMAGE_BYTES = 4 * 2**30  # camera images a pixel replay may hold (obs and next obs, uint8)


def actor_problem(policy: Any, cfg: Any) -> str | None:
    """SAC's actor must be tanh-squashed with a reparameterized sample (``REPARAMETERIZED``, also declared in the
    spec's ``requires`` and checked at config load), then ``replay_problem``."""
    return REPARAMETERIZED.refusal(policy, f"algorithm={cfg.name}") or replay_problem(policy, cfg)


def replay_problem(policy: Any, cfg: Any) -> str | None:
    """What every actor of a ``SACConfig`` update needs of its replay: a pixel actor's replay must fit in memory
    and its demonstrations must hold the frames it reads (and the critic states critics on the scene read)."""
    return (pixel_demos_problem(policy, cfg) or replay_memory_problem(policy, cfg) or image_shift_problem(policy, cfg)
            or critic_obs_problem(policy, cfg) or critic_state_demos_problem(policy, cfg)
            or unused_value_head_problem(policy, cfg, " (its own critics take algorithm.critic_loss=hl_gauss)"))


def pixel_demos_problem(policy: Any, cfg: SACConfig) -> str | None:
    """A pixel actor (a policy whose critics read cameras) replays demonstrations with the frames of every camera
    it reads, at the size its env renders; a file without them (state-only demonstrations) is refused.
    ``algorithm.demos=auto`` passes: it is made from the run's own env (``vlarl.demos``), frames included."""
    cameras = critic_cameras(policy)
    if not cfg.demos or cfg.demos == "auto" or not cameras or not Path(cfg.demos).exists():
        return None
    from vlarl.data.demonstrations import MAKE_IMAGE_DEMOS, demo_cameras

    held = demo_cameras(cfg.demos)
    missing = [c for c in cameras if c not in held]
    if missing:
        what = "state-only demonstrations" if not held else f"frames of cameras {sorted(held)}"
        return (f"algorithm.demos='{cfg.demos}' holds {what} but policy={policy.config.name} reads camera(s) "
                f"{missing}: make demonstrations with images ({MAKE_IMAGE_DEMOS}), or set algorithm.demos='' "
                f"algorithm.demo_ratio=0")
    size = tuple(policy.spec.image_size or ())
    wrong = {c: held[c] for c in cameras if size and held[c] != size}
    if wrong:
        return (f"algorithm.demos='{cfg.demos}' holds {wrong} frames but the env renders {size}: make them again "
                f"at this size ({MAKE_IMAGE_DEMOS})")
    return None


def image_shift_problem(policy: Any, cfg: SACConfig) -> str | None:
    """``algorithm.image_shift`` shifts the frames pixel critics read; a policy whose critics read no camera
    would ignore it."""
    if cfg.image_shift and not critic_cameras(policy):
        return (f"algorithm.image_shift={cfg.image_shift} shifts camera frames but policy={policy.config.name}'s "
                f"critics read none: set algorithm.image_shift=0, or use a pixel actor (policy=cnn)")
    return None


def critic_obs_problem(policy: Any, cfg: SoftCriticConfig) -> str | None:
    """``algorithm.critic_obs=critic_state`` needs an env that reports ``obs['critic_state']`` (the policy's spec
    has its width)."""
    if cfg.critic_obs == "critic_state" and int(policy.spec.critic_state_dim or 0) < 1:
        return ("algorithm.critic_obs=critic_state reads obs['critic_state'], which this env does not report: set "
                "env.critic_state=true (env=maniskill_multitask*) or algorithm.critic_obs=policy")
    return None


ADD_CRITIC_STATE = "python scripts/demo_critic_state.py --demos <file> --out <new file> -- <the run's overrides>"


def critic_state_demos_problem(policy: Any, cfg: SACConfig) -> str | None:
    """Demonstrations beside critics on the scene state need the same ``critic_state`` online rows have
    (``simulators.critic_state_replay`` adds them); ``algorithm.demos=auto`` makes files without them. Checked at
    config load, where the spec's width is a placeholder; ``SACState`` checks the width against the env's."""
    if cfg.critic_obs != "critic_state" or not cfg.demos or cfg.demo_ratio == 0:
        return None
    if cfg.demos == "auto" or not Path(cfg.demos).exists():
        return (f"algorithm.critic_obs=critic_state with algorithm.demos='{cfg.demos}': the critics need each "
                f"demonstration's critic_state; make the demonstrations, then add it ({ADD_CRITIC_STATE}), or set "
                f"algorithm.demo_ratio=0 algorithm.demos=''")
    from vlarl.data.demonstrations import demo_critic_state

    if demo_critic_state(cfg.demos) is None:
        return (f"algorithm.demos='{cfg.demos}' holds no critic_state for algorithm.critic_obs=critic_state: add it "
                f"({ADD_CRITIC_STATE}), or set algorithm.critic_obs=policy")
    return None


def critic_state_width_problem(demos: str, width: int) -> str | None:
    """The demonstrations' critic states must be as wide as the env's (the same tasks and instructions)."""
    from vlarl.data.demonstrations import demo_critic_state

    held = demo_critic_state(demos)
    if held is not None and held["dim"] != width:
        return (f"algorithm.demos='{demos}' holds {held['dim']}-dim critic states (tasks {held['tasks']}) but this "
                f"env's are {width}-dim: add them again for this env ({ADD_CRITIC_STATE})")
    return None


def replay_memory_problem(policy: Any, cfg: SoftCriticConfig) -> str | None:
    """A pixel replay whose images would not fit in memory (``buffer_size`` x 2 (obs, next obs) x cameras x H x W x
    3 bytes over ``MAX_REPLAY_IMAGE_BYTES``)."""
    cameras = critic_cameras(policy)
    if not cameras or not policy.spec.image_size:
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
    """What SAC keeps across updates: critics, target critics, temperature, their optimizers, the replay.

    ``cfg``: any ``SoftCriticConfig``; a ``SACConfig``'s demonstrations and saved critics are loaded too (DSRL's
    config has neither: its replay holds noise choices, which no demonstration or offline critic has)."""

    def __init__(self, policy: Any, cfg: SoftCriticConfig, spec: Any, check: Any = None):
        # ``check(policy, cfg) -> one line or None``: the actor's refusals (default: SAC's reparameterized actor)
        problem = ((check or actor_problem)(policy, cfg) if isinstance(cfg, SACConfig) else
                   REPARAMETERIZED.refusal(policy, f"algorithm={cfg.name}") or replay_memory_problem(policy, cfg)
                   or critic_obs_problem(policy, cfg))
        if problem:
            raise ValueError(problem)
        sac = cfg if isinstance(cfg, SACConfig) else SACConfig(demo_ratio=0.0)  # no demos, no saved critics
        T, A, D = policy.chunk_size, spec.action_dim, spec.state_dim
        device = next(policy.parameters()).device
        self.support = (HLGaussSupport(cfg.hl_gauss_v_min, cfg.hl_gauss_v_max, cfg.hl_gauss_bins,
                                       cfg.hl_gauss_sigma_ratio) if cfg.critic_loss == "hl_gauss" else None)
        out = self.support.num_bins if self.support else 1
        # asymmetric: the critics read the env's privileged critic_state, the actor its own inputs (its cameras'
        # frames stay in the replay for the actor's steps and the next-chunk sample of the TD target)
        self.privileged = cfg.critic_obs == "critic_state"
        # the critics' own image encoder (pixel SAC) or None (the raw state); see ``critic_inputs``
        self.encoder: nn.Module | None = (policy.critic_encoder() if critic_cameras(policy) and not self.privileged
                                          else None)
        self.cameras = list(self.encoder.image_keys) if self.encoder is not None else critic_cameras(policy)
        if self.encoder is not None:
            self.encoder.to(device)
            D = self.encoder.out_dim
        # the privileged state is standardized by running statistics of what enters the replay (demonstrations,
        # then every online transition): its entries span 100x in scale (positions ~0.05, velocities ~1.5)
        self.critic_state_norm: RunningNormalize | None = None
        if self.privileged:
            D = int(policy.spec.critic_state_dim)
            self.critic_state_norm = RunningNormalize("critic_state", D, 10.0).to(device)
        self.q = QEnsemble(D + T * A, list(cfg.critic_hidden_sizes), out, cfg.num_critics, cfg.critic_layer_norm)
        self.q.to(device)
        if sac.critics_from:  # e.g. offline IQL's critics, which trained the actor this run starts from
            saved = read_critics(sac.critics_from)
            problem = shape_problem(saved["shape"], self.q.shape())
            if problem:
                raise ValueError(problem)
            self.q.load_state_dict(saved["q"])
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        if sac.critics_from:
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
        # the critic encoder's weights that are also the policy's (a CNN policy with critic_shares_encoder): the
        # critic loss trains them, and the actor step stops its gradient there (``actor_step``), as DrQ-v2 does
        self.shared_params = shared_parameters(self.encoder, policy)
        self.image_shift = sac.image_shift
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.q_opt = torch.optim.Adam(self.q_params, lr=cfg.q_lr, foreach=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr)
        self.target_entropy = cfg.target_entropy_per_dim * T * A
        self.low = torch.tensor(spec.action_low, dtype=torch.float32, device=device)
        self.high = torch.tensor(spec.action_high, dtype=torch.float32, device=device)
        self.replay = MixedReplay(cfg.buffer_size, sac.demo_ratio, spec.instruction)
        if sac.demos:  # with the frames of the critics' cameras for a pixel actor (pixel_demos_problem)
            from vlarl.data.demonstrations import read_demonstrations

            if self.privileged and (problem := critic_state_width_problem(sac.demos, D)):
                raise ValueError(problem)
            episodes = read_demonstrations(sac.demos, max_episodes=sac.num_demos, cameras=self.cameras)
            demos = demo_transitions(episodes, T, cameras=self.cameras, instructions=self.replay.instructions,
                                     critic_state=self.privileged)
            self.replay.add_demos(demos)
            self.fold_critic_state(demos)
        self.update_credit = 0.0  # fractional gradient steps carried to the next iteration
        self.critic_steps = 0

    def add_online(self, new: Any) -> None:
        """Put online chunk transitions into the replay (their critic states into the statistics)."""
        self.replay.online.extend(new)
        self.fold_critic_state(new)

    def fold_critic_state(self, transitions: Any) -> None:
        if self.critic_state_norm is not None and len(transitions):
            self.critic_state_norm.fold(transitions["critic_state"])

    def values(self, net: QEnsemble, state: torch.Tensor, actions: torch.Tensor,
               members: torch.Tensor | None = None) -> torch.Tensor:
        """Q of every member (or of ``members``) as a scalar: [E, B] (the bins' expectation for an HL-Gauss
        critic)."""
        scaled = 2 * (actions - self.low) / (self.high - self.low) - 1
        out = net(state, scaled, members)
        return bins_to_value(out, self.support) if self.support else out.squeeze(-1)

    def critic_inputs(self, batch: Any, next_obs: bool = False, target: bool = False) -> torch.Tensor:
        """What the critics read of a batch's observations (``next_obs``: the next ones): the raw state [B, D], or
        with an encoder its features of the state and camera images [B, F] (``target``: the polyak copy's), or
        with ``algorithm.critic_obs=critic_state`` the env's privileged state [B, C]."""
        if self.privileged:
            x = batch["next_critic_state" if next_obs else "critic_state"]
            return x if self.critic_state_norm is None else self.critic_state_norm.normalize(x)
        state = batch["next_state" if next_obs else "state"]
        if self.encoder is None:
            return state
        encoder = self.encoder_target if target else self.encoder
        return encoder(replay_obs(batch, self.cameras, next_obs, self.replay.instructions))

    def state_dict(self, with_replay: bool = True) -> dict[str, Any]:
        """``with_replay=False``: leave the replay out (the robot loop rebuilds it from its recorded episodes)."""
        out = {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(), "log_alpha": self.log_alpha.detach(),
               "q_opt": self.q_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(),
               "update_credit": self.update_credit, "critic_steps": self.critic_steps}
        if self.encoder is not None:
            out["encoder"], out["encoder_target"] = self.encoder.state_dict(), self.encoder_target.state_dict()
        if self.critic_state_norm is not None:
            out["critic_state_norm"] = self.critic_state_norm.state_dict()
        if with_replay:
            out["replay"] = self.replay.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        if self.encoder is not None:
            self.encoder.load_state_dict(state["encoder"])
            self.encoder_target.load_state_dict(state["encoder_target"])
        if self.critic_state_norm is not None:  # a state saved before the statistics: its critics read it raw
            if "critic_state_norm" in state:
                self.critic_state_norm.load_state_dict(state["critic_state_norm"])
            else:
                self.critic_state_norm = None
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        load_keeping_config(self.q_opt, state["q_opt"])  # a resume's new algorithm.q_lr / alpha_lr apply
        load_keeping_config(self.alpha_opt, state["alpha_opt"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        self.update_credit = float(state["update_credit"])
        self.critic_steps = int(state["critic_steps"])


def shared_parameters(encoder: nn.Module | None, policy: Any) -> list[nn.Parameter]:
    """The trained parameters of the critics' ``encoder`` that are the policy's own (none for an encoder of its
    own weights)."""
    if encoder is None:
        return []
    mine = {id(p) for p in policy.parameters()}
    return [p for p in encoder.parameters() if p.requires_grad and id(p) in mine]


@contextmanager
def frozen(params: list[nn.Parameter]):
    """``params`` take no gradient inside the block (their ``requires_grad`` is put back after)."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def make_sac_state(policy: Any, cfg: SACConfig, spec: Any) -> SACState:
    return SACState(policy, cfg, spec)


def replay_obs(batch: Any, cameras: list[str], next_obs: bool = False,
               instructions: InstructionIds | None = None) -> dict[str, Any]:
    """A policy observation of a replayed batch: state, the ``cameras``' images (``next_obs``: the next ones) and,
    when the rows kept them, their instructions (``instructions`` turns their ids back into words; rows without
    give none, and the policy uses the env's)."""
    prefix = "next_" if next_obs else ""
    words = (instructions.words(batch["instruction"]) if instructions is not None and "instruction" in batch.keys()
             else [])
    return {"state": batch[f"{prefix}state"], "images": {k: batch[f"{prefix}images", k] for k in cameras},
            "instruction": words}


def clip_grad(params, max_norm: float) -> float:
    """Clip the gradients' global norm to ``max_norm`` (0: no clipping); returns the norm before."""
    params = list(params)
    if max_norm > 0:
        return float(nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))


def critic_step(policy: Any, st: SACState, batch: Any, cfg: Any, generator: torch.Generator | None,
                draw: Any = None) -> dict[str, float]:
    """One gradient step of every critic on ``batch``, then the polyak update of the targets. ``draw(obs) ->
    (actions, logprob)`` gives the next chunk of the TD target (default: ``policy.rsample``)."""
    a = batch["actions"]
    with torch.no_grad():
        a2, logp2 = (draw or policy.rsample)(replay_obs(batch, st.cameras, True, st.replay.instructions))
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
    grad_norm = clip_grad(st.q_params, cfg.max_grad_norm)
    st.q_opt.step()
    with torch.no_grad():
        torch._foreach_lerp_(st.target_params, st.q_params, cfg.tau)
    st.critic_steps += 1
    return {"critic_loss": loss.item() / st.q.num, "q": q.detach().mean().item(), "td_target": y.mean().item(),
            "critic_grad_norm": grad_norm}


def actor_step(policy: Any, optimizer: torch.optim.Optimizer, st: SACState, batch: Any, cfg: SoftCriticConfig,
               bc_weight: float = 0.0) -> dict[str, float]:
    """One step of the actor (max mean-ensemble Q - alpha log pi, plus ``bc_weight`` x ``demo_bc_loss``) and of
    the temperature."""
    with frozen(st.shared_params):  # an encoder shared with the critics is theirs: the actor reads it detached
        actions, logp = policy.rsample(replay_obs(batch, st.cameras, instructions=st.replay.instructions))
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
    bc = demo_bc_loss(actions, batch, st.low, st.high) if bc_weight > 0 else None
    if bc is not None:
        actor_loss = actor_loss + bc_weight * bc
    optimizer.zero_grad(set_to_none=True)
    actor_loss.backward()
    grad_norm = clip_grad([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
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


def sac_update(policy: Any, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: SACConfig,
               generator: torch.Generator | None = None, reference: Any | None = None, version: int = 0,
               state: SACState | None = None) -> dict[str, float]:
    """Add ``traj``'s chunk transitions to the replay, then ``utd_ratio`` critic steps per new transition
    (an actor and temperature step every ``actor_every``); returns mean diagnostics."""
    st = required_state(state, cfg)
    pretrained = demo_pretrain(policy, optimizer, st, cfg, generator)
    out = replay_update(st, trajectory_transitions(traj, st.cameras, st.replay.instructions, st.privileged), cfg,
                        lambda steps: sac_steps(policy, optimizer, st, cfg, steps, generator))
    return {**pretrained, **out}


def demo_pretrain(policy: Any, optimizer: torch.optim.Optimizer, st: SACState, cfg: SACConfig,
                  generator: torch.Generator | None = None) -> dict[str, float]:
    """``cfg.pretrain_updates`` critic steps (and actor steps every ``actor_every``) on batches drawn from the
    demonstrations alone, once, at the first update of a run (no online row and no critic step yet; a resumed run
    has taken steps and skips it). The actor's loss adds ``pretrain_bc_weight`` x ``demo_bc_loss`` in these steps.

    Why: on a task whose reward needs a precise sequence (PickCube's grasp, then the lift to a goal in the air), a
    fresh actor's online episodes almost never succeed, so the critics' only positive labels are the
    demonstrations' and RLPD's 50/50 batches did not bring the actor to a grasp in 14k env steps (0.02 held-out).
    Offline steps first (offline-to-online RL with TD3+BC's actor loss) give an actor that starts near the
    demonstrations (PickCube: 0.47 held-out before any online step) and critics whose values already reach back
    from the demonstrated successes; the online steps start from there (docs/tasks.md, "PickCube: what
    mattered"). Returns ``{"pretrain_steps": n, "pretrain_<metric>": mean}`` ({} when skipped).

    First the demonstrations' states are folded into the actor's running state normalizer (a policy that keeps
    one): at the first update it has seen nothing (identity), and the first rollout it folds in afterwards holds
    only a fresh actor's states (PickCube: the cube resting on the table, variance ~0 in its height), so an actor
    trained offline under one normalization would act under another, and a lifted cube would read as a clipped
    +-10 in every dimension the rollout never varied."""
    if (cfg.pretrain_updates <= 0 or st.critic_steps > 0 or len(st.replay.online) > 0 or st.replay.demos is None
            or len(st.replay.demos) == 0):
        return {}
    demo_states = st.replay.demos.buffer.storage[:len(st.replay.demos)]["state"]
    policy.update_normalization({"state": demo_states.to(st.log_alpha.device)})
    metrics = soft_steps(policy, optimizer, st, cfg, cfg.pretrain_updates,
                         critic=lambda batch: critic_step(policy, st, batch, cfg, generator),
                         bc_weight=cfg.pretrain_bc_weight)  # the replay has no online row: demonstrations only
    return {"pretrain_steps": float(cfg.pretrain_updates),
            **{f"pretrain_{k}": v for k, v in metrics.items() if k not in ("critic_steps", "demo_fraction")}}


def required_state(state: Any, cfg: AlgorithmConfig) -> Any:
    """``state`` (what ``AlgorithmSpec.make_state`` built), or a one-line error when an update got none."""
    if state is None:
        raise ValueError(f"algorithm={cfg.name} keeps a replay buffer: the actor worker builds it with "
                         f"AlgorithmSpec.make_state and passes it as state=")
    return state


def replay_update(st: SACState, new: Any, cfg: SoftCriticConfig, take_steps: Any) -> dict[str, float]:
    """The replay bookkeeping of every soft actor-critic update: put the ``new`` chunk transitions into
    ``st.replay``, then (once ``learning_starts`` rows are in) earn ``utd_ratio`` gradient steps per new row,
    carrying the fraction to the next iteration, and run ``take_steps(steps) -> metrics``."""
    st.add_online(new)
    out: dict[str, float] = {"replay_size": float(len(st.replay)), "critic_steps": 0.0}
    if len(st.replay) < cfg.learning_starts:
        return out
    st.update_credit += cfg.utd_ratio * new.batch_size[0]
    steps = int(st.update_credit)
    st.update_credit -= steps
    out.update(take_steps(steps))
    return out


def sac_steps(policy: Any, optimizer: torch.optim.Optimizer, state: SACState, cfg: SACConfig, steps: int,
              generator: torch.Generator | None = None) -> dict[str, float]:
    """``steps`` critic steps on batches from ``state.replay`` (an actor and temperature step every
    ``actor_every``, once the critics have taken ``actor_warmup_steps``); returns mean diagnostics. Callers that
    fill the replay themselves (the robot loop's learner, episode by episode) call this directly."""
    # the actor waits until the critics have taken actor_warmup_steps steps (counted over the whole run): an
    # actor started from imitation or offline RL is not pulled by critics that have not yet seen its own data
    return soft_steps(policy, optimizer, state, cfg, steps,
                      critic=lambda batch: critic_step(policy, state, batch, cfg, generator),
                      actor_ready=lambda: state.critic_steps > cfg.actor_warmup_steps, bc_weight=cfg.bc_weight)


def soft_steps(policy: Any, optimizer: torch.optim.Optimizer, st: SACState, cfg: SoftCriticConfig, steps: int,
               critic: Any, actor_ready: Any = lambda: True, bc_weight: float = 0.0,
               actor: Any = None) -> dict[str, float]:
    """The loop every soft actor-critic update runs: ``steps`` times sample a batch of ``cfg.batch_size`` from
    ``st.replay``, take ``critic(batch) -> metrics``, and every ``actor_every`` steps (when ``actor_ready()``) an
    actor step on the same batch (``actor(batch) -> metrics``; default SAC's actor and temperature step); returns
    the metrics' means, ``critic_steps`` and ``alpha``."""
    actor = actor or (lambda batch: actor_step(policy, optimizer, st, batch, cfg, bc_weight))
    sums: dict[str, list[float]] = {}
    device = st.log_alpha.device
    for i in range(steps):
        batch = shift_batch(st.replay.sample(cfg.batch_size).to(device), st.cameras, st.image_shift)
        metrics = critic(batch)
        if (i + 1) % cfg.actor_every == 0 and actor_ready():
            metrics.update(actor(batch))
        metrics["demo_fraction"] = float(batch["is_demo"].float().mean())
        for k, v in metrics.items():
            sums.setdefault(k, []).append(v)
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    out["critic_steps"] = float(steps)
    out["alpha"] = st.log_alpha.detach().exp().item()
    return out


for _name, _config in (("sac", SACConfig), ("rlpd", RLPDConfig)):
    register_algorithm(AlgorithmSpec(name=_name, config=_config, update=sac_update, validate=validate_sac,
                                     discount=lambda alg: alg.gamma, requires=(REPARAMETERIZED,),
                                     make_state=make_sac_state, check_policy=actor_problem, replays_stale_data=True))
