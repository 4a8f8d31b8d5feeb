"""The library the experiment scripts share (``vlarl.experiments``): the argv split, child stages that end the
script in one line when they fail, and the policy built as ``vlarl-train`` builds it."""

from __future__ import annotations

import sys

import pytest
import torch

from vlarl.experiments import Stages, read_metrics, split_overrides, training_policy


def test_split_overrides_keeps_what_follows_the_double_dash_for_vlarl_train():
    assert split_overrides(["--out", "o", "--", "seed=3", "policy=mlp"]) == (["--out", "o"], ["seed=3", "policy=mlp"])
    assert split_overrides(["--out", "o"]) == (["--out", "o"], [])
    assert split_overrides(["--"]) == ([], [])


def test_a_failed_stage_ends_the_script_with_one_line_naming_it(capsys):
    stages = Stages("demo")
    ok = stages.run([sys.executable, "-c", "print('hello')"], "say hello", capture=True)
    assert ok.returncode == 0 and ok.stdout == "hello\n"
    out = capsys.readouterr().out
    assert "] say hello: " in out and out.startswith("[demo ") and "hello\n" in out
    with pytest.raises(SystemExit, match=r"^demo: vlarl-train \(PPO\) failed \(exit 3\); see the output above$"):
        stages.run([sys.executable, "-c", "raise SystemExit(3)"], "vlarl-train (PPO)")
    assert stages.run([sys.executable, "-c", "raise SystemExit(3)"], "probe", check=False).returncode == 3


def test_read_metrics_reads_every_row(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"env_steps": 8}\n{"env_steps": 16, "iteration": 1}\n')
    assert read_metrics(tmp_path) == [{"env_steps": 8}, {"env_steps": 16, "iteration": 1}]


@pytest.mark.sim
def test_training_policy_is_the_policy_vlarl_train_builds_from_the_same_overrides():
    from policies.registry import make_policy
    from vlarl.config import load_train_config

    overrides = ["policy.hidden_sizes=[8]"]
    cfg, spec, policy = training_policy(overrides, seed=4)
    assert cfg == load_train_config(overrides)
    assert spec.state_dim > 0 and spec.action_dim == len(spec.action_low) and spec.task == cfg.env.task
    torch.manual_seed(4)
    again = make_policy(cfg.policy, spec)
    for (name, a), (_, b) in zip(policy.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    cfg2, spec2, none = training_policy(overrides, seed=4, build=False)  # a caller that loads a saved policy
    assert none is None and cfg2 == cfg and spec2 == spec
