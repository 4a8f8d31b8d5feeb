"""A new algorithm is two files written outside the package: a module (its config dataclass beside its
``register_algorithm``) and a YAML. ``vlarl-train plugins=[module] hydra.searchpath=[file://<dir>]`` imports the
module before composing, finds the YAML on Hydra's search path, and trains it through the real runner (Ray
workers, ManiSkill PushCube); no file of vlarl or configs/ is edited. The algorithm accepts only its own keys,
and the policy capability it declares is checked at config load like a built-in's."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.plugins import one_line_refusal, train, train_refusals, write_plugin

# Vanilla REINFORCE over chunk steps: loss = -mean(log pi(chunk) * (G - mean G)), G the discounted return-to-go
# inside the batch. It reads only its own keys (gamma, normalize) and the base's (name, lr, num_steps, anneal_lr).
MODULE = '''
"""REINFORCE, registered from outside vlarl (tests/cli/test_new_algorithm.py)."""
from dataclasses import dataclass

import torch

from policies.capabilities import REPARAMETERIZED
from vlarl.algorithms.spec import AlgorithmConfig, AlgorithmSpec, register_algorithm


@dataclass
class ReinforceConfig(AlgorithmConfig):
    name: str = "reinforce_plugin"
    num_steps: int = 4
    gamma: float = 0.9
    normalize: bool = True  # subtract the batch mean return (a baseline) and divide by its std


def returns_to_go(rewards, ended, gamma):
    """rewards, ended: [N, B] -> discounted returns within each episode [N, B]."""
    out, running = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running * (1.0 - ended[t])
        out[t] = running
    return out


def update(policy, optimizer, traj, cfg, generator=None, reference=None, version=0):
    ended = (traj.dones.bool() | traj.truncated.bool()).float()
    g = returns_to_go(traj.rewards, ended, cfg.gamma)
    adv = g - g.mean()
    if cfg.normalize:
        adv = adv / (adv.std() + 1e-8)
    logprob, _, _ = policy.evaluate(traj.flat_obs(), {k: traj.flat(v) for k, v in traj.replay.items()})
    loss = -(logprob.sum((-2, -1)) * traj.flat(adv)).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {"policy_loss": float(loss.detach()), "return_mean": float(g.mean())}


def validate(alg, num_envs):
    if not 0.0 <= alg.gamma <= 1.0:
        return f"algorithm.gamma={alg.gamma} must lie in [0, 1]"
    return None


register_algorithm(AlgorithmSpec(name="reinforce_plugin", config=ReinforceConfig, update=update,
                                 validate=validate, discount=lambda alg: alg.gamma,
                                 requires=(REPARAMETERIZED,)))
'''

YAML = """\
# REINFORCE from a plugin module (plugins=[reinforce_plugin])
defaults:
  - reinforce_plugin_schema
  - _self_
gamma: 0.8
"""


@pytest.fixture
def plugin(tmp_path) -> dict:
    """The two files, in a folder that is not vlarl's: ``<tmp>/mods/reinforce_plugin.py`` and
    ``<tmp>/configs/algorithm/reinforce_plugin.yaml``."""
    return write_plugin(tmp_path, "reinforce_plugin", MODULE, "algorithm", YAML)


def test_a_plugin_algorithm_refuses_keys_and_policies_it_does_not_take(plugin, tmp_path):
    """Refusals of the plugin's own config and declared capability: one line, exit 2, nothing written."""
    common = [*plugin["args"], "algorithm=reinforce_plugin"]
    cases = [
        (["policy.squash=true", "algorithm.num_minibatches=4"], "unknown config key 'algorithm.num_minibatches'. "
         "Valid keys of algorithm: ['anneal_lr', 'gamma', 'lr', 'name', 'normalize', 'num_steps']"),
        ([], "algorithm=reinforce_plugin needs reparameterized sampling"),  # policy=mlp unsquashed
        (["policy.squash=true", "algorithm.gamma=2"], "algorithm.gamma=2.0 must lie in [0, 1]"),
    ]
    runs = [[*common, *extra, f"run_dir={tmp_path / 'never'}"] for extra, _ in cases]
    *answers, p = train_refusals([*runs, ["plugins=[no_such_module]", f"run_dir={tmp_path / 'never'}"]],
                                 plugin["env"], tmp_path)
    for (extra, needle), answer in zip(cases, answers, strict=True):
        assert one_line_refusal(answer, needle), (extra, answer.stderr[-2000:])
    assert p.returncode == 2 and "plugins: cannot import module 'no_such_module'" in p.stderr
    assert not (tmp_path / "never").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.sim
def test_a_plugin_algorithm_trains_through_vlarl_train(plugin, tmp_path):
    run_dir = tmp_path / "run"
    args = [*plugin["args"], "algorithm=reinforce_plugin", "policy.squash=true",
            "policy.chunk_size=2", "policy.hidden_sizes=[16,16]", "env.num_envs=2", "env.num_workers=1",
            "algorithm.num_steps=4", "algorithm.lr=1e-2", "total_env_steps=48", "eval.episodes=2", "eval.num_envs=2",
            "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false", "logger.tensorboard=false",
            "checkpoint_every=1", f"run_dir={run_dir}"]
    p = train(args, plugin["env"], tmp_path)
    assert p.returncode == 0, f"vlarl-train failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "train/policy_loss" in r]
    assert len(updates) == 3  # 48 env steps / (2 envs x 4 chunk steps x chunk 2)
    assert all(math.isfinite(r["train/policy_loss"]) and "train/return_mean" in r for r in updates)
    saved = (run_dir / "config.yaml").read_text()
    assert "name: reinforce_plugin" in saved and "gamma: 0.8" in saved and "reinforce_plugin" in saved.split("plugins:")[1]

    import torch

    from policies import Policy

    torch.set_num_threads(1)
    first, last = (Policy.from_pretrained(run_dir / "checkpoints" / f"iter_{i:06d}") for i in (1, 3))
    moved = [not torch.equal(a, b) for (n, a), (_, b) in zip(first.named_parameters(), last.named_parameters(),
                                                             strict=True) if n.startswith("actor")]
    assert any(moved), "the plugin's updates after the first never changed the actor"
