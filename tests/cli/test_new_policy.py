"""A new policy family is two files written outside the package: a module (its config dataclass beside its
``@register_policy`` class) and a YAML in a ``policy/`` config folder. ``vlarl-train plugins=[module]
hydra.searchpath=[file://<dir>]`` imports the module before composing and trains the family through the real
runner (Ray workers, ManiSkill PushCube) with PPO; its checkpoint loads back with ``Policy.from_pretrained`` as
the plugin's class. No file of vlarl, policies/ or configs/ is edited. (docs/extending.md walks through it.)"""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.helpers.plugins import one_line_refusal, train, write_plugin

# A linear Gaussian chunk policy with a linear value head: the smallest thing PPO can train.
MODULE = '''
"""A linear Gaussian chunk policy, registered from outside vlarl (tests/cli/test_new_policy.py)."""
from dataclasses import dataclass

import torch
from torch import nn

from policies.base import ActionSample, Policy, as_float_tensor
from policies.registry import register_policy


@dataclass
class LinearPolicyConfig:
    name: str = "linear_plugin"
    chunk_size: int = 2
    init_log_std: float = -0.5


@register_policy("linear_plugin", LinearPolicyConfig)
class LinearPolicy(Policy):
    """mean [B, T, A] = W state + b; log std per chunk step and action dim; value = v . state + c."""

    def __init__(self, config, spec):
        super().__init__(config, spec)
        T, A = config.chunk_size, spec.action_dim
        self.actor = nn.Linear(spec.state_dim, T * A)
        nn.init.zeros_(self.actor.weight)
        nn.init.zeros_(self.actor.bias)
        self.log_std = nn.Parameter(torch.full((T, A), config.init_log_std))
        self.critic = nn.Linear(spec.state_dim, 1)

    def _dist(self, obs):
        s = as_float_tensor(obs["state"])
        mean = self.actor(s).view(s.shape[0], self.config.chunk_size, self.spec.action_dim)
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean)), self.critic(s).squeeze(-1)

    @torch.no_grad()
    def sample(self, obs):
        dist, value = self._dist(obs)
        a = dist.sample()
        return ActionSample(a, dist.log_prob(a), value, {"actions": a})

    def evaluate(self, obs, replay):
        dist, value = self._dist(obs)
        return dist.log_prob(replay["actions"]), dist.entropy(), value

    @torch.no_grad()
    def act(self, obs):
        return self._dist(obs)[0].mean

    @torch.no_grad()
    def value(self, obs):
        return self._dist(obs)[1]
'''

YAML = """\
# A linear Gaussian chunk policy from a plugin module (plugins=[linear_plugin])
defaults:
  - linear_plugin_schema
  - _self_
chunk_size: 2
"""


@pytest.fixture
def plugin(tmp_path) -> dict:
    p = write_plugin(tmp_path, "linear_plugin", MODULE, "policy", YAML)
    return {**p, "common": [*p["args"], "policy=linear_plugin"]}


def test_a_plugin_policy_refuses_what_it_cannot_do(plugin, tmp_path):
    """Its own keys only, and the capability checks of the algorithms apply to it like to a built-in family:
    one line, exit 2, nothing written."""
    cases = [(["policy.hidden_sizes=[8]"], "unknown config key 'policy.hidden_sizes'"),
             (["algorithm=sac"], "algorithm=sac needs reparameterized sampling")]
    for extra, needle in cases:
        p = train([*plugin["common"], *extra, f"run_dir={tmp_path / 'never'}"], plugin["env"], tmp_path)
        assert one_line_refusal(p, needle), (extra, p.stderr[-2000:])
    assert not (tmp_path / "never").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.sim
def test_a_plugin_policy_trains_through_vlarl_train(plugin, tmp_path):
    run_dir = tmp_path / "run"
    args = [*plugin["common"], "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=4",
            "algorithm.num_minibatches=1", "algorithm.update_epochs=2", "total_env_steps=48", "eval.episodes=2",
            "eval.num_envs=2", "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false",
            "logger.tensorboard=false", "checkpoint_every=1", f"run_dir={run_dir}"]
    p = train(args, plugin["env"], tmp_path)
    assert p.returncode == 0, f"vlarl-train failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "train/policy_loss" in r]
    assert len(updates) == 3 and all(math.isfinite(r["train/policy_loss"]) for r in updates)  # 48 / (2 x 4 x 2)
    assert (run_dir / "eval" / "eval.json").is_file()

    import torch

    from policies import Policy
    from policies.registry import _REGISTRY

    sys.path.insert(0, str(plugin["mods"]))
    try:  # a plugin family's checkpoint loads once its module is imported (it registers the family)
        import linear_plugin  # noqa: F401

        first, last = (Policy.from_pretrained(run_dir / "checkpoints" / f"iter_{i:06d}") for i in (1, 3))
    finally:  # this test process's registry goes back to the built-in families
        sys.path.remove(str(plugin["mods"]))
        _REGISTRY.pop("linear_plugin", None)
        sys.modules.pop("linear_plugin", None)
    assert type(last).__name__ == "LinearPolicy" and last.name == "linear_plugin"
    assert not torch.equal(first.actor.weight, last.actor.weight), "PPO never changed the plugin's actor"
