import json

import pytest
import torch

from policies import CheckpointError, Policy, PolicySpec, make_policy
from policies.mlp import MLPPolicyConfig


@pytest.fixture
def spec():
    return PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, task="T")


def _obs(B=4, D=5):
    return {"state": torch.randn(B, D), "images": {}, "instruction": ["x"] * B}


def test_sample_shapes_and_evaluate_reproduces_logprob(spec):
    pol = make_policy(MLPPolicyConfig(hidden_sizes=[16], chunk_size=2), spec)
    obs = _obs()
    s = pol.sample(obs)
    assert s.actions.shape == (4, 2, 3) and s.logprob.shape == (4, 2, 3) and s.value.shape == (4,)
    lp, ent, v = pol.evaluate(obs, s.replay)
    assert torch.allclose(lp, s.logprob, atol=1e-6)
    assert torch.allclose(v, s.value, atol=1e-6)
    assert ent.shape == (4, 2, 3)
    lp.sum().backward()
    assert pol.log_std.grad is not None and pol.actor[0].weight.grad is not None


def test_act_is_deterministic_and_clipped(spec):
    pol = make_policy(MLPPolicyConfig(hidden_sizes=[16]), spec)
    with torch.no_grad():
        pol.actor[-1].bias.fill_(5.0)  # mean far outside the action box
    obs = _obs()
    a1, a2 = pol.act(obs), pol.act(obs)
    assert torch.equal(a1, a2)
    assert a1.max().item() <= 1.0


def test_running_normalization_updates_and_is_saved(spec, tmp_path):
    pol = make_policy(MLPPolicyConfig(hidden_sizes=[16]), spec)
    pol.update_normalization({"state": torch.randn(1000, 5) * 3 + 2})
    assert pol.norm.mean.mean().item() == pytest.approx(2.0, abs=0.3)
    pol.save_pretrained(tmp_path / "ckpt")
    stats = json.loads((tmp_path / "ckpt" / "normalization.json").read_text())
    assert stats["state_mean"][0] == pytest.approx(pol.norm.mean[0].item())
    loaded = Policy.from_pretrained(tmp_path / "ckpt")
    obs = _obs()
    assert torch.equal(loaded.act(obs), pol.act(obs))
    assert loaded.spec == spec and loaded.config == pol.config


def test_from_pretrained_names_missing_files(spec, tmp_path):
    pol = make_policy(MLPPolicyConfig(hidden_sizes=[16]), spec)
    d = pol.save_pretrained(tmp_path / "ckpt")
    (d / "normalization.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing \['normalization.json'\]"):
        Policy.from_pretrained(d)
    with pytest.raises(CheckpointError, match="does not exist"):
        Policy.from_pretrained(tmp_path / "nope")


def test_wrong_state_shape_is_a_clear_error(spec):
    pol = make_policy(MLPPolicyConfig(hidden_sizes=[16]), spec)
    with pytest.raises(ValueError, match=r"expects obs\['state'\] of shape \[B, 5\]"):
        pol.act({"state": torch.randn(2, 7), "images": {}, "instruction": ["x", "x"]})
