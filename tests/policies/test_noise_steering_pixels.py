"""DSRL from pixels and words (``policy=noise_steering_cnn``): a CNN noise actor over a frozen pixel SmolVLA, the
critics on its image encoder, and a replay that keeps each row's frames and instruction."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from policies import make_policy
from policies.base import Policy, PolicySpec
from policies.capabilities import critic_cameras
from policies.diffusion import NoiseSteeringConfig, PixelNoiseSteeringConfig, PixelNoiseSteeringPolicy
from policies.flow_vla import SmolVLAPolicyConfig
from vlarl.algorithms.dsrl import DSRLState, noise_transitions
from vlarl.config.schema import DSRLConfig
from vlarl.data.trajectory import Trajectory
from vlarl.workers.actor_worker import ActorWorker

torch.set_num_threads(1)
T, A, D, B, PX = 4, 1, 2, 32, 32
WORDS = ("go left", "go right")
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A, image_keys=["cam"],
                  image_size=[PX, PX], instruction=WORDS[0])
SMALL = DSRLConfig(num_steps=1, batch_size=64, learning_starts=64, utd_ratio=1.0, critic_hidden_sizes=[32, 32],
                   gamma=0.9, tau=0.05, lr=3e-3, q_lr=3e-3, alpha_lr=3e-3, init_alpha=0.01, max_grad_norm=0.0)
NOISE = 0.8  # each instruction's best chunk is the base's decode of the constant noise -0.8 (left) / +0.8 (right)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny exact SmolVLA that reads the camera, saved as an SFT'd one would be."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("pixel_smolvla")
    make_policy(SmolVLAPolicyConfig(chunk_size=T, num_steps=4, freeze_vlm=True, arch={"empty_cameras": 0}),
                SPEC).save_pretrained(d)
    return d


def _steering(base_dir, **kw) -> PixelNoiseSteeringConfig:
    return PixelNoiseSteeringConfig(base_path=str(base_dir), hidden_sizes=[32, 32],
                                    cnn_channels=[8, 8, 8], vision_dim=16, **kw)


def _obs(n: int, g: torch.Generator, words: list[str]) -> dict:
    return {"state": torch.rand(n, D, generator=g) * 2 - 1,
            "images": {"cam": torch.randint(0, 256, (n, PX, PX, 3), generator=g, dtype=torch.uint8)},
            "instruction": words}


def _targets(policy, obs: dict) -> torch.Tensor:
    """Each row's best action: the base's decode of the constant noise its words name, [n, T]."""
    n = obs["state"].shape[0]
    sign = torch.tensor([-1.0 if w == WORDS[0] else 1.0 for w in obs["instruction"]])
    noise = sign[:, None, None] * NOISE * torch.ones(n, *policy.noise_shape)
    return policy.decode(obs, noise)[..., 0]


def _reward(actions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 1 - (actions[..., 0] - targets) ** 2


def word_bandit(policy, g: torch.Generator) -> Trajectory:
    """One terminating chunk step of B envs, half told "left" and half "right", on random frames and states."""
    obs = _obs(B, g, [WORDS[i % 2] for i in range(B)])
    sample = policy.sample(obs)
    r = _reward(sample.actions, _targets(policy, obs))
    z = torch.zeros(1, B)
    return Trajectory(
        obs={"state": obs["state"][None], "images": {"cam": obs["images"]["cam"][None]},
             "instruction": obs["instruction"]},
        replay={k: v[None] for k, v in sample.replay.items()}, logprob=sample.logprob[None], values=z,
        rewards=r.sum(-1)[None], dones=torch.ones(1, B), truncated=z, final_values=z, next_value=torch.zeros(B),
        step_rewards=r[None], step_mask=torch.ones(1, B, T, dtype=torch.bool), next_state=obs["state"][None],
        next_images={"cam": obs["images"]["cam"][None]})


def test_the_noise_actor_reads_the_bases_cameras_and_the_critics_its_encoder(base_dir, tmp_path):
    policy = make_policy(_steering(base_dir), SPEC)
    assert isinstance(policy, PixelNoiseSteeringPolicy) and critic_cameras(policy) == ["cam"]
    encoder = policy.critic_encoder()
    assert encoder.vision is policy.noise_actor.vision  # critic_shares_encoder (the default)
    obs = _obs(3, torch.Generator().manual_seed(0), [WORDS[0]] * 3)
    assert torch.equal(policy.act(obs), policy.base.act(obs))  # untrained: the base's own zero-noise chunk
    assert encoder(obs).shape == (3, encoder.out_dim)
    policy.save_pretrained(tmp_path / "ck")
    again = Policy.from_pretrained(tmp_path / "ck")
    assert isinstance(again, PixelNoiseSteeringPolicy) and torch.equal(again.act(obs), policy.act(obs))


def test_a_state_only_base_is_refused_in_one_line(tmp_path):
    state_spec = replace(SPEC, image_keys=[], image_size=None)
    make_policy(SmolVLAPolicyConfig(chunk_size=T, num_steps=4, freeze_vlm=True, arch={"empty_cameras": 1}),
                state_spec).save_pretrained(tmp_path / "state")
    with pytest.raises(ValueError, match="reads none; use policy=noise_steering for a state-only base") as e:
        make_policy(_steering(tmp_path / "state"), state_spec)
    assert "\n" not in str(e.value)
    make_policy(NoiseSteeringConfig(base_path=str(tmp_path / "state"), hidden_sizes=[8]), state_spec)  # that one works


def test_the_replay_keeps_each_rows_frames_and_words(base_dir):
    torch.manual_seed(0)
    policy = make_policy(_steering(base_dir), SPEC)
    st = DSRLState(policy, SMALL, SPEC).noise
    traj = word_bandit(policy, torch.Generator().manual_seed(1))
    rows = noise_transitions(traj, st)
    assert st.replay.instructions.words(rows["instruction"]) == traj.obs["instruction"]
    assert torch.equal(rows["images", "cam"], traj.obs["images"]["cam"][0])
    assert torch.equal(rows["actions"], traj.replay["noise"][0])


@pytest.mark.heavy
def test_dsrl_from_pixels_follows_the_words_through_the_actor_worker(base_dir):
    """The reward asks for the base's decode of noise -0.8 under "left" and +0.8 under "right"; frames and states
    are random. Through the real ActorWorker the noise actor learns to steer by the words: the rows' instructions
    reach the critics and the actor from the replay (rows read under the env's one instruction could not tell the
    two apart: the untrained steering picks the zero noise under both words). The base stays bit-identical."""
    torch.manual_seed(0)
    actor = ActorWorker(_steering(base_dir, init_log_std=-1.0), SMALL, SPEC, seed=0)
    policy = actor.policy
    g_eval = torch.Generator().manual_seed(123)
    probe = _obs(16, g_eval, [WORDS[0]] * 8 + [WORDS[1]] * 8)

    def score() -> tuple[float, float]:
        a = policy.act(probe)[..., 0]
        gap = float(a[8:].mean() - a[:8].mean())  # right minus left
        return float(_reward(policy.act(probe), _targets(policy, probe)).mean()), gap

    target_gap = float(_targets(policy, probe)[8:].mean() - _targets(policy, probe)[:8].mean())
    start, gap0 = score()
    assert not policy.noise_actor.act(probe).any()  # untrained: the zero noise under both words
    assert abs(gap0) < 0.1 * abs(target_gap) and abs(target_gap) > 0.1  # the goals differ, the chunks hardly
    g = torch.Generator().manual_seed(0)
    for _ in range(18):
        metrics = actor.train(word_bandit(policy, g))
    end, gap = score()
    assert metrics["critic_steps"] == B
    assert gap * target_gap > 0 and abs(gap) > 0.5 * abs(target_gap), (gap, target_gap)
    assert end > start, (start, end)
    saved = load_file(str(base_dir / "model.safetensors"))
    assert all(torch.equal(policy.base.state_dict()[k], v) for k, v in saved.items())


def test_a_replay_of_frames_too_big_is_refused_at_config_load(tmp_path):
    """DSRL's replay keeps every row's frames: a buffer over the memory bound is refused when the config loads, in
    one line with the size that fits (before any run directory exists)."""
    from vlarl.config.loader import ConfigError, load_train_config

    camera_spec = replace(SPEC, image_keys=["base_camera"], image_size=[64, 64], state_dim=25, action_dim=4,
                          action_low=[-1.0] * 4, action_high=[1.0] * 4)
    make_policy(SmolVLAPolicyConfig(chunk_size=T, num_steps=2, arch={"empty_cameras": 0, "max_state_dim": 32}),
                camera_spec).save_pretrained(tmp_path / "base")
    recipe = ["experiment=multitask_smolvla_dsrl", f"policy.base_path={tmp_path / 'base'}"]
    assert load_train_config(recipe).algorithm.buffer_size == 30_000  # the recipe's fits
    with pytest.raises(ConfigError, match=r"buffer_size=200000 would keep 4\.6 GiB .* at most 174762") as e:
        load_train_config([*recipe, "algorithm.buffer_size=200000"])
    assert "\n" not in str(e.value)
