"""Chunk replay on torchrl buffers: transitions from a trajectory and from demonstrations, mixed sampling,
save/load."""

import numpy as np
import pytest
import torch

from policies.episode import Episode
from vlarl.algorithms.replay import MixedReplay, demo_transitions, trajectory_transitions
from vlarl.data.trajectory import Trajectory

torch.set_num_threads(1)


def _traj(N=3, B=2, T=2, A=1, D=3) -> Trajectory:
    state = torch.arange(N * B * D, dtype=torch.float32).view(N, B, D)
    z = torch.zeros(N, B)
    dones = z.clone()
    dones[1, 0] = 1
    return Trajectory(
        obs={"state": state, "images": {}, "instruction": ["x"] * B},
        replay={"actions": torch.randn(N, B, T, A)}, logprob=torch.zeros(N, B, T, A), values=z, rewards=z,
        dones=dones, truncated=z, final_values=z, next_value=torch.zeros(B),
        step_rewards=torch.ones(N, B, T), step_mask=torch.ones(N, B, T, dtype=torch.bool), next_state=state + 100)


def test_trajectory_transitions_are_time_major_with_next_state_and_dones():
    td = trajectory_transitions(_traj())
    assert td.batch_size == torch.Size([6])
    assert torch.equal(td["state"][2], torch.arange(6, 9, dtype=torch.float32))  # step 1, env 0
    assert torch.equal(td["next_state"][2], td["state"][2] + 100)
    assert td["terminated"].tolist() == [False, False, True, False, False, False]


def test_trajectory_without_next_state_is_refused():
    traj = _traj()
    traj.next_state = None
    with pytest.raises(ValueError, match=r"off-policy replay needs the trajectory's \['next_state'\]"):
        trajectory_transitions(traj)


def test_demo_transitions_label_the_success_and_mask_past_the_end():
    ep = Episode(state=np.arange(3, dtype=np.float32)[:, None], actions=np.array([[0.1], [0.2], [0.3]], np.float32))
    td = demo_transitions([ep], chunk_size=2)
    assert td.batch_size == torch.Size([3])
    assert td["step_mask"].tolist() == [[True, True], [True, True], [True, False]]
    assert td["step_rewards"].tolist() == [[0, 0], [0, 1], [1, 0]]
    assert td["terminated"].tolist() == [False, True, True]
    assert td["next_state"][0].tolist() == [2.0]  # two steps later
    assert td["actions"][1].flatten().tolist() == pytest.approx([0.2, 0.3])


def test_mixed_sampling_draws_the_configured_fraction_from_demonstrations():
    torch.manual_seed(0)
    replay = MixedReplay(capacity=100, demo_ratio=0.25)
    replay.online.extend(trajectory_transitions(_traj()))
    ep = Episode(state=np.full((4, 3), -1, np.float32), actions=np.zeros((4, 1), np.float32))
    replay.add_demos(demo_transitions([ep], chunk_size=2))
    batch = replay.sample(64)
    assert int(batch["is_demo"].sum()) == 16
    assert bool((batch["state"][batch["is_demo"]] == -1).all())  # demo rows really are demonstrations
    assert bool((batch["state"][~batch["is_demo"]] >= 0).all())
    only_demos = MixedReplay(capacity=10, demo_ratio=0.5)
    only_demos.add_demos(demo_transitions([ep], chunk_size=2))
    assert bool(only_demos.sample(8)["is_demo"].all())  # before any online data, demonstrations fill the batch


def test_replay_survives_save_and_load(tmp_path):
    replay = MixedReplay(capacity=4, demo_ratio=0.0)
    replay.online.extend(trajectory_transitions(_traj()))  # 6 rows into 4 slots: the ring wrapped
    torch.save(replay.state_dict(), tmp_path / "replay.pt")
    again = MixedReplay(capacity=4, demo_ratio=0.0)
    again.load_state_dict(torch.load(tmp_path / "replay.pt", weights_only=False))
    assert len(again) == 4
    stored = again.online.buffer.storage[:]
    assert torch.equal(stored["state"], replay.online.buffer.storage[:]["state"])
    again.online.extend(trajectory_transitions(_traj())[:1])  # the write cursor continues where it was
    assert torch.equal(again.online.buffer.storage[:]["state"][2], torch.arange(3, dtype=torch.float32))
    big = MixedReplay(capacity=100_000, demo_ratio=0.0)
    big.online.extend(trajectory_transitions(_traj()))
    torch.save(big.state_dict(), tmp_path / "big.pt")
    assert (tmp_path / "big.pt").stat().st_size < 20_000  # the 6 filled rows are saved, not the capacity


def test_a_replay_buffer_leaves_distribution_argument_checks_on():
    """torchrl turns torch.distributions' argument checks off when imported; building a replay buffer must
    not change that for the rest of the process (a NaN mean still raises in every policy)."""
    import torch

    from vlarl.algorithms.replay import ChunkReplay

    ChunkReplay(8)  # the first one in a process imports torchrl; any earlier one must have left checks on too
    assert torch.distributions.Distribution._validate_args is True  # torch's default (python without -O)
    with pytest.raises(ValueError):
        torch.distributions.Normal(torch.tensor([float("nan")]), torch.tensor([1.0]))


