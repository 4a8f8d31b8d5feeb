"""An evaluation of a task whose episodes read different words (the language task: the red or the blue goal named)
records each episode's instruction, as the policy read it, and gives the success per instruction beside the task's,
in ``eval.json`` and ``eval.md``: where a tuned policy loses on such a task, this says which words it stopped
following."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("mani_skill")


class _Recorder:
    """A stand-in policy (no network: the evaluation's bookkeeping is under test): no motion, and the words it was
    given at each episode's first chunk, by seed order."""

    def __init__(self) -> None:
        self.first_words: list[str] = []
        self._seen_reset = False

    def act(self, obs):
        words = list(obs["instruction"])
        if not self._seen_reset:
            self.first_words.extend(words)
            self._seen_reset = True
        return torch.zeros(len(words), 1, 4)


def test_eval_records_each_episodes_words_and_success_per_instruction(tmp_path):
    from simulators.language_tasks import INSTRUCTIONS
    from simulators.maniskill import ManiSkillConfig
    from vlarl import system_env
    from vlarl.evaluation import protocol

    system_env.apply()
    cfg = ManiSkillConfig(task="PushCubeToColor-v1", control_mode="pd_ee_delta_pos", obs_mode="state",
                          reward_mode="normalized_dense", max_episode_steps=2)
    policy = _Recorder()
    res = protocol.evaluate(policy, cfg, episodes=6, seed=1_000_000, num_envs=6, output_dir=tmp_path,
                            progress=False)
    saved = json.loads((tmp_path / "eval.json").read_text())
    words = [e["instruction"] for e in saved["per_episode"]]
    assert words == policy.first_words and set(words) <= set(INSTRUCTIONS)
    assert len(set(words)) == 2, f"6 held-out seeds drew one goal colour only: {words}"
    per = saved["tasks"]["PushCubeToColor-v1"]["instructions"]
    assert set(per) == set(words)
    for w, s in per.items():
        eps = [e for e in saved["per_episode"] if e["instruction"] == w]
        assert s["episodes"] == len(eps)
        assert s["success_once_count"] == sum(e["success_once"] > 0.5 for e in eps)
    assert sum(s["episodes"] for s in per.values()) == res["episodes"] == 6
    table = (tmp_path / "eval.md").read_text()
    assert all(f'"{w}"' in table for w in per)


def test_one_instruction_gives_no_breakdown():
    from vlarl.evaluation.protocol import by_instruction

    eps = [{"instruction": "push the cube", "success_once": 1.0, "success_at_end": 0.0, "return": 1.0,
            "episode_len": 5.0}] * 3
    assert by_instruction(eps) == {} and by_instruction([{**e, "instruction": f"w{i}"} for i, e in
                                                         enumerate(eps)])["w1"]["episodes"] == 1
