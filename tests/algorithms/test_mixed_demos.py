"""Demonstrations of mixed quality: failed episodes labelled as the env's sparse reward with a time-limit truncation
would, success flags and final observations through the .h5 file, and the GR-RL filter on a chain dataset that
holds failed episodes."""

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from policies.episode import Episode
from vlarl.algorithms.offline import IQL, OfflineConfig, filter_transitions, fit_offline
from vlarl.algorithms.replay import demo_transitions
from vlarl.data.demonstrations import read_demonstrations, read_maniskill_h5
from vlarl.data.expert_demos import _H5Sink, record_demos

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _ep(success, final=None):
    return Episode(state=np.arange(3, dtype=np.float32)[:, None], actions=np.array([[0.1], [0.2], [0.3]], np.float32),
                   success=success, final_state=final)


def test_a_failed_episode_is_unrewarded_never_terminated_and_truncated_at_its_end():
    td = demo_transitions([_ep(False, np.array([9.0], np.float32))], chunk_size=2)
    assert td["step_rewards"].tolist() == [[0, 0], [0, 0], [0, 0]]
    assert td["step_mask"].tolist() == [[True, True], [True, True], [True, False]]
    assert td["terminated"].tolist() == [False, False, False]
    assert td["truncated"].tolist() == [False, True, True]  # the two chunks that reach the time limit
    assert td["next_state"].flatten().tolist() == [2.0, 9.0, 9.0]  # bootstrap from the final observation
    assert td["actions"][2].flatten().tolist() == pytest.approx([0.3, 0.3])  # padding, masked out


def test_a_successful_episode_is_labelled_as_before_whether_or_not_it_says_so():
    unflagged = demo_transitions([_ep(None)], chunk_size=2)
    assert unflagged["step_rewards"].tolist() == [[0, 0], [0, 1], [1, 0]]
    assert unflagged["terminated"].tolist() == [False, True, True] and not unflagged["truncated"].any()
    flagged = demo_transitions([_ep(True, np.array([9.0], np.float32))], chunk_size=2)
    for k in unflagged.keys():
        assert torch.equal(flagged[k], unflagged[k]), k  # the final state changes nothing for a success


def test_a_failed_episode_without_its_final_observation_is_refused():
    with pytest.raises(ValueError, match="final_state"):
        demo_transitions([_ep(False)], chunk_size=2)


def _write(path, flags, outcomes=(True, False, True)):
    sink = _H5Sink(path, "PushCube-v1", "pd_ee_delta_pos", flags=flags)
    for i, ok in enumerate(outcomes):
        L = 3 if ok else 5
        obs = np.arange((L + 1) * 2, dtype=np.float32).reshape(L + 1, 2) + 100 * i
        sink.add(i, obs, np.full((L, 4), 0.1 * i, np.float32), np.zeros(L, np.float32), i, "push", success=ok)
    sink.close()


def test_success_flags_and_final_observations_survive_the_h5_file(tmp_path):
    _write(tmp_path / "mixed.h5", flags=True)
    eps = read_demonstrations(tmp_path / "mixed.h5")
    assert [e.success for e in eps] == [True, False, True]
    assert [len(e.actions) for e in eps] == [3, 5, 3]
    assert eps[1].final_state.tolist() == [110.0, 111.0]  # obs row L of traj_1
    assert eps[1].state.shape == (5, 2)
    with h5py.File(tmp_path / "mixed.h5") as f:
        assert f["traj_1/success"][:].tolist() == [False] * 5
        assert f["traj_0/success"][:].tolist() == [False, False, True]  # per step, as ManiSkill's files
        assert (int(f.attrs["successes"]), int(f.attrs["failures"])) == (2, 1)
    td = demo_transitions(eps, chunk_size=2)
    # each success: its last action rewarded in the 2 chunks that hold it, both terminated; the failure: 0
    assert float(td["step_rewards"].sum()) == 2 * 2 and int(td["terminated"].sum()) == 2 * 2
    assert int(td["truncated"].sum()) == 2


def test_a_file_without_flags_reads_as_all_successful(tmp_path):
    _write(tmp_path / "plain.h5", flags=False, outcomes=(True, True))
    with h5py.File(tmp_path / "plain.h5") as f:
        assert "success" not in f["traj_0"] and "failures" not in f.attrs
    eps = read_maniskill_h5(tmp_path / "plain.h5")
    assert [e.success for e in eps] == [True, True]
    assert eps[1].final_state.tolist() == [106.0, 107.0]


def _chain_episode(xs, step=0.1):
    """An episode on the 1-D chain of test_offline.py: states xs [L + 1] (the last is the final observation)."""
    xs = np.round(np.asarray(xs, np.float32), 4)
    moves = np.diff(xs)
    acts = np.where(np.abs(moves) < 1e-6, -step, moves)[:, None].astype(np.float32)  # standing still: into the wall
    return xs[:-1, None], acts, xs[-1:]