def test_demonstrations_keep_their_episodes_words_through_sampling_and_a_resume():
    """Several tasks' demonstrations in one replay: each row carries its episode's instruction as an id (an episode
    recorded without words reads the env's, id 0), the sampled batch gives them back, and a replay saved with them
    loads beside the same demonstrations; other demonstrations than the run began with are refused in one line."""
    from vlarl.algorithms.sac import replay_obs

    replay = MixedReplay(capacity=100, demo_ratio=1.0, default_instruction="push")
    eps = [Episode(state=np.full((3, 2), i, np.float32), actions=np.zeros((3, 1), np.float32), instruction=w)
           for i, w in enumerate(["pull it back", "push to red", ""])]
    td = demo_transitions(eps, chunk_size=2, instructions=replay.instructions)
    assert replay.instructions.words(td["instruction"]) == ["pull it back"] * 3 + ["push to red"] * 3 + ["push"] * 3
    assert "instruction" not in demo_transitions(eps, chunk_size=2).keys()  # without ids: the rows read the env's
    replay.add_demos(td)
    torch.manual_seed(0)
    batch = replay.sample(30)
    words = replay_obs(batch, [], instructions=replay.instructions)["instruction"]
    expected = {0.0: "pull it back", 1.0: "push to red", 2.0: "push"}
    assert all(batch["is_demo"]) and [expected[float(s[0])] for s in batch["state"]] == words
    replay.online.extend(trajectory_transitions(_traj(), instructions=replay.instructions))
    saved = replay.state_dict()
    again = MixedReplay(capacity=100, demo_ratio=1.0, default_instruction="push")
    again.add_demos(demo_transitions(eps, chunk_size=2, instructions=again.instructions))
    again.load_state_dict(saved)
    assert again.instructions.vocab == replay.instructions.vocab == ["push", "pull it back", "push to red", "x"]
    other = MixedReplay(capacity=100, demo_ratio=1.0, default_instruction="push")
    other.add_demos(demo_transitions(eps[1:], chunk_size=2, instructions=other.instructions))
    with pytest.raises(ValueError, match="resume with the algorithm.demos the run began with") as e:
        other.load_state_dict(saved)
    assert "\n" not in str(e.value)


def test_rows_keep_their_instructions_through_sampling_and_a_save():
    """Rows carry their words as ids (one per row, per env or for all); id 0 is the env's own instruction, which
    demonstration rows recorded without words read; the words survive a save and a replay saved before rows kept
    words loads with every row on the env's instruction."""
    from vlarl.algorithms.sac import replay_obs

    replay = MixedReplay(capacity=100, demo_ratio=0.5, default_instruction="push")
    per_row = _traj()
    per_row.obs["instruction"] = ["a", "b", "b", "a", "a", "c"]  # N * B = 6 rows, time-major
    rows = trajectory_transitions(per_row, instructions=replay.instructions)
    assert replay.instructions.words(rows["instruction"]) == ["a", "b", "b", "a", "a", "c"]
    per_env = _traj()
    per_env.obs["instruction"] = ["c", "d"]  # one per env: row r is env r % 2
    assert replay.instructions.words(trajectory_transitions(per_env, instructions=replay.instructions)
                                     ["instruction"]) == ["c", "d"] * 3
    replay.online.extend(rows)
    ep = Episode(state=np.full((4, 3), -1, np.float32), actions=np.zeros((4, 1), np.float32))
    replay.add_demos(demo_transitions([ep], chunk_size=2))
    torch.manual_seed(0)
    batch = replay.sample(40)
    words = replay_obs(batch, [], instructions=replay.instructions)["instruction"]
    demo = batch["is_demo"].tolist()
    assert all(w == "push" for w, d in zip(words, demo, strict=True) if d)
    by_state = {tuple(r["state"].tolist()): w for r, w in zip(rows, ["a", "b", "b", "a", "a", "c"], strict=True)}
    assert all(by_state[tuple(s.tolist())] == w for s, w, d in zip(batch["state"], words, demo, strict=True) if not d)
    again = MixedReplay(capacity=100, demo_ratio=0.0)
    again.load_state_dict(replay.state_dict())
    assert again.instructions.vocab == ["push", "a", "b", "c", "d"]
    assert again.instructions.words(again.sample(8)["instruction"])[0] in {"a", "b", "c"}
    old = replay.state_dict()
    del old["instructions"], old["online"]["rows"]["instruction"]  # as saved before rows kept their words
    before = MixedReplay(capacity=100, demo_ratio=0.0, default_instruction="push")
    before.load_state_dict(old)
    before.online.extend(trajectory_transitions(per_env, instructions=before.instructions))  # the same columns
    assert set(before.instructions.words(before.sample(64)["instruction"])) == {"push", "c", "d"}
