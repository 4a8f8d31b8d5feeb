"""Dense per-chunk rewards from a process-reward critic, mixed with the env reward.

Pure functions on [N, B] tensors (N = chunk steps, B = envs), plus ``apply_process_reward``: the one call
the runner makes after ``collect`` to turn a ``Trajectory`` into one whose ``rewards`` are

    rewards = env_weight * r_env + critic_weight * r_critic

Frames: ``frames[t]`` is the observation a chunk step started from (``traj.obs["images"][camera][t]``)
and ``next_frames[t]`` the frame at the end of that chunk step: the final observation where the
episode ended inside the chunk, else the next observation. The rollout worker stores the latter in
``traj.next_images[camera]`` (``vlarl.data.builder.TrajectoryBuilder``).

Reward modes (``RewardConfig.mode``):
    delta      r_t = progress(frames[t] -> next_frames[t])                    (per-step delta)
    potential  r_t = gamma * phi(next_t) * (1 - terminated_t) - phi(frames[t]),
               phi(x) = progress(episode's first frame -> x)                 (potential-based shaping;
               gamma = reward.potential_gamma, or algorithm.gamma when that is < 0. With 1.0 the rewards
               of an episode sum to its final progress: a dense reward, not a policy-invariant shaping)
    terminal   r_t = phi(next_t) where the episode ended in step t, else 0   (one reward per episode)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

REWARD_MODES = ("delta", "potential", "terminal")


@dataclass
class RewardConfig:
    """The ``reward`` config group: which process reward (if any) is added to the env reward."""

    name: str = "none"  # "none" | "vlm_critic"
    critic_path: str = ""  # a directory written by ProcessRewardCritic.save_pretrained
    mode: str = "delta"  # "delta" | "potential" | "terminal"
    env_weight: float = 1.0
    critic_weight: float = 1.0
    camera: str = ""  # image key the critic reads; "" = the first camera of the env
    batch_size: int = 64  # frame pairs per critic forward
    reference_path: str = ""  # episodes.npz with a successful episode used as in-context reference; "" = none
    reference_frames: int = 4
    done_threshold: float = 0.5
    # done_prob > done_threshold counts as termination in traj.dones (GAE stops bootstrapping there), for runs
    # without a success detector; resetting those envs is the runner's part (see apply_process_reward)
    done_ends_episode: bool = False
    # a directory: every scored rollout's complete episodes (the critic's frames + env success) are saved
    # there as rollout_<k>.npz, to fine-tune the critic on (scripts/train_critic.py train --data <dir> --init ...)
    save_episodes: str = ""
    potential_gamma: float = -1.0  # discount in mode=potential; < 0 = algorithm.gamma (Ng et al.'s shaping)
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        return self.name != "none"


def validate_reward_config(cfg: RewardConfig) -> None:
    """One-line errors naming the key and the fix."""
    if cfg.name not in ("none", "vlm_critic"):
        raise ValueError(f"reward.name='{cfg.name}' is unknown; choose reward=none or reward=vlm_critic")
    if not cfg.enabled:
        return
    if cfg.mode not in REWARD_MODES:
        raise ValueError(f"reward.mode='{cfg.mode}' is unknown; choose one of {list(REWARD_MODES)}")
    if not cfg.critic_path:
        raise ValueError("reward.critic_path is empty; set it to a critic trained with scripts/train_critic.py")
    if cfg.batch_size < 1:
        raise ValueError(f"reward.batch_size={cfg.batch_size} must be >= 1")
    if not 0.0 <= cfg.done_threshold <= 1.0:
        raise ValueError(f"reward.done_threshold={cfg.done_threshold} must lie in [0, 1]")
    if cfg.potential_gamma > 1.0:
        raise ValueError(f"reward.potential_gamma={cfg.potential_gamma} must be <= 1 (or < 0 for algorithm.gamma)")


def reward_camera(cfg: RewardConfig, image_keys: list[str] | tuple[str, ...]) -> str:
    """The camera the critic reads: ``reward.camera`` or the env's first one (clear error when there is none)."""
    keys = list(image_keys)
    if cfg.camera:
        if cfg.camera not in keys:
            raise ValueError(f"reward.camera='{cfg.camera}' is not among the env's cameras {keys}")
        return cfg.camera
    if not keys:
        raise ValueError("reward=vlm_critic needs camera images; use an env with obs_mode=rgb")
    return keys[0]


def mix_rewards(r_env: torch.Tensor, r_critic: torch.Tensor, env_weight: float, critic_weight: float) -> torch.Tensor:
    """env_weight * r_env + critic_weight * r_critic (same shape)."""
    if r_env.shape != r_critic.shape:
        raise ValueError(f"env reward {tuple(r_env.shape)} and critic reward {tuple(r_critic.shape)} differ in shape")
    return env_weight * r_env + critic_weight * r_critic