def test_the_filter_keeps_the_successes_forward_steps_and_drops_more_of_the_failures():
    """Successful episodes walk 0 -> 1 (reward 1 on reaching it); failed ones walk back towards 0 or dither in the
    middle until their time limit. IQL's V on all of them scores progress; the filter should keep the successes'
    forward chunks and drop most of what the failures did."""
    torch.manual_seed(0)
    episodes = []
    for start in (0.0, 0.2, 0.4):  # successes
        state, acts, _ = _chain_episode(np.arange(start, 1.0001, 0.1))
        episodes.append(Episode(state=state, actions=acts, success=True))
    for xs in ([0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0],  # back to 0, then pushing against the wall
               [0.3, 0.4, 0.3, 0.4, 0.3, 0.4, 0.3, 0.2, 0.1],  # dithering, then giving up
               [0.5, 0.4, 0.5, 0.4, 0.3, 0.2, 0.3, 0.2, 0.1]):
        state, acts, final = _chain_episode(xs)
        episodes.append(Episode(state=state, actions=acts, success=False, final_state=final))
    data = demo_transitions(episodes, chunk_size=1)
    from_failed = torch.cat([torch.full((len(e.actions),), not e.success) for e in episodes])
    assert not data["terminated"][from_failed].any() and int(data["truncated"].sum()) == 3

    from tests.algorithms.test_offline import _policy

    cfg = OfflineConfig(gamma=0.9, tau=0.05, q_lr=3e-3, batch_size=20, critic_hidden_sizes=[32, 32])
    iql = IQL(_policy(), cfg, state_dim=1, chunk=1, action_dim=1)
    fit_offline(iql, data, steps=600, generator=torch.Generator().manual_seed(0))  # 300: V(0.9) still overshoots 1
    progress = iql.progress(data)
    kept, stats = filter_transitions(iql, data, groups={"failed": from_failed})
    assert (progress[~from_failed] > 0).float().mean() >= 0.9  # the successes' forward steps advance
    keep = progress > cfg.min_progress
    ok_kept = keep[~from_failed].float().mean()
    fail_kept = keep[from_failed].float().mean()
    assert fail_kept < ok_kept - 0.4, (float(fail_kept), float(ok_kept))
    assert int((~keep[from_failed]).sum()) > int((~keep[~from_failed]).sum())  # more failed transitions dropped
    assert stats["kept"] == int(keep.sum()) == kept.batch_size[0]
    assert (stats["kept_failed"], stats["of_failed"]) == (int(keep[from_failed].sum()), int(from_failed.sum()))


@pytest.mark.slow
@pytest.mark.sim
def test_the_pushcube_recorder_writes_successes_and_a_failure_that_read_back(tmp_path):
    from scripts.pushcube_expert import main

    out = tmp_path / "mixed.h5"
    summary = record_demos(out, episodes=2, failures=1, seed=0, log=lambda m: None)
    eps = read_maniskill_h5(out)
    assert sorted(e.success for e in eps) == [False, True, True]
    bad = [i for i, e in enumerate(eps) if not e.success]
    assert bad == summary["failed_order"] and summary["failures"] == 1
    failed = eps[bad[0]]
    assert len(failed.actions) == 50  # PushCube's time limit: it ran out, it did not stop early
    with h5py.File(out) as f:
        obs = f[f"traj_{bad[0]}/obs"][:]
        assert np.array_equal(failed.final_state, obs[-1]) and obs.shape[0] == 51
        assert (int(f.attrs["successes"]), int(f.attrs["failures"])) == (2, 1)
    td = demo_transitions(eps, chunk_size=4)
    assert float(td["step_rewards"].sum()) == 2 * 4 and int(td["truncated"].sum()) == 4  # chunks reaching the end
    assert main(["--task", "pickcube", "--out", str(tmp_path / "p.h5"), "--failures", "1"]) == 2
    assert not (tmp_path / "p.h5").exists()


def test_offline_then_online_refuses_what_would_fail_only_after_imitation_and_iql(tmp_path, capsys):
    from scripts.offline_then_online import main

    assert main(["--task", "pickcube", "--failures", "3", "--out", str(tmp_path / "a")]) == 2
    assert "only the PushCube expert" in capsys.readouterr().err
    # vlarl-train refuses HL-Gauss critics started from IQL's scalar ones, but only after BC and IQL ran
    assert main(["--out", str(tmp_path / "b"), "--", "algorithm.critic_loss=hl_gauss"]) == 2
    assert "--fresh-critics" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_imitation_refuses_failed_episodes_and_the_reader_can_skip_them(tmp_path):
    """SFT copies what it is shown, so a failed episode is refused; ``successful_only`` reads the successes and
    counts ``max_episodes`` among them (a file of success, failure, success gives both successes for 2)."""
    from vlarl.data.sft import sft_train

    path = tmp_path / "mixed.h5"
    _write(path, flags=True)
    every = read_maniskill_h5(path)
    assert [e.success for e in every] == [True, False, True]
    with pytest.raises(ValueError, match="1 of 3 demonstration episodes failed"):
        sft_train(torch.nn.Linear(1, 1), every, 1, 4, 1e-3, "push")
    kept = read_maniskill_h5(path, 2, successful_only=True)
    assert [e.success for e in kept] == [True, True]
    np.testing.assert_array_equal(kept[1].actions, every[2].actions)
