"""Demonstrations beside critics on the scene state (RLPD with ``algorithm.critic_obs=critic_state``): the reader
keeps a file's ``critic_state``, demonstration rows carry it as online rows do (the next one read as frames are),
SAC's replay mixes them in, and the refusals name ``scripts/demo_critic_state.py``. The replay that writes the
critic states runs in ``tests/simulators/test_critic_state_replay.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from policies.cnn.modeling import CNNPolicy
from policies.episode import Episode
from tests.algorithms.test_sac_pixels import CAM, SMALL, SPEC, TINY, S, T
from vlarl.algorithms.replay import demo_transitions
from vlarl.algorithms.sac import SACState, critic_state_demos_problem, critic_state_width_problem
from vlarl.data.demonstrations import demo_critic_state, read_maniskill_h5

torch.set_num_threads(1)

C = 5


def _episode(L: int, success: bool, offset: float) -> Episode:
    """An episode whose critic state row k is ``offset + k`` everywhere (so a row says which step it is)."""
    return Episode(state=np.zeros((L, 2), np.float32), actions=np.ones((L, 1), np.float32), success=success,
                   final_state=np.zeros(2, np.float32),
                   critic_state=(offset + np.arange(L + 1, dtype=np.float32))[:, None].repeat(C, 1))


def test_demo_rows_carry_the_critic_state_and_the_next_one():
    ok, failed = _episode(3, True, 0.0), _episode(2, False, 100.0)
    out = demo_transitions([ok, failed], chunk_size=2, critic_state=True)
    cs, nxt = out["critic_state"][:, 0].tolist(), out["next_critic_state"][:, 0].tolist()
    # success (L=3, T=2): rows 0,1,2; the next is k steps on, and a row reaching the end reads the last
    # (terminated: never used); the failure (L=2) bootstraps from the row after its last action
    assert cs == [0, 1, 2, 100, 101]
    assert nxt == [2, 2, 2, 102, 102]
    assert out["terminated"].tolist() == [False, True, True, False, False]
    assert out["truncated"].tolist() == [False, False, False, True, True]
    assert "critic_state" not in demo_transitions([ok], chunk_size=2).keys()  # the policy's critics: no column


def test_a_demonstration_without_critic_state_is_refused_naming_the_script():
    bare = Episode(state=np.zeros((2, 2), np.float32), actions=np.ones((2, 1), np.float32), success=True)
    with pytest.raises(ValueError, match=r"no critic_state .* scripts/demo_critic_state.py"):
        demo_transitions([bare], chunk_size=2, critic_state=True)


def _write(path: Path, critic: bool, width: int = C, with_images: bool = False) -> Path:
    with h5py.File(path, "w") as f:
        for i, L in enumerate((3, 4)):
            g = f.create_group(f"traj_{i}")
            g["actions"] = np.full((L, 1), 0.5, np.float32)
            g["obs"] = np.zeros((L + 1, 2), np.float32)
            if with_images:
                g[f"images/{CAM}"] = np.full((L + 1, S, S, 3), 40 * (i + 1), np.uint8)
            if critic:
                g["critic_state"] = np.full((L + 1, width), float(i), np.float32)
        if critic:
            f.attrs["critic_state_tasks"] = ["PushCube-v1"]
            f.attrs["critic_state_instructions"] = ["push the cube"]
    return path


def test_reader_keeps_the_critic_state_and_the_checks_name_the_fix(tmp_path):
    with_cs, without = _write(tmp_path / "cs.h5", True), _write(tmp_path / "plain.h5", False)
    eps = read_maniskill_h5(with_cs)
    assert [e.critic_state.shape for e in eps] == [(4, C), (5, C)] and read_maniskill_h5(without)[0].critic_state is None
    assert demo_critic_state(with_cs) == {"dim": C, "tasks": ["PushCube-v1"], "instructions": ["push the cube"]}
    assert demo_critic_state(without) is None
    policy = CNNPolicy(TINY, replace(SPEC, critic_state_dim=8))
    privileged = replace(SMALL, critic_obs="critic_state", demo_ratio=0.5)
    assert critic_state_demos_problem(policy, replace(privileged, demos=str(with_cs))) is None
    plain = critic_state_demos_problem(policy, replace(privileged, demos=str(without)))
    assert "holds no critic_state" in plain and "scripts/demo_critic_state.py" in plain
    auto = critic_state_demos_problem(policy, replace(privileged, demos="auto"))
    assert "critic_state" in auto and "algorithm.demo_ratio=0" in auto
    assert critic_state_demos_problem(policy, replace(SMALL, demos=str(without), demo_ratio=0.5)) is None
    wide = critic_state_width_problem(str(with_cs), 9)
    assert f"holds {C}-dim critic states (tasks ['PushCube-v1'])" in wide and "9-dim" in wide
    assert critic_state_width_problem(str(with_cs), C) is None


def test_sac_replay_mixes_demonstrations_with_their_critic_states(tmp_path):
    """A pixel actor with critics on the scene state: the demonstration rows in the replay carry the file's
    critic states beside their frames; a file of another width stops SACState in one line."""
    demos = _write(tmp_path / "cs.h5", True, with_images=True)
    spec = replace(SPEC, critic_state_dim=C)
    cfg = replace(SMALL, critic_obs="critic_state", demos=str(demos), demo_ratio=0.5, num_demos=10)
    st = SACState(CNNPolicy(TINY, spec), cfg, spec)
    assert len(st.replay.demos) == 3 + 4
    rows = st.replay.demos.buffer.storage[:7]  # in the order they were added
    assert rows["critic_state"].shape == (7, C)
    assert rows["critic_state"][:, 0].tolist() == [0, 0, 0, 1, 1, 1, 1]  # each episode's own rows
    assert rows["images"][CAM][:, 0, 0, 0].tolist() == [40] * 3 + [80] * 4  # beside the frames
    # the critics' statistics start from the demonstration rows (the replay they sample before any online row)
    norm = st.critic_state_norm
    assert float(norm.count) == pytest.approx(7, abs=1e-3)
    torch.testing.assert_close(norm.mean, rows["critic_state"].float().mean(0), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=f"holds {C}-dim critic states"):
        SACState(CNNPolicy(TINY, replace(spec, critic_state_dim=C + 1)), cfg, replace(spec, critic_state_dim=C + 1))
    assert T == 2