def episode_ended(dones: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """bool [N, B]: an episode ended (terminated or truncated) inside chunk step t."""
    return (dones > 0) | (truncated > 0)


def episode_start_frames(frames: torch.Tensor, ended: torch.Tensor, carry: torch.Tensor | None) -> torch.Tensor:
    """First frame of the episode each step belongs to: uint8 [N, B, H, W, 3].

    frames: [N, B, H, W, 3]; ended: bool [N, B]; carry: [B, H, W, 3] start frames of the episodes running
    when the trajectory began (None = they began at frames[0]). After an end at t, frames[t+1] (the reset
    observation) starts the next episode.
    """
    N = frames.shape[0]
    start = torch.empty_like(frames)
    cur = frames[0].clone() if carry is None else carry.clone()
    for t in range(N):
        start[t] = cur
        if t + 1 < N:
            m = ended[t]
            cur[m] = frames[t + 1][m]
    return start


def potential_shaping(phi: torch.Tensor, phi_next: torch.Tensor, terminated: torch.Tensor, gamma: float) -> torch.Tensor:
    """gamma * phi(s') * (1 - terminated) - phi(s): Ng et al.'s shaping, which keeps optimal policies."""
    return gamma * phi_next * (1.0 - terminated.float()) - phi


def phi_of_current(phi_next: torch.Tensor, ended: torch.Tensor, carry_phi: torch.Tensor | None) -> torch.Tensor:
    """phi(frames[t]) from phi(next_frames[t-1]): 0 at an episode's first frame (progress from itself).

    phi_next, ended: [N, B]; carry_phi: [B] phi of the frame the trajectory starts from (None = 0).
    """
    phi = torch.zeros_like(phi_next)
    if carry_phi is not None:
        phi[0] = carry_phi
    phi[1:] = torch.where(ended[:-1], torch.zeros_like(phi_next[:-1]), phi_next[:-1])
    return phi


def terminal_reward(phi_next: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
    """Episode progress paid once, at the chunk step where the episode ended."""
    return torch.where(ended, phi_next, torch.zeros_like(phi_next))


def episode_sums(step_rewards: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
    """[N, B]: the sum of ``step_rewards`` over each episode, at the step where it ended (0 elsewhere).

    Steps before a column's first end are summed from the trajectory's start (GRPO episodes start there).
    """
    run = torch.zeros_like(step_rewards[0])
    out = torch.zeros_like(step_rewards)
    for t in range(step_rewards.shape[0]):
        run = run + step_rewards[t]
        out[t] = torch.where(ended[t], run, torch.zeros_like(run))
        run = torch.where(ended[t], torch.zeros_like(run), run)
    return out


def critic_done_terminations(done_prob: torch.Tensor, threshold: float) -> torch.Tensor:
    """float [N, B]: 1 where the critic says the task is done (for runs without a success detector)."""
    return (done_prob > threshold).float()


def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a worker method on a plain object or a Ray actor handle."""
    if hasattr(method, "remote"):
        import ray

        return ray.get(method.remote(*args, **kwargs))
    return method(*args, **kwargs)


def save_rollout_episodes(traj: Any, camera: str, ended: torch.Tensor, directory: str, fresh: bool) -> int:
    """Write the complete episodes of ``traj`` (critic frames, env success) to ``directory/rollout_<k>.npz``."""
    from pathlib import Path

    from policies.critics.rollouts import split_rollout
    from vlarl.data.critic_episodes import save_episodes

    traj.require("episode_success", f"next_images.{camera}", why="reward.save_episodes")
    eps = split_rollout(traj.obs["images"][camera], traj.next_images[camera], ended, traj.episode_success,
                        list(traj.obs["instruction"]), starts_fresh=fresh)
    if eps:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_episodes(d / f"rollout_{len(list(d.glob('rollout_*.npz'))):05d}.npz", eps)
    return len(eps)


def apply_process_reward(traj: Any, worker: Any, cfg: RewardConfig, gamma: float,
                         fresh_episodes: bool = False) -> dict[str, float]:
    """Replace ``traj.rewards`` by the mix of env and critic reward; returns metrics to log.

    traj: a ``vlarl.data.Trajectory`` that holds ``next_images[camera]`` [N, B, H, W, 3];
    worker: a ``RewardWorker`` or its Ray actor handle. Keeps the env reward in ``extras["env_reward"]``
    and writes ``extras["critic_reward"]`` and ``extras["critic_done_prob"]`` ([N, B] each). Where the
    trajectory records ``episode_return`` (GRPO scores episodes by it), that becomes the mixed
    episode return too (the env's is kept in ``extras["env_episode_return"]``).
    fresh_episodes: every env started a new episode at the trajectory's first step (GRPO groups), so the
    worker forgets the episodes it carried over from the last call.
    """
    if not cfg.enabled:
        return {}
    camera = reward_camera(cfg, list(traj.obs["images"]))
    traj.require(f"next_images.{camera}", why="the process reward's critic")
    ended = episode_ended(traj.dones, traj.truncated)
    if fresh_episodes:
        _call(worker.reset_state)
    if cfg.potential_gamma >= 0:
        gamma = cfg.potential_gamma
    out = _call(worker.critic_rewards, traj.obs["images"][camera], traj.next_images[camera], ended, traj.dones,
                list(traj.obs["instruction"]), gamma)
    r_env = traj.rewards
    traj.extras["env_reward"] = r_env
    traj.extras["critic_reward"] = out["reward"]
    traj.extras["critic_done_prob"] = out["done_prob"]
    traj.rewards = mix_rewards(r_env, out["reward"], cfg.env_weight, cfg.critic_weight)
    if traj.episode_return is not None:
        traj.extras["env_episode_return"] = ret = traj.episode_return
        traj.episode_return = cfg.env_weight * ret + cfg.critic_weight * episode_sums(out["reward"], ended)
    if cfg.save_episodes:
        save_rollout_episodes(traj, camera, ended, cfg.save_episodes, fresh_episodes)
    if cfg.done_ends_episode:
        traj.dones = torch.maximum(traj.dones, critic_done_terminations(out["done_prob"], cfg.done_threshold))
    return {
        "reward/env": float(r_env.mean()),
        "reward/critic": float(out["reward"].mean()),
        "reward/mixed": float(traj.rewards.mean()),
        "reward/critic_done_rate": float((out["done_prob"] > cfg.done_threshold).float().mean()),
    }
