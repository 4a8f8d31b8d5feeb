"""A new policy family is two files written outside the package: a module (its config dataclass beside its
``@register_policy`` class, which composes a network, a processor of saved steps and an RL head) and a YAML in
a ``policy/`` config folder. ``vlarl-train plugins=[module]
hydra.searchpath=[file://<dir>]`` imports the module before composing and trains the family through the real
runner (Ray workers, ManiSkill PushCube) with PPO; its checkpoint loads back with ``Policy.from_pretrained`` as
the plugin's class, with its processor (``processor.json`` + statistics) saved and loaded with it. No file of
vlarl, policies/ or configs/ is edited. (docs/extending.md walks through it.)"""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.helpers.plugins import one_line_refusal, train, train_refusals, write_plugin

# The smallest composed family PPO can train: a linear network, a processor of saved steps (the env's cameras
# and state in, env action units out) and the Gaussian RL head from policies/heads.
MODULE = '''
"""A linear Gaussian chunk policy composed of a network, a processor and a head, registered from outside vlarl
(tests/cli/test_new_policy.py)."""
from dataclasses import dataclass, field

import torch
from torch import nn

from policies.base import ActionSample, Policy
from policies.heads.gaussian import GaussianChunkHead
from policies.processors import (CameraMap, ImageSize, ImagesToFloat, Normalize, PadVector, Processor,
                                 RunningNormalize)
from policies.registry import register_policy


@dataclass
class LinearPolicyConfig:
    name: str = "linear_plugin"
    chunk_size: int = 2
    init_log_std: float = -0.5
    max_state_dim: int = 64  # the network's state width (the env's state is zero-padded to it)
    cameras: list[str] = field(default_factory=list)  # env cameras the network reads (their mean colour)
    image_size: int = 0  # a fixed camera size the network needs (0: any)


@register_policy("linear_plugin", LinearPolicyConfig)
class LinearPolicy(Policy):
    """network: mean [B, T, A] = W x + b and value = v . x + c, x = [padded normalized state, camera colours];
    processor: cameras -> [0, 1], running state statistics, padding, env action bounds <-> [-1, 1];
    head: a Gaussian over the normalized chunk."""

    def __init__(self, config, spec):
        super().__init__(config, spec)
        T, A, S = config.chunk_size, spec.action_dim, spec.state_dim
        cams = list(config.cameras)
        size = [ImageSize(config.image_size, config.image_size)] if config.image_size else []
        image_steps = [*size, CameraMap(cameras=cams, sources=cams), ImagesToFloat()] if cams else []
        self.processor = Processor([*image_steps, RunningNormalize("state", S),
                                    PadVector("state", S, config.max_state_dim, "policy.max_state_dim"),
                                    Normalize.from_bounds("action", spec.action_low, spec.action_high,
                                                          clip_inverse=True)])
        self.processor.check(spec)  # an env the steps do not fit is refused when the config loads
        width = config.max_state_dim + 3 * len(cams)
        self.actor = nn.Linear(width, T * A)
        nn.init.zeros_(self.actor.weight)
        nn.init.zeros_(self.actor.bias)
        self.log_std = nn.Parameter(torch.full((T, A), config.init_log_std))
        self.critic = nn.Linear(width, 1)
        self.head = GaussianChunkHead()

    def _net(self, obs):
        batch = self.processor({"state": obs["state"], **({"images": obs["images"]} if "images" in obs else {})})
        colours = [img.mean((2, 3)) for img in batch.get("images", {}).values()]
        x = torch.cat([batch["state"], *colours], -1)
        mean = self.actor(x).view(x.shape[0], self.config.chunk_size, self.spec.action_dim)
        return mean, self.critic(x).squeeze(-1)

    def _to_env(self, normalized):
        return self.processor.inverse({"action": normalized})["action"]

    @torch.no_grad()
    def sample(self, obs):
        mean, value = self._net(obs)
        a, logprob, replay = self.head.sample(mean, self.log_std)
        return ActionSample(self._to_env(a), logprob, value, replay)

    def evaluate(self, obs, replay):
        mean, value = self._net(obs)
        return (*self.head.evaluate(mean, self.log_std, replay), value)

    @torch.no_grad()
    def act(self, obs):
        return self._to_env(self.head.mode(self._net(obs)[0]))

    @torch.no_grad()
    def value(self, obs):
        return self._net(obs)[1]

    def update_normalization(self, obs):
        self.processor.update({"state": obs["state"]})
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
    """Its own keys only, the capability checks of the algorithms and its processor's checks against the env
    apply to it like to a built-in family: one line, exit 2, nothing written."""
    cases = [(["policy.hidden_sizes=[8]"], "unknown config key 'policy.hidden_sizes'"),
             (["algorithm=sac"], "algorithm=sac needs reparameterized sampling"),
             # its processor does not fit the env: a camera the env does not render, a state past the padding,
             # a fixed image size the env does not render
             (["policy.cameras=[wrist]"], "expects camera(s) ['wrist'] that the env does not render"),
             (["policy.max_state_dim=4"], "exceeds the network's padding max_state_dim=4; raise policy.max_state_dim"),
             (["env.obs_mode=rgb", "policy.cameras=[base_camera]", "policy.image_size=32"],
              "the network needs 32x32 images but the env renders 128x128; set env.image_size=32")]
    answers = train_refusals([[*plugin["common"], *extra, f"run_dir={tmp_path / 'never'}"] for extra, _ in cases],
                             plugin["env"], tmp_path)
    for (extra, needle), p in zip(cases, answers, strict=True):
        assert one_line_refusal(p, needle), (extra, p.stderr[-2000:])
    assert not (tmp_path / "never").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.heavy
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
    from policies.processors import Processor
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
    # the processor was saved with each checkpoint and came back from its files: the running state statistics
    # the rollouts moved, the env's action bounds
    ckpt = run_dir / "checkpoints" / "iter_000003"
    steps = [s["type"] for s in json.loads((ckpt / "processor.json").read_text())["steps"]]
    assert steps == ["running_normalize", "pad_vector", "normalize"] and (ckpt / "processor.safetensors").is_file()
    stats, first_stats = last.processor.steps[0], first.processor.steps[0]
    assert float(stats.count) > float(first_stats.count) > 1 and not torch.equal(stats.mean, first_stats.mean)
    assert torch.equal(Processor.load(ckpt).steps[0].mean, stats.mean)
    bounds = last.processor.steps[2]
    assert torch.equal(bounds.shift, torch.tensor(last.spec.action_low)) and bounds.clip_inverse
