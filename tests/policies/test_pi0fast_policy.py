"""``policy=pi0fast`` through the registry: the LeRobot fixture loaded whole, observations in the env's schema,
token sampling re-scored by ``evaluate`` with gradients, greedy ``act``, and a save that LeRobot's layout keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from policies.ar_vla.pi0fast import make_inputs, tokenize
from policies.ar_vla.pi0fast_checkpoint import load_pi0fast
from policies.ar_vla.pi0fast_tokenizer import detokenize
from policies.base import Policy, PolicySpec
from policies.registry import make_policy, policy_config_class

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "pi0fast" / "checkpoint"
TASKS = json.loads((FIXTURE / "io.json").read_text())["tasks"]


def spec(**kw) -> PolicySpec:
    base = dict(state_dim=6, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, image_keys=["base", "wrist"])
    return PolicySpec(**{**base, **kw})


def obs() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"images": {"base": torch.randint(0, 256, (2, 24, 40, 3), generator=g, dtype=torch.uint8),
                       "wrist": torch.randint(0, 256, (2, 32, 32, 3), generator=g, dtype=torch.uint8)},
            "state": torch.randn(2, 6, generator=g), "instruction": list(TASKS)}


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    cfg = policy_config_class("pi0fast")(pretrained_path=str(FIXTURE), chunk_size=6, temperature=1.0)
    return make_policy(cfg, spec())


def test_act_is_the_parity_tested_pipeline(policy):
    """act() = LeRobot's pre-processing, greedy decoding, FAST decoding and un-normalization (each parity-tested
    in test_pi0fast_parity.py), the first chunk_size steps."""
    o = obs()
    actions = policy.act(o)
    assert actions.shape == (2, 6, 3) and policy.chunk_size == 6
    ck = load_pi0fast(FIXTURE)
    ids, mask = tokenize(ck.config, ck.tokenizer, TASKS, ck.state_norm.normalize(o["state"]))
    images = [o["images"][k].permute(0, 3, 1, 2).float() / 255.0 for k in ("base", "wrist")]
    tokens = ck.model.generate(make_inputs(ck.config, images, ids, mask, empty=1), ck.vocab.bos_id, 14)
    expected = ck.action_norm.unnormalize(detokenize(tokens, ck.vocab, ck.fast, 8, 3))[:, :6]
    assert torch.allclose(actions, expected, atol=1e-6)


def test_sample_rescored_by_evaluate_with_gradients(policy):
    torch.manual_seed(0)
    o = obs()
    s = policy.sample(o)
    assert s.actions.shape == (2, 6, 3) and s.logprob.shape == (2, 6, 3) and s.value.shape == (2,)
    assert s.replay["tokens"].shape == (2, 14) and s.replay["token_mask"].dtype == torch.bool
    logp, entropy, value = policy.evaluate(o, s.replay)
    assert torch.allclose(logp, s.logprob, atol=1e-5) and torch.allclose(value, s.value, atol=1e-5)
    assert (entropy > 0).all() and (logp.sum((1, 2)) < 0).all()
    policy.zero_grad()
    (logp.sum() + value.sum()).backward()
    head = policy.net.pali.lm_head.weight.grad
    assert head is not None and head.abs().sum() > 0
    assert all(p.grad is not None for p in policy.value_head.parameters())


def test_save_and_reload_and_lerobot_layout(policy, tmp_path):
    o = obs()
    before = policy.act(o)
    d = policy.save_pretrained(tmp_path / "ckpt")
    again = Policy.from_pretrained(d)
    assert torch.allclose(again.act(o), before, atol=1e-6)
    exported = load_pi0fast(d / "lerobot")  # LeRobot's layout: config, weights with its names, processors
    assert exported.report.missing == [] and exported.report.unused == []
    ours = policy.net.state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in exported.model.state_dict().items())


def test_bad_configs_fail_in_one_line():
    cfg_cls = policy_config_class("pi0fast")
    with pytest.raises(ValueError, match="temperature"):
        cfg_cls(temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        make_policy(cfg_cls(pretrained_path=str(FIXTURE), chunk_size=9), spec())
    with pytest.raises(ValueError, match="state/action dims"):
        make_policy(cfg_cls(pretrained_path=str(FIXTURE)), spec(action_dim=4, action_low=[-1] * 4, action_high=[1] * 4))
    with pytest.raises(ValueError, match="cameras"):
        make_policy(cfg_cls(pretrained_path=str(FIXTURE)), spec(image_keys=["base"]))


def test_tiny_from_config_samples_learnable_tokens_and_reloads(tmp_path):
    """Without a checkpoint: a tiny random model for the env's spec, a FAST tokenizer fitted here; its actions
    stay in the env's bounds, and a save (no LeRobot source: no lerobot/ folder) reloads to the same actions."""
    torch.manual_seed(0)
    s = spec(state_dim=5, action_low=[-1.0, -2.0, 0.0], action_high=[1.0, 2.0, 1.0])
    pol = make_policy(policy_config_class("pi0fast")(), s)
    o = obs()
    o["state"] = o["state"][:, :5]
    a = pol.act(o)
    assert a.shape == (2, 4, 3) and pol.chunk_size == 4
    assert (a >= torch.tensor(s.action_low) - 1e-5).all() and (a <= torch.tensor(s.action_high) + 1e-5).all()
    sample = pol.sample(o)
    logp, _, _ = pol.evaluate(o, sample.replay)
    assert torch.allclose(logp, sample.logprob, atol=1e-5)
    d = pol.save_pretrained(tmp_path / "tiny")
    assert not (d / "lerobot").exists() and (d / "pi0fast" / "arch.json").is_file()
    assert torch.allclose(Policy.from_pretrained(d).act(o), a, atol=1e-6)


def test_policy_gradient_steps_raise_a_rewarded_answer():
    """The token head learns: a few policy-gradient steps on sampled answers (advantage +1) raise their
    re-scored log-probs (a fresh model: the module's fixture stays untouched)."""
    torch.manual_seed(1)
    policy = make_policy(policy_config_class("pi0fast")(pretrained_path=str(FIXTURE)), spec())
    o = obs()
    s = policy.sample(o)
    params = [p for p in policy.parameters() if p.requires_grad]
    before = policy.evaluate(o, s.replay)[0].sum((1, 2)).detach()
    opt = torch.optim.Adam(params, lr=1e-3)
    for _ in range(4):
        opt.zero_grad()
        logp = policy.evaluate(o, s.replay)[0].sum((1, 2))
        (-logp.sum()).backward()
        opt.step()
    after = policy.evaluate(o, s.replay)[0].sum((1, 2)).detach()
    assert (after > before + 1.0).all(), (before, after)
