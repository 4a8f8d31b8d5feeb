"""PPO with an HL-Gauss value head (``algorithm.value_loss=hl_gauss``, ``policy.value_bins``): the loss on a
hand-computed case, the update fitting returns, value = expectation of the logits ``evaluate`` gives, checkpoint and
export of a binned head, a short vlarl-train run, and the refusals at config load."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from policies.base import Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.value_head import BinnedValueHead, HLGaussSupport
from tests.helpers.recipes import PPO
from tests.helpers.train_cli import vlarl_train
from vlarl.algorithms.hl_gauss import bins_to_value, hl_gauss_loss
from vlarl.algorithms.losses import value_loss_elementwise
from vlarl.algorithms.update import UpdateBatch, clipped_update
from vlarl.cli import train_main
from vlarl.config.schema import PPOConfig

BIN = Path(sys.executable).parent
D, A, T, M = 5, 2, 2, 64
SPEC = PolicySpec(state_dim=D, action_dim=A, action_low=[-1.0] * A, action_high=[1.0] * A)
BINNED = MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=T, value_bins=21, value_min=-1.0, value_max=3.0)


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _obs(state: torch.Tensor) -> dict:
    return {"state": state, "images": {}, "instruction": []}


def test_hl_gauss_value_loss_by_hand():
    # bins [0,1], [1,2], [2,3] (centres 0.5, 1.5, 2.5); sigma = 0.5 * width 1 = 0.5
    sup = HLGaussSupport(v_min=0.0, v_max=3.0, num_bins=3, sigma_ratio=0.5)
    logits = torch.tensor([[0.0, math.log(2.0), 0.0]])  # softmax = [1/4, 1/2, 1/4]
    # return 1.5: N(1.5, 0.5^2) puts Phi(1) - Phi(-1) into the middle bin, Phi(-1) - Phi(-3) into each outer one,
    # renormalized by the mass inside [0, 3], Phi(3) - Phi(-3)
    inside = _phi(3) - _phi(-3)
    p_mid, p_out = (_phi(1) - _phi(-1)) / inside, (_phi(-1) - _phi(-3)) / inside
    assert (p_mid, p_out) == pytest.approx((0.684538, 0.157731), abs=1e-6)
    expected = -(2 * p_out * math.log(0.25) + p_mid * math.log(0.5))  # = 0.911809
    got = value_loss_elementwise(logits, torch.zeros(1), torch.tensor([1.5]), loss_type="hl_gauss", support=sup)
    assert got.shape == (1,) and float(got[0]) == pytest.approx(expected, abs=1e-5)
    assert expected == pytest.approx(0.911809, abs=1e-5)
    assert float(bins_to_value(logits, sup)[0]) == pytest.approx(0.25 * 0.5 + 0.5 * 1.5 + 0.25 * 2.5)


def test_value_loss_refuses_a_head_that_does_not_match_the_loss():
    sup = HLGaussSupport(v_min=0.0, v_max=3.0, num_bins=3)
    logits, v, r = torch.zeros(2, 3), torch.zeros(2), torch.ones(2)
    with pytest.raises(ValueError, match="policy.value_bins >= 2"):
        value_loss_elementwise(v, v, r, loss_type="hl_gauss")
    with pytest.raises(ValueError, match="value_loss=mse with a binned value head"):
        value_loss_elementwise(logits, v, r, loss_type="mse", support=sup)
    with pytest.raises(ValueError, match="set algorithm.value_clip=0"):
        value_loss_elementwise(logits, v, r, clip=0.2, loss_type="hl_gauss", support=sup)


def test_value_is_the_expectation_of_the_logits_evaluate_gives():
    torch.manual_seed(0)
    policy = MLPPolicy(BINNED, SPEC)
    with torch.no_grad():
        policy.critic.net[-1].weight.mul_(300.0)  # far from uniform, so a wrong reading would show
    obs = _obs(torch.randn(6, D))
    sample = policy.sample(obs)
    _, _, logits = policy.evaluate(obs, sample.replay)
    assert isinstance(policy.critic, BinnedValueHead) and logits.shape == (6, 21)
    expected = bins_to_value(logits.detach(), policy.value_support)
    assert expected.std() > 0.1  # the values differ across states
    assert torch.allclose(policy.value(obs), expected, atol=1e-6)
    assert torch.allclose(sample.value, expected, atol=1e-6)
    assert policy.value_support == HLGaussSupport(-1.0, 3.0, 21, 0.75)
    assert MLPPolicy(MLPPolicyConfig(hidden_sizes=[8]), SPEC).value_support is None  # the default stays scalar


def _batch(policy: MLPPolicy) -> UpdateBatch:
    g = torch.Generator().manual_seed(0)
    state = torch.randn(M, D, generator=g)
    obs = _obs(state)
    with torch.no_grad():
        sample = policy.sample(obs)
    returns = 1.0 + 0.8 * state[:, 0]  # inside the support [-1, 3] for all but the rare |x| > 2.5
    return UpdateBatch(obs=obs, replay=sample.replay, logprob=sample.logprob, step_mask=torch.ones(M, T, dtype=torch.bool),
                       advantages=torch.randn(M, generator=g), valid=torch.ones(M, dtype=torch.bool),
                       traj_ids=torch.arange(M), behaviour_version=torch.zeros(M, dtype=torch.long),
                       returns=returns, old_values=sample.value)


def _fit(policy: MLPPolicy, batch: UpdateBatch) -> tuple[float, float]:
    """(cross-entropy, mean |E[V] - R|) of the policy's value head on the batch."""
    with torch.no_grad():
        _, _, logits = policy.evaluate(batch.obs, batch.replay)
        ce = hl_gauss_loss(logits, batch.returns, policy.value_support).mean()
        err = (bins_to_value(logits, policy.value_support) - batch.returns).abs().mean()
    return float(ce), float(err)


