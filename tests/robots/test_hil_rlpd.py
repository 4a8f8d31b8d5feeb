"""vlarl's chunked SAC / RLPD as the robot loop's learner (``hil.learner.name=rlpd``, vlarl.hil.learner):
the robot's episodes reach vlarl's replay (interventions as demonstrations), batches mix them at ``demo_ratio``,
updates move critics and actor, checkpoints restore exactly, and a HIL run on franky-sim completes with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.base import PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from robots.recorder import recorded_episodes
from vlarl.hil import LearnerConfig, RobotLearner, episode_transitions
from vlarl.hil.cli import main
from vlarl.hil.episodes import read_episode
from vlarl.hil.learner import ROBOT_ALGORITHMS

torch.set_num_threads(1)


def _policy(squash: bool = True, state_dim: int = 3, action_dim: int = 2, chunk: int = 2, half: float = 1.0):
    spec = PolicySpec(state_dim=state_dim, action_dim=action_dim, action_low=[-half] * action_dim,
                      action_high=[half] * action_dim)
    return MLPPolicy(MLPPolicyConfig(hidden_sizes=[16], chunk_size=chunk, squash=squash, init_log_std=-1.0), spec)


def _cfg(**kw) -> LearnerConfig:
    base = {"name": "rlpd", "batch_size": 8, "min_buffer": 4, "hidden": [16], "updates_per_chunk": 2.0,
            "algorithm": {"num_critics": 4, "init_alpha": 0.1}}
    return LearnerConfig(**{**base, **kw})


def _episode(rng, L=7, intervened=(2,), terminated=True):
    iv = np.zeros(L, bool)
    iv[list(intervened)] = True
    return {"state": rng.normal(size=(L, 3)).astype(np.float32), "action": rng.uniform(-1, 1, (L, 2)).astype(np.float32),
            "reward": rng.normal(size=L).astype(np.float32), "intervention": iv,
            "final_state": rng.normal(size=3).astype(np.float32), "terminated": terminated}


def test_episode_transitions_reach_the_online_buffer_and_interventions_the_demo_buffer():
    rng = np.random.default_rng(0)
    learner = RobotLearner(_policy(), _cfg())
    ep = _episode(rng, L=7, intervened=(2, 3), terminated=False)  # chunks [0,1] [2,3] [4,5] [6]: one intervened
    assert learner.add_episode(ep) == 4
    online, demos = learner.replay.online.buffer.storage, learner.replay.demos.buffer.storage
    assert len(learner.replay.online) == 4 and len(learner.replay.demos) == 1
    want, _ = episode_transitions(ep, 2)
    for i in range(4):
        for key in ("state", "actions", "next_state"):
            np.testing.assert_allclose(online[i][key].numpy(), want[i][key].numpy())
    # the per-step labels chunk TD targets take: the last chunk ran one step, and the episode was truncated
    np.testing.assert_allclose(online[3]["step_rewards"].numpy(), [ep["reward"][6], 0.0])
    assert online[3]["step_mask"].tolist() == [True, False]
    assert online[3]["truncated"].item() and not online[3]["terminated"].item()
    np.testing.assert_allclose(demos[0]["state"].numpy(), ep["state"][2])  # the operator's chunk
    np.testing.assert_allclose(demos[0]["actions"].numpy(), ep["action"][2:4])
    learner.add_episode(_episode(rng, intervened=()))  # no intervention: online only
    assert len(learner.replay.online) == 8 and len(learner.replay.demos) == 1
    assert learner.episodes == 2 and learner.state.update_credit == pytest.approx(2.0 * 8)


def test_batches_mix_demonstrations_at_demo_ratio():
    rng = np.random.default_rng(1)
    learner = RobotLearner(_policy(), _cfg(demo_ratio=0.25, batch_size=16))
    for _ in range(3):
        learner.add_episode(_episode(rng, intervened=(0,)))
    batch = learner.replay.sample(16)
    assert int(batch["is_demo"].sum()) == 4 and not batch["is_demo"][:12].any()  # 25 %, the demonstration rows last
    demo_states = learner.replay.demos.buffer.storage[: len(learner.replay.demos)]["state"]
    for s in batch["state"][12:]:  # and they are demonstration rows
        assert (demo_states == s).all(-1).any()
    m = learner.update()
    assert m["learner/demo_fraction"] == pytest.approx(0.25)
    assert m["learner/critic_steps"] == 2.0 * 12  # UTD 2 per chunk transition: 3 episodes x 4 chunks


def test_an_update_changes_the_critics_and_the_actor():
    rng = np.random.default_rng(2)
    learner = RobotLearner(_policy(), _cfg(updates_per_chunk=1.0))
    learner.add_episode(_episode(rng))
    q0 = {k: v.clone() for k, v in learner.state.q.state_dict().items()}
    qt0 = {k: v.clone() for k, v in learner.state.q_target.state_dict().items()}
    pi0 = {k: v.clone() for k, v in learner.policy.actor.state_dict().items()}
    alpha0 = learner.state.log_alpha.detach().item()
    m = learner.update()
    assert m["learner/critic_steps"] == 4.0 and learner.version == 1 and learner.updates == 4
    for name, before in (("q", q0), ("q_target", qt0)):
        after = getattr(learner.state, name).state_dict()
        assert all(not torch.equal(after[k], v) for k, v in before.items()), name
    assert any(not torch.equal(learner.policy.actor.state_dict()[k], v) for k, v in pi0.items())
    assert learner.state.log_alpha.detach().item() != alpha0  # entropy tuning moved the temperature
    version, weights = learner.weights()
    assert version == 1 and torch.equal(weights["log_std"], learner.policy.log_std.detach())
    assert learner.update() == {}  # nothing owed until the next episode


def test_save_then_load_gives_identical_state_and_the_same_next_update(tmp_path):
    """As resume does it: a new learner loads learner.pt, the checkpointed episodes refill its buffers as seen and
    the later one comes in as new; then it continues exactly as the live one."""
    rng = np.random.default_rng(3)
    episodes = [_episode(rng, intervened=(i,)) for i in range(4)]
    live = RobotLearner(_policy(), _cfg())
    for ep in episodes[:3]:
        live.add_episode(ep)
        live.update()
    torch.save(live.state_dict(), tmp_path / "learner.pt")
    live.add_episode(episodes[3])

    torch.manual_seed(123)  # the fresh process's own init and draws must not matter
    resumed = RobotLearner(_policy(), _cfg())
    sd = torch.load(tmp_path / "learner.pt", weights_only=False)
    assert "replay" not in sd["algorithm"]  # the buffers are rebuilt from the recorded episodes
    resumed.load_state_dict(sd)
    assert resumed.episodes == 3
    for i, ep in enumerate(episodes):
        resumed.add_episode(ep, seen=i < resumed.episodes)
    for part in ("online", "demos"):
        a, b = getattr(live.replay, part), getattr(resumed.replay, part)
        assert len(a) == len(b)
        for key in ("state", "actions", "step_rewards", "step_mask", "terminated", "next_state"):
            torch.testing.assert_close(b.buffer.storage[: len(b)][key], a.buffer.storage[: len(a)][key])
    assert resumed.state.update_credit == live.state.update_credit
    rng_state = torch.get_rng_state()  # one process-wide torch RNG: both continue from the same draw
    m_live = live.update()
    torch.set_rng_state(rng_state)
    m_resumed = resumed.update()
    assert m_live and m_resumed == pytest.approx(m_live, rel=1e-6)
    for name in ("q", "q_target"):
        for (k, a), b in zip(getattr(live.state, name).state_dict().items(),
                             getattr(resumed.state, name).state_dict().values(), strict=True):
            torch.testing.assert_close(b, a, msg=k)
    for (k, a), b in zip(live.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=k)  # weights and the state normalization (not counted twice)
    assert resumed.state.log_alpha.detach().item() == live.state.log_alpha.detach().item()
    assert (resumed.version, resumed.updates, resumed.episodes) == (live.version, live.updates, live.episodes)


def test_refusals_are_one_line():
    with pytest.raises(ValueError, match="tanh-squashed") as e:
        RobotLearner(_policy(squash=False), _cfg())
    assert "\n" not in str(e.value)
    for algorithm, match in (({"bogus": 1}, "not a key of RLPDConfig"), ({"gamma": 0.5}, "hil.learner.gamma"),
                             ({"critic_subset": 9, "num_critics": 4}, "critic_subset"),
                             ({"demos": "x.h5"}, "intervention episodes")):
        with pytest.raises(ValueError, match=match) as e:
            RobotLearner(_policy(), _cfg(algorithm=algorithm))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="hil.learner.name='dqn' is unknown"):
        RobotLearner(_policy(), _cfg(name="dqn"))
    assert {"awac", "sac", "rlpd"} <= set(ROBOT_ALGORITHMS)
    assert RobotLearner(_policy(), _cfg(name="sac", algorithm={})).alg.num_critics == 2  # SACConfig's defaults
    assert RobotLearner(_policy(), _cfg(algorithm={})).alg.num_critics == 10  # RLPDConfig's


def test_train_hil_bad_learner_config_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([f"output={out}", "hil.learner.name=rlpd", "hil.learner.algorithm.bogus=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train_hil: error:") and "bogus" in err and "\n" not in err
    unsquashed = _policy(squash=False, state_dim=15, action_dim=7, half=0.1).save_pretrained(tmp_path / "pol")
    assert main([f"output={out}", "hil.learner.name=rlpd", f"policy_dir={unsquashed}"]) == 2
    assert "policy.squash=true" in capsys.readouterr().err
    assert main([f"output={out}", "env.auto_reset=true"]) == 2  # the loop resets the env itself
    assert "env.auto_reset=false" in capsys.readouterr().err
    assert main([f"output={out}", "hil.learner.algorithm.num_critics=4"]) == 2  # AWAC's is hil.learner.num_q
    assert "hil.learner.num_q" in capsys.readouterr().err
    assert not out.exists()


# -- against franky-sim ----------------------------------------------------------------------------------------
def _args(out: Path, host: str, use_ray: bool, episodes: int) -> list[str]:
    return [f"output={out}", "hil.learner.name=rlpd", f"hil.episodes={episodes}", f"hil.use_ray={str(use_ray).lower()}",
            f"env.franky.ip={host}", "chunk_size=4", "hidden=[32]", "env.policy_hz=20", "env.max_episode_steps=12",
            "env.max_start_steps=20", "env.safety.watchdog_timeout=2.0", "hil.eval_every=0", "hil.checkpoint_every=2",
            "hil.learner.batch_size=8", "hil.learner.min_buffer=2", "hil.learner.hidden=[32]",
            "hil.learner.updates_per_chunk=1.0", "hil.learner.algorithm.num_critics=4",
            "hil.interventions.device=scripted", "hil.interventions.protocol=graded",
            "hil.interventions.graded_episodes=[1,1]", "operator_stop=false"]


def _check_run(out: Path, episodes: int) -> list[dict]:
    eps = recorded_episodes(out / "episodes")
    assert len(eps) == episodes
    assert read_episode(eps[0])["intervention"].all()  # the demo-replay episode: the demonstration buffer's
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == list(range(episodes))
    sd = torch.load(out / "learner.pt", weights_only=False)
    assert sd["episodes"] == episodes and sd["updates"] > 0 and sd["learner"] == "rlpd"
    assert sd["algorithm"]["critic_steps"] == sd["updates"]
    from policies.base import Policy

    exported = Policy.from_pretrained(out / "policy")  # the latest weights, a squashed policy for vlarl-deploy
    assert exported.squash and torch.equal(exported.log_std, sd["policy"]["log_std"])
    return rows


@pytest.mark.robot
def test_hil_run_with_rlpd_completes_its_episodes_and_resumes(franky_sim, tmp_path):
    out = tmp_path / "run"
    assert main(_args(out, franky_sim.host, use_ray=False, episodes=3)) == 0
    rows = _check_run(out, 3)
    assert rows[-1]["learner/critic_steps"] > 0 and rows[-1]["policy_version"] > 0
    assert main([*_args(out, franky_sim.host, use_ray=False, episodes=4), "resume=true"]) == 0  # rebuilt from episodes
    _check_run(out, 4)


@pytest.mark.robot
@pytest.mark.slow
def test_hil_run_with_rlpd_as_the_ray_learner(franky_sim, tmp_path):
    """The learner factory travels to the Ray actor (the registrations of train_hil are not in its process)."""
    out = tmp_path / "run"
    try:
        assert main(_args(out, franky_sim.host, use_ray=True, episodes=4)) == 0
    finally:
        import ray

        ray.shutdown()
    rows = _check_run(out, 4)
    assert rows[-1]["learner/updates"] > 0
