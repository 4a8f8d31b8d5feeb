"""``vlarl-train init_from=<policy dir>``: a run starts from saved weights (not from a fresh init),
and checkpoints that do not fit the config are refused with one line naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from policies.base import CheckpointError
from policies.mlp import MLPPolicyConfig
from policies.registry import make_policy
from tests.helpers.recipes import PPO
from vlarl.init_from import load_init_weights, load_into_worker, resolve_checkpoint
from vlarl.runner import policy_spec_from_env

BIN = Path(sys.executable).parent
ENV = [PPO, "env.control_mode=pd_ee_delta_pos", "env.num_envs=2", "env.num_workers=1"]
SMALL = [*ENV, "policy.hidden_sizes=[16,16]", "algorithm.num_steps=10", "algorithm.num_minibatches=2",
         "total_env_steps=20", "eval.episodes=2", "eval.num_envs=2", "eval.video_episodes=0",
         "time_limit_minutes=0", "logger.progress_bar=false", "placement.timeline=false"]


@pytest.fixture(scope="module")
def spec():
    from simulators.maniskill import ManiSkillConfig, ManiSkillEnv

    env = ManiSkillEnv(ManiSkillConfig(control_mode="pd_ee_delta_pos"), num_envs=1)
    try:
        return policy_spec_from_env(env.spec)
    finally:
        env.close()


@pytest.fixture(scope="module")
def saved(spec, tmp_path_factory):
    """An MLP policy with distinctive weights and normalization, as save_pretrained writes it."""
    torch.manual_seed(123)
    policy = make_policy(MLPPolicyConfig(hidden_sizes=[16, 16]), spec)
    with torch.no_grad():
        policy.log_std.fill_(-1.7)
        policy.actor[-1].bias.fill_(0.3)
    policy.norm.update(torch.randn(500, spec.state_dim) * 2 + 1)
    d = tmp_path_factory.mktemp("sft") / "policy"
    policy.save_pretrained(d)
    (d / "env.json").write_text(json.dumps({"task": "PushCube-v1", "control_mode": "pd_ee_delta_pos", "obs_mode": "state"}))
    return d


@pytest.mark.slow  # Ray + ManiSkill start-up: ~45 s on a loaded 2-core machine
def test_train_starts_from_saved_weights(saved, tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.run([str(BIN / "vlarl-train"), f"run_dir={run_dir}", f"init_from={saved}", "algorithm.lr=0",
                        *SMALL], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    before = load_file(str(saved / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoints" / "latest" / "model.safetensors"))
    # lr=0: every parameter is still the saved one; the normalizer continued from the saved statistics
    for k in ("log_std", "actor.4.bias", "actor.0.weight", "critic.0.weight"):
        torch.testing.assert_close(after[k], before[k], msg=k)
    assert float(after["norm.count"]) == pytest.approx(float(before["norm.count"]) + 20)
    # and the run directory is a fresh run (iteration counting starts at 1, not a resumed trainer state)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "iteration" in r] == [1]


def test_run_directory_is_accepted_and_resolves_to_latest(saved, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    os.symlink(saved, run / "checkpoints" / "latest")
    assert resolve_checkpoint(run) == saved.resolve()
    with pytest.raises(CheckpointError, match="init_from=.*not a policy directory"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_mismatches_name_the_key(saved, spec):
    cfg = MLPPolicyConfig(hidden_sizes=[16, 16])
    state = load_init_weights(saved, cfg, spec)
    assert torch.equal(state["log_std"], torch.full_like(state["log_std"], -1.7))

    class Other:
        name = "flow_vla"

    with pytest.raises(CheckpointError, match="holds a 'mlp' policy but policy=flow_vla"):
        load_init_weights(saved, Other(), spec)
    with pytest.raises(CheckpointError, match=r"spec.state_dim=.*set env.obs_mode"):
        load_init_weights(saved, cfg, replace(spec, state_dim=spec.state_dim + 1))
    with pytest.raises(CheckpointError, match=r"spec.action_dim=.*env.control_mode"):
        load_init_weights(saved, cfg, replace(spec, action_dim=8, action_low=[-1.0] * 8, action_high=[1.0] * 8))
    with pytest.raises(CheckpointError, match=r"policy.hidden_sizes=\[16, 16\] \(now: \[32, 32\]\)"):
        load_init_weights(saved, MLPPolicyConfig(hidden_sizes=[32, 32]), spec)

    class Env:
        task, control_mode, obs_mode = "PushCube-v1", "pd_joint_delta_pos", "state"

    with pytest.raises(CheckpointError, match="env.control_mode=pd_ee_delta_pos but the config has"):
        load_init_weights(saved, cfg, spec, Env())


def test_kl_reference_starts_from_the_checkpoint_too(saved, spec):
    from vlarl.config.schema import PPOConfig
    from vlarl.workers.actor_worker import ActorWorker

    cfg = MLPPolicyConfig(hidden_sizes=[16, 16])
    worker = ActorWorker(cfg, PPOConfig(kl_coef=0.1), spec, seed=0)
    state = load_init_weights(saved, cfg, spec)
    assert not torch.equal(worker.reference.log_std, state["log_std"])
    load_into_worker(worker, state)
    for module in (worker.policy, worker.reference):
        for k, v in module.state_dict().items():
            torch.testing.assert_close(v, state[k], msg=k)


def test_cli_refuses_a_missing_init_from_before_writing_a_run(tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.run([str(BIN / "vlarl-train"), f"run_dir={run_dir}", f"init_from={tmp_path / 'nope'}", *SMALL],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 2
    assert "init_from=" in p.stderr and "not a policy directory" in p.stderr and "Traceback" not in p.stderr
    assert not (run_dir / "config.yaml").exists()


def test_value_from_change_keeps_the_trunk_and_starts_a_fresh_value_head(tmp_path, capsys):
    """An SFT'd VLA (value head never trained) may start RL with policy.value_from=state: every other
    weight loads as saved; only the value head is new."""
    from policies.base import PolicySpec
    from policies.flow_vla import FlowVLAConfig
    from policies.vlm import BackboneConfig

    vspec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    torch.manual_seed(0)
    sft = make_policy(FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2), vspec)
    sft.save_pretrained(tmp_path / "sft")
    cfg = FlowVLAConfig(backbone=BackboneConfig(kind="siglip_qwen2"), chunk_size=2, value_from="state")
    state = load_init_weights(tmp_path / "sft", cfg, vspec)
    assert "value_from=state (checkpoint: hidden)" in capsys.readouterr().out
    saved_state = sft.state_dict()
    assert state["value_head.0.weight"].shape == (256, 5)
    same = [k for k in state if not k.startswith("value_head.")]
    assert same and all(torch.equal(state[k], saved_state[k]) for k in same)
