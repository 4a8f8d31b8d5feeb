"""RLPD learns: from a few demonstrations and a sparse success reward, the squashed actor's success rate on a
tiny task rises well above where it started. An update that does not learn (a no-op, a sign error in the actor
loss, demonstrations never mixed in) leaves the success rate where it was, and the test fails.

The task is a contextual bandit with a sparse reward, the smallest setting RLPD's parts all act in: the state
``s`` is drawn in [-1, 1]^2, the policy emits one chunk of one action, and the episode succeeds (reward 1,
terminated) when the action lies within ``TOLERANCE`` of ``s_0 / 2``. A fresh actor succeeds ~10% of the time;
the demonstrations are the expert's ``a = s_0 / 2``, written as a ManiSkill-style .h5 like the scripted experts'."""

from dataclasses import replace

import h5py
import numpy as np
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from tests.helpers.chunk_bandit import one_step_trajectory
from vlarl.algorithms.registry import algorithm_spec
from vlarl.algorithms.sac import sac_update
from vlarl.config.schema import RLPDConfig

D, A, B = 2, 1, 32
TOLERANCE = 0.1
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0], action_high=[1.0])
POLICY = MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=1, squash=True, normalize_obs=False, activation="relu")
CFG = RLPDConfig(num_steps=1, batch_size=64, learning_starts=32, utd_ratio=1.0, num_critics=4, critic_subset=2,
                 critic_hidden_sizes=[32, 32], gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3,
                 init_alpha=0.01, max_grad_norm=0.0, demo_ratio=0.5, num_demos=8)


def _obs(state: torch.Tensor) -> dict:
    return {"state": state, "images": {}, "instruction": []}


def _success(actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """actions [B, 1, 1], state [B, D] -> float [B, 1]: 1 where the action is within TOLERANCE of s_0 / 2."""
    return ((actions[..., 0] - state[:, :1] / 2).abs() < TOLERANCE).float()


def _write_demos(path, episodes: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        for i in range(episodes):
            s = rng.uniform(-1, 1, D).astype(np.float32)
            g = f.create_group(f"traj_{i}")
            g.create_dataset("obs", data=np.stack([s, s]))  # [L + 1, D]: the state, then the one after
            g.create_dataset("actions", data=np.array([[s[0] / 2]], np.float32))  # [L, A]


def success_rate(policy: MLPPolicy, episodes: int = 256) -> float:
    """Held-out success of the sampling policy (the one that collects), on fixed states."""
    g = torch.Generator().manual_seed(123)
    state = torch.rand(episodes, D, generator=g) * 2 - 1
    with torch.no_grad():
        return float(_success(policy.sample(_obs(state)).actions, state).mean())


def _train(tmp_path, iterations: int, update=sac_update) -> tuple[float, float]:
    _write_demos(tmp_path / "demos.h5", CFG.num_demos)
    cfg = replace(CFG, demos=str(tmp_path / "demos.h5"))
    torch.manual_seed(0)
    policy = MLPPolicy(POLICY, SPEC)
    state = algorithm_spec("rlpd").make_state(policy, cfg, SPEC)
    assert len(state.replay.demos) == cfg.num_demos  # one chunk transition per demonstrated step
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    start = success_rate(policy)
    for _ in range(iterations):
        s = torch.rand(B, D, generator=g) * 2 - 1
        with torch.no_grad():
            sample = policy.sample(_obs(s))
        update(policy, opt, one_step_trajectory(s, sample, _success(sample.actions, s), []), cfg, g, state=state)
    return start, success_rate(policy)


def test_rlpd_from_a_few_demonstrations_beats_its_starting_success(tmp_path):
    start, end = _train(tmp_path, iterations=40)
    assert start < 0.25, start  # the task is hard for the fresh actor ...
    assert end > 0.6 and end > start + 0.4, (start, end)  # ... and RLPD learned it


def test_an_update_that_does_not_learn_fails_the_same_check(tmp_path):
    """The check above is not met by chance: with the update replaced by one that only fills the replay, the
    success rate stays where it started."""

    def fill_only(policy, opt, traj, cfg, g, state):
        from vlarl.algorithms.replay import trajectory_transitions

        state.replay.online.extend(trajectory_transitions(traj))
        return {}

    start, end = _train(tmp_path, iterations=40, update=fill_only)
    assert not (end > 0.6 and end > start + 0.4), (start, end)
