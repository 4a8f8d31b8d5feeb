"""Tiny observations and a fake PPO trajectory shared by the VLA family tests (imported by them)."""

from __future__ import annotations

import torch

from policies.base import Policy

torch.set_num_threads(1)
INSTRUCTIONS = ["push the cube to the goal", "pick up the red cube", "open the drawer"]



def make_obs(B: int = 3, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "images": {k: torch.randint(0, 256, (B, 40, 40, 3), dtype=torch.uint8, generator=g) for k in ("base", "wrist")},
        "state": torch.randn(B, 5, generator=g),
        "instruction": [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(B)],
    }



def openvla_config(architecture: str, **kw):
    """The config of ``policy=openvla`` / ``openvla_oft`` by family name; OpenVLA has only the token head, so its
    config has no ``action_head`` (``action_head="tokens"`` is dropped for it)."""
    from policies.registry import policy_config_class

    if architecture == "openvla" and kw.get("action_head", "tokens") == "tokens":
        kw.pop("action_head", None)
    return policy_config_class(architecture)(**kw)


def trainable(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def ppo_step(policy: Policy, N: int = 2, B: int = 2, logprob_level: str = "token",
             words: list[str] | None = None) -> dict[str, float]:
    """Roll a fake N x B trajectory with ``policy.sample`` and run one ``ppo_update``; returns its stats.
    ``words``: instructions instead of ``INSTRUCTIONS`` (a checkpoint whose prompt keeps fewer tokens)."""
    from vlarl.algorithms.ppo import ppo_update
    from vlarl.config.schema import PPOConfig
    from vlarl.data.trajectory import Trajectory, stack_obs

    g = torch.Generator().manual_seed(3)
    obs_list, samples = [], []
    for i in range(N):
        o = make_obs(B, seed=10 + i)
        if words:
            o["instruction"] = [words[j % len(words)] for j in range(B)]
        obs_list.append(o)
        samples.append(policy.sample(o))
    stacked = stack_obs(obs_list)
    traj = Trajectory(
        obs=stacked,
        replay={k: torch.stack([s.replay[k] for s in samples]) for k in samples[0].replay},
        logprob=torch.stack([s.logprob for s in samples]),
        values=torch.stack([s.value for s in samples]),
        rewards=torch.randn(N, B, generator=g),
        dones=torch.zeros(N, B),
        truncated=torch.zeros(N, B),
        final_values=torch.zeros(N, B),
        next_value=torch.zeros(B),
    )
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, lr=1e-3, logprob_level=logprob_level, target_kl=0.0)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    return ppo_update(policy, opt, traj, cfg, generator=torch.Generator().manual_seed(0))


def assert_ppo_changes_weights(policy: Policy, **kw) -> None:
    before = trainable(policy)
    stats = ppo_step(policy, **kw)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != "explained_variance"), stats
    after = dict(policy.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n].detach())]
    assert changed, "ppo_update left every trainable weight unchanged"
    assert any(n.startswith("backbone.") for n in changed), "the VLM backbone was not updated"
