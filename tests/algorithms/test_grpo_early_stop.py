"""GRPO rollouts stop once every env has ended its episode (no simulating masked steps to the horizon),
with the same update as a rollout simulated to the horizon; and the runner saves / restores the KL
reference with its checkpoints. Real runner, real ManiSkill PushCube workers."""

from dataclasses import replace

import pytest
import ray
import torch

from policies.registry import make_policy
from tests.helpers.recipes import PPO
from tests.helpers.runners import set_up_runner
from vlarl.algorithms.grpo import collect_groups, group_reset_ids, grpo_update
from vlarl.algorithms.spec import SEED_STRIDE
from vlarl.checkpoint import REFERENCE_NAME, latest_checkpoint
from vlarl.runner import Runner

pytestmark = [pytest.mark.sim, pytest.mark.slow]  # ~1 min on 2 busy cores

OVERRIDES = [
    PPO, "algorithm=grpo", "algorithm.group_size=2", "algorithm.num_steps=8", "algorithm.kl_coef=0.1",
    "algorithm.score=return", "env.max_episode_steps=5", "env.num_envs=4", "env.num_workers=2",
    "policy.hidden_sizes=[16,16]", "logger.progress_bar=false", "logger.tensorboard=false",
]


def _reseed(runner: Runner) -> None:
    ray.get(runner.rollout.__ray_call__.remote(lambda w: torch.manual_seed(123)))


def _update(runner: Runner, traj) -> torch.Tensor:
    torch.manual_seed(0)
    policy = make_policy(runner.cfg.policy, runner.policy_spec)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    alg = runner.cfg.algorithm
    grpo_update(policy, opt, traj, replace(alg, kl_coef=0.0), torch.Generator().manual_seed(0))
    return torch.cat([p.detach().flatten() for p in policy.parameters()])


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with set_up_runner(OVERRIDES, tmp_path_factory.mktemp("grpo_early")) as r:
        yield r


def test_collect_groups_stops_when_every_episode_ended(runner):
    # the horizon's chunk comes from the built policy (a checkpoint's own for chunk_size=0), not the config
    assert runner.policy_chunk == make_policy(runner.cfg.policy, runner.policy_spec).chunk_size
    _reseed(runner)
    early, _, steps = collect_groups(runner, None)
    assert early.num_steps == 5 and steps == 4 * 5  # horizon 8, episodes of 5 steps: 3 chunk steps saved
    # the same groups simulated to the horizon
    alg, B = runner.cfg.algorithm, runner.cfg.env.num_envs
    ids = group_reset_ids(B, alg.group_size, runner.cfg.seed * SEED_STRIDE + runner.algorithm_state["group_batch"] * (B // alg.group_size))
    obs = ray.get([w.reset.remote(None, ids[i * 2:(i + 1) * 2]) for i, w in enumerate(runner.env_workers)])
    _reseed(runner)
    full, _, full_steps = runner.collect(obs, 8)
    assert full.num_steps == 8 and full_steps == 4 * 8
    assert torch.equal(full.obs["state"][:5], early.obs["state"]) and torch.equal(full.logprob[:5], early.logprob)
    assert torch.equal(full.rewards[:5], early.rewards) and torch.equal(full.truncated[:5], early.truncated)
    assert early.truncated[4].all() and early.obs["state"][0, 0].equal(early.obs["state"][0, 1])  # group start
    assert torch.equal(_update(runner, early), _update(runner, full))  # masked steps never mattered


def test_runner_checkpoint_carries_the_kl_reference(runner):
    def perturb(w, scale):
        with torch.no_grad():
            for p in w.reference.parameters():
                p.mul_(scale).add_(0.01)
        return torch.cat([p.flatten() for p in w.reference.parameters()])

    saved = ray.get(runner.actor.__ray_call__.remote(perturb, 0.5))  # e.g. an init_from reference
    ckpt = runner.save(0.0)
    assert (ckpt / REFERENCE_NAME).is_file()
    ray.get(runner.actor.__ray_call__.remote(perturb, 0.0))  # what a rebuilt reference would differ by
    runner.resume(latest_checkpoint(runner.run_dir))
    got = ray.get(runner.actor.__ray_call__.remote(lambda w: torch.cat([p.flatten() for p in w.reference.parameters()])))
    assert torch.equal(got, saved)
