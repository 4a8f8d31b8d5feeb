"""Asymmetric soft actor-critic (``algorithm.critic_obs=critic_state``, SAC, RLPD, DSRL): the critics read the env's
privileged ``obs["critic_state"]`` while a pixel actor acts from its camera. The builder records the next
observation's critic state (the final one where an episode ended), the replay rows carry both, the critics are
built over its width with no image encoder, a pixel actor learns a bandit whose context its critics see only in
the critic state, and the refusals are one line at config load (demonstrations beside them:
tests/algorithms/test_critic_state_demos.py)."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from policies.cnn.modeling import CNNPolicy
from tests.algorithms.test_sac_pixels import CAM, SMALL, SPEC, TINY, B, T, colour_images, right_sign_fraction
from tests.helpers.plugins import one_line_refusal, train_refusals
from vlarl.algorithms.dsrl import validate_dsrl
from vlarl.algorithms.replay import trajectory_transitions
from vlarl.algorithms.sac import SACState, critic_obs_problem, critic_state_demos_problem, sac_update
from vlarl.algorithms.soft_critic_config import validate_sac
from vlarl.config.schema import DSRLConfig
from vlarl.data.trajectory import Trajectory

torch.set_num_threads(1)

C = 4  # the bandit's critic state: [sign, 1, 0, 0]
ROOT = Path(__file__).resolve().parents[2]
PRIVILEGED = replace(SMALL, critic_obs="critic_state")
PSPEC = replace(SPEC, critic_state_dim=C)


def bandit_traj(policy, g: torch.Generator) -> Trajectory:
    """One chunk step of B envs; the image's colour gives the best chunk's sign (+0.5 red, -0.5 blue), and the
    critic state holds that sign as a number (what a simulator's privileged state would: the answer, not the
    picture). Reward per action ``1 - (a - sign / 2)^2``; the episode ends."""
    images, sign = colour_images(B, g)
    state = torch.zeros(B, SPEC.state_dim)
    critic = torch.zeros(B, C)
    critic[:, 0], critic[:, 1] = sign, 1.0
    sample = policy.sample({"state": state, "images": {CAM: images}, "instruction": []})
    rewards = 1 - (sample.actions[..., 0] - sign[:, None] / 2) ** 2
    z = torch.zeros(1, B)
    return Trajectory(
        obs={"state": state[None], "images": {CAM: images[None]}, "instruction": [], "critic_state": critic[None]},
        replay={k: v[None] for k, v in sample.replay.items()}, logprob=sample.logprob[None], values=z,
        rewards=rewards.sum(-1)[None], dones=torch.ones(1, B), truncated=z, final_values=z, next_value=torch.zeros(B),
        step_rewards=rewards[None], step_mask=torch.ones(1, B, T, dtype=torch.bool), next_state=state[None],
        next_critic_state=critic[None], next_images={CAM: images[None]})


def test_the_builder_records_the_next_critic_state_final_where_an_episode_ended():
    from policies.base import ActionSample
    from tests.data.test_critic_state_rows import _obs
    from tests.data.test_trajectory import _reply
    from vlarl.data.builder import TrajectoryBuilder

    def reply(state: float, ended: bool):
        r = _reply(state, 10, 99 if ended else None)
        r.obs["critic_state"] = torch.full((1, 5), state)
        if r.final_obs is not None:  # the episode's last observation, before the auto-reset
            r.final_obs["critic_state"] = torch.full((1, 5), -state)
        return r

    b = TrajectoryBuilder(stages=1, workers=2, policy_version=0)
    sample = ActionSample(actions=torch.zeros(2, 2, 1), logprob=torch.zeros(2, 2, 1), value=None,
                          replay={"actions": torch.zeros(2, 2, 1)})
    b.add_sample(0, 0, _obs(0), sample, None)
    b.add_results(0, 0, [reply(1.0, False), reply(2.0, True)])
    traj = b.build(1, (torch.zeros(2), None))
    assert traj.next_critic_state[0, :, 0].tolist() == [1.0, -2.0]  # env 1 ended: its final critic state
    rows = trajectory_transitions(traj, critic_state=True)
    assert rows["critic_state"][:, 0].tolist() == [0.0, 1.0]  # step 0's observation (_obs: 10 * t + b)
    assert rows["next_critic_state"][:, 0].tolist() == [1.0, -2.0]
    without = replace(traj, next_critic_state=None)
    with pytest.raises(ValueError, match="next_critic_state"):
        trajectory_transitions(without, critic_state=True)
    assert "critic_state" not in trajectory_transitions(traj).keys()  # only where the critics read it


def test_a_pixel_actor_learns_from_critics_that_see_only_the_critic_state():
    torch.manual_seed(0)
    policy = CNNPolicy(TINY, PSPEC)
    st = SACState(policy, PRIVILEGED, PSPEC)
    # critics over the critic state and the chunk: no image encoder, no weights shared with the actor, but the
    # replay still keeps the actor's camera (the actor's steps and the next chunk's sample read it)
    assert st.encoder is None and st.shared_params == [] and st.cameras == [CAM]
    assert st.q.shape()["in_dim"] == C + T * SPEC.action_dim
    opt = torch.optim.Adam(policy.parameters(), lr=PRIVILEGED.lr)
    g = torch.Generator().manual_seed(0)
    before = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    for _ in range(15):
        metrics = sac_update(policy, opt, bandit_traj(policy, g), PRIVILEGED, g, state=st)
    assert metrics["critic_steps"] == B and math.isfinite(metrics["critic_loss"])
    after = right_sign_fraction(policy, torch.Generator().manual_seed(1))
    assert after >= 0.9 > before, (before, after)
    # the critics score by the critic state: the same chunk on a red row and a blue row differ by the sign
    batch = st.replay.sample(8)
    chunk = torch.full((8, T, SPEC.action_dim), 0.5)
    red, blue = batch["critic_state"].clone(), batch["critic_state"].clone()
    red[:, 0], blue[:, 0] = 1.0, -1.0
    q_red = st.values(st.q, st.critic_inputs({"critic_state": red}), chunk).mean(0)
    q_blue = st.values(st.q, st.critic_inputs({"critic_state": blue}), chunk).mean(0)
    assert (q_red - q_blue).min() > 0.3, (q_red, q_blue)


def test_the_critics_read_the_critic_state_standardized_by_what_entered_the_replay():
    """Scene states mix scales (positions ~0.05, velocities ~1.5): the critics read each entry standardized by
    running statistics of the rows put into the replay, saved and restored with the critics; a state saved before
    the statistics existed keeps reading the raw vector its critics were trained on."""
    torch.manual_seed(0)
    policy = CNNPolicy(TINY, PSPEC)
    fill = replace(PRIVILEGED, learning_starts=10**6)  # rows in, no gradient step
    st = SACState(policy, fill, PSPEC)
    opt = torch.optim.Adam(policy.parameters(), lr=PRIVILEGED.lr)
    g = torch.Generator().manual_seed(0)
    scale, shift = torch.tensor([0.01, 100.0, 1.0, 3.0]), torch.tensor([0.0, -50.0, 2.0, 0.0])
    raw = []
    for _ in range(6):
        traj = bandit_traj(policy, g)
        x = torch.randn(traj.obs["critic_state"].shape, generator=g) * scale + shift
        traj.obs["critic_state"], traj.next_critic_state = x, x
        raw.append(x.reshape(-1, C))
        sac_update(policy, opt, traj, fill, g, state=st)
    raw = torch.cat(raw)
    seen = st.critic_inputs({"critic_state": raw})
    torch.testing.assert_close(seen.mean(0), torch.zeros(C), atol=1e-4, rtol=0)
    torch.testing.assert_close(seen.std(0, unbiased=False), torch.ones(C), atol=1e-2, rtol=0)  # the 1e-4 prior
    nxt = st.critic_inputs({"next_critic_state": raw}, next_obs=True)
    torch.testing.assert_close(nxt, seen)  # the TD target's next states through the same statistics
    back = SACState(policy, PRIVILEGED, PSPEC)
    back.load_state_dict(st.state_dict())
    torch.testing.assert_close(back.critic_inputs({"critic_state": raw}), seen)
    old = {k: v for k, v in st.state_dict().items() if k != "critic_state_norm"}
    back.load_state_dict(old)
    torch.testing.assert_close(back.critic_inputs({"critic_state": raw}), raw)


def test_the_refusals_name_the_fix():
    policy = CNNPolicy(TINY, SPEC)  # an env without critic_state
    problem = critic_obs_problem(policy, PRIVILEGED)
    assert problem.startswith("algorithm.critic_obs=critic_state reads obs['critic_state']") and "env.critic_state=true" in problem
    with pytest.raises(ValueError, match="env.critic_state=true"):
        SACState(policy, PRIVILEGED, SPEC)
    demos = replace(PRIVILEGED, demos="auto", demo_ratio=0.5)  # auto: made without critic states
    assert "the critics need each demonstration's critic_state" in critic_state_demos_problem(CNNPolicy(TINY, PSPEC),
                                                                                              demos)
    assert critic_obs_problem(CNNPolicy(TINY, PSPEC), demos) is None and validate_sac(PRIVILEGED, 4) is None
    assert "critic_obs='world'" in validate_dsrl(DSRLConfig(critic_obs="world"), 4)
    assert "algorithm.critic_obs=policy" in validate_dsrl(DSRLConfig(critic_obs="critic_state",
                                                                     critic_input="action"), 4)


def test_vlarl_train_refuses_privileged_critics_without_the_env_s_critic_state(tmp_path: Path):
    rlpd = ["experiment=pushcube_rgb_rlpd", "algorithm.demos=''", "algorithm.demo_ratio=0"]
    cases = [[*rlpd, "algorithm.critic_obs=critic_state"],  # RGB PushCube reports no critic_state
             [*rlpd, "algorithm.critic_obs=critic"]]
    answers = train_refusals([[*c, f"run_dir={tmp_path / 'never'}"] for c in cases], dict(os.environ), ROOT)
    assert one_line_refusal(answers[0], "algorithm.critic_obs=critic_state reads obs['critic_state']"), answers[0].stderr
    assert one_line_refusal(answers[1], "algorithm.critic_obs='critic' is unknown"), answers[1].stderr
    assert not (tmp_path / "never").exists()