def test_clipped_update_with_hl_gauss_fits_the_returns():
    torch.manual_seed(0)
    policy = MLPPolicy(replace(BINNED, normalize_obs=False), SPEC)
    batch = _batch(policy)
    cfg = replace(PPOConfig(), value_loss="hl_gauss", update_epochs=4, num_minibatches=2, target_kl=0.0)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    ce0, err0 = _fit(policy, batch)
    assert ce0 == pytest.approx(math.log(21), abs=0.05)  # near-uniform bins at the start
    logged = [clipped_update(policy, opt, batch, cfg, torch.Generator().manual_seed(i))["value_loss"] for i in range(6)]
    ce1, err1 = _fit(policy, batch)
    assert ce1 < ce0 - 0.5, (ce0, ce1)
    assert err1 < 0.5 * err0, (err0, err1)
    assert logged[-1] < logged[0] - 0.3, logged  # the logged value_loss is the cross-entropy, falling


def test_binned_head_survives_a_checkpoint_and_exports(tmp_path):
    from vlarl.export import export_checkpoint

    torch.manual_seed(0)
    policy = MLPPolicy(BINNED, SPEC)
    policy.update_normalization({"state": torch.randn(32, D) * 2})
    ckpt = policy.save_pretrained(tmp_path / "ckpt")
    loaded = Policy.from_pretrained(ckpt)
    obs = _obs(torch.randn(4, D))
    assert loaded.value_support == policy.value_support
    sample = policy.sample(obs)
    assert torch.allclose(loaded.evaluate(obs, sample.replay)[2], policy.evaluate(obs, sample.replay)[2])
    manifest = export_checkpoint(ckpt, tmp_path / "out", formats=["onnx", "hf"])
    assert all(max(r["max_abs_err"].values()) <= 1e-4 for r in manifest["formats"].values())
    assert Policy.from_pretrained(tmp_path / "out" / "hf").value_support == policy.value_support


@pytest.mark.parametrize("args, needle", [
    (["algorithm.value_loss=hl_gauss"], "add policy.value_bins=51"),
    (["policy.value_bins=51"], "add algorithm.value_loss=hl_gauss or set policy.value_bins=0"),
    (["policy=cnn", "env=maniskill_pushcube_rgb", "algorithm.value_loss=hl_gauss"], "add policy.value_bins=51"),
    (["policy=diffusion", "env=maniskill_pushcube_rgb", "algorithm.value_loss=hl_gauss"],
     "policy=diffusion cannot build; use algorithm.value_loss=mse"),
    (["algorithm.value_loss=hl_gauss", "policy.value_bins=51", "algorithm.value_clip=0.2"],
     "set algorithm.value_clip=0"),
    (["algorithm.value_loss=hl_gauss", "policy.value_bins=51", "policy.value_max=-2"],
     "policy.value_min=-1.0 must be below policy.value_max=-2.0"),
])
def test_train_refuses_a_value_head_that_does_not_match_the_loss(args, needle, tmp_path, capsys):
    run_dir = tmp_path / "never"
    assert train_main([f"run_dir={run_dir}", PPO, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not run_dir.exists()


# slow: a Ray run through the console script (~20 s on a quiet 2-core machine); the default tier covers its parts:
# the loss by hand, the clipped update fitting the returns, the refusals through train_main, and the binned head
# through a checkpoint and export (all above)
@pytest.mark.slow
@pytest.mark.sim
def test_vlarl_train_with_hl_gauss_value_head(tmp_path):
    run_dir = tmp_path / "run"
    rows = vlarl_train(run_dir, ["algorithm.value_loss=hl_gauss", "policy.value_bins=21",
           "env.num_envs=2", "env.num_workers=1", "algorithm.num_steps=10", "algorithm.num_minibatches=2",
           "policy.hidden_sizes=[32,32]", "total_env_steps=40", "eval.episodes=2", "eval.num_envs=2"], timeout=600)
    train = [r for r in rows if "train/value_loss" in r]
    assert [r["iteration"] for r in train] == [1, 2]
    # a cross-entropy over 21 near-uniform bins starts at about ln 21 = 3.04 (an MSE of these returns would not)
    assert all(0.5 * math.log(21) < r["train/value_loss"] <= math.log(21) + 0.05 for r in train), train
    assert all(math.isfinite(r["train/value_error"]) for r in train)
    assert json.loads((run_dir / "eval" / "eval.json").read_text())["episodes"] == 2
    policy = Policy.from_pretrained(run_dir / "checkpoints" / "latest")
    assert policy.value_support == HLGaussSupport(-1.0, 6.0, 21, 0.75)
