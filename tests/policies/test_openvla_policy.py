"""policy=openvla / openvla_oft, the exact OpenVLA / OpenVLA-OFT networks: RL interface, checkpoints, LoRA, PPO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vla_helpers import make_obs, openvla_config, ppo_step, trainable

from policies import Policy, PolicySpec, make_policy
from policies.ar_vla import OpenVLAPolicyConfig
from policies.ar_vla.openvla_checkpoint import load_openvla
from policies.ar_vla.openvla_policy import OpenVLAOFTPolicy, OpenVLAPolicy
from policies.vlm import LoRAConfig
from tests.helpers.recipes import PPO
from tests.helpers.reference import FIXTURES, holds_reference_weights, oft_spec, spec_obs

VARIANTS = [("openvla", "tokens"), ("openvla_oft", "tokens"), ("openvla_oft", "l1")]


def _policy(spec, architecture="openvla_oft", action_head="l1", **kw) -> OpenVLAPolicy:
    kw.setdefault("chunk_size", 2)
    pol = make_policy(openvla_config(architecture, action_head=action_head, **kw), spec)
    assert isinstance(pol, OpenVLAPolicy) and pol.name == architecture
    return pol


@pytest.mark.parametrize("architecture,head", VARIANTS)
def test_sample_rescores_and_gradients_reach_the_network(vla_spec, obs, architecture, head):
    torch.manual_seed(0)
    pol = _policy(vla_spec, architecture, head)
    s = pol.sample(obs)
    assert s.actions.shape == s.logprob.shape == (3, 2, 3) and s.value.shape == (3,)
    low, high = torch.tensor(vla_spec.action_low), torch.tensor(vla_spec.action_high)
    assert (s.actions >= low - 1e-6).all() and (s.actions <= high + 1e-6).all()
    lp, ent, v = pol.evaluate(obs, s.replay)
    torch.testing.assert_close(lp, s.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, s.value, atol=1e-5, rtol=0)
    assert ent.shape == (3, 2, 3) and torch.isfinite(ent).all()
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any(n.startswith("model.language_model.model.layers.0.") for n in grads)
    assert any(n.startswith("model.vision_backbone.fused_featurizer.blocks.") for n in grads)
    assert any(n.startswith("value_head.") for n in grads)
    if head == "l1":
        assert {"log_std"} <= grads and any(n.startswith("model.action_head.") for n in grads)
    if architecture == "openvla_oft":
        assert any(n.startswith("model.proprio_projector.") for n in grads)


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_bf16_trunk_with_proprio_samples_and_rescores(vla_spec, obs, head):
    """``policy.dtype=bfloat16`` casts the trunk (vision, projector, LM) and keeps the proprio projector and the
    heads in fp32; the proprio must enter its projector in that projector's dtype (found on an H200: the bf16
    PPO update of a published-size OpenVLA-OFT failed with "mat1 and mat2 must have the same dtype")."""
    torch.manual_seed(0)
    pol = _policy(vla_spec, "openvla_oft", head, dtype="bfloat16")
    assert pol.model.projector.fc1.weight.dtype == torch.bfloat16
    assert pol.model.proprio_projector.fc1.weight.dtype == torch.float32
    s = pol.sample(obs)
    lp, _, _ = pol.evaluate(obs, s.replay)
    assert torch.isfinite(lp).all() and lp.shape == (3, 2, 3)
    lp.sum().backward()
    assert pol.model.proprio_projector.fc1.weight.grad is not None


def test_token_policy_decodes_openvla_bins_within_the_action_bounds(vla_spec, obs):
    pol = _policy(vla_spec, "openvla", "tokens", temperature=0.5, top_k=4)
    s = pol.sample(obs)
    tokens = s.replay["action_tokens"]
    assert tokens.min() >= 0 and tokens.max() < 256
    ids = pol.action_ids[tokens]
    assert ids.min() >= 31744 and ids.max() < 32000  # the last 256 ids of Llama-2's vocabulary
    with torch.no_grad():
        logp, _ = pol._forward(obs, tokens.reshape(3, -1))
    assert ((logp.exp() > 1e-12).sum(-1) == 4).all()


def test_save_and_reload_acts_the_same(vla_spec, obs, tmp_path):
    pol = _policy(vla_spec, lora=LoRAConfig(rank=4))
    pol.save_pretrained(tmp_path)
    again = Policy.from_pretrained(tmp_path)
    assert isinstance(again, OpenVLAPolicy) and json.loads((tmp_path / "config.json").read_text())["policy"] == "openvla_oft"
    torch.testing.assert_close(again.act(obs), pol.act(obs), atol=1e-6, rtol=0)


def test_lora_trains_adapters_not_the_base_lm(vla_spec):
    pol = _policy(vla_spec, lora=LoRAConfig(rank=4))
    names = {n for n, p in pol.named_parameters() if p.requires_grad}
    lm = [n for n in names if n.startswith("model.language_model.")]
    assert lm and all("lora_" in n for n in lm)
    before = trainable(pol)
    stats = ppo_step(pol, N=2, B=2)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != "explained_variance"), stats
    after = dict(pol.named_parameters())
    changed = [n for n in before if not torch.equal(before[n], after[n].detach())]
    assert any("lora_" in n for n in changed) and "log_std" in changed


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_sft_loss_fits_a_demonstration(vla_spec, head):
    torch.manual_seed(0)
    pol = _policy(vla_spec, "openvla_oft", head, freeze_vision=True)
    obs = make_obs(2)
    target = torch.tensor([[[0.5, -1.0, 0.2]] * 2] * 2)
    opt = torch.optim.Adam([p for p in pol.parameters() if p.requires_grad], lr=2e-2)
    first = pol.sft_loss(obs, target)
    for _ in range(20):
        opt.zero_grad()
        loss = pol.sft_loss(obs, target)
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first.item()


def test_published_oft_checkpoint_drives_the_policy():
    """The OFT fixture (2 cameras, proprio 8, L1 head) as ``policy.pretrained_path``; loaded whole."""
    spec = oft_spec()
    path = FIXTURES / "openvla_oft" / "checkpoint"
    pol = _policy(spec, chunk_size=8, pretrained_path=str(path), unnorm_key="fixture_sim")
    ref = load_openvla(path, unnorm_key="fixture_sim")
    assert holds_reference_weights(pol, ref.model)
    obs = spec_obs(spec)
    actions = pol.act(obs)
    low, high = ref.stats.low.float(), ref.stats.high.float()
    assert actions.shape == (2, 8, 7)
    assert ((actions[..., :6] >= low[:6] - 1e-5) & (actions[..., :6] <= high[:6] + 1e-5)).all()


def test_bad_configurations_are_named(vla_spec):
    with pytest.raises(KeyError, match="unknown policy 'openvla2'"):
        make_policy(OpenVLAPolicyConfig(name="openvla2"), vla_spec)
    with pytest.raises(TypeError, match="action_head"):  # OpenVLA has the token head only: no such key
        _policy(vla_spec, "openvla", "l1")
    with pytest.raises(ValueError, match="policy.action_head='l2' is not one of openvla_oft's heads"):
        _policy(vla_spec, "openvla_oft", "l2")
    one_camera = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3,
                            image_keys=["base"])
    with pytest.raises(ValueError, match="takes 2 camera image"):
        _policy(one_camera, num_images=2)


@pytest.mark.parametrize("name", ["openvla", "openvla_oft"])
def test_yaml_composes_and_builds(name, vla_spec, obs):
    from vlarl.config.loader import load_train_config

    cfg = load_train_config([PPO, "env=maniskill_pushcube_rgb", f"policy={name}", "policy.chunk_size=2"]).policy
    assert cfg.name == name
    pol = make_policy(cfg, vla_spec)
    assert isinstance(pol, OpenVLAPolicy) and pol.act(obs).shape == (3, 2, 3)
    assert isinstance(pol, OpenVLAOFTPolicy) == (name == "openvla_oft")


@pytest.mark.slow
@pytest.mark.parametrize("architecture,head", VARIANTS)
def test_exports_match_eager(architecture, head, tmp_path):
    """vlarl-export's three formats (ONNX, torch.export, HF layout) equal eager ``act`` within 1e-4."""
    from vlarl.export import export_checkpoint

    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, image_keys=["base"],
                      image_size=[32, 32], instruction="push the cube")
    _policy(spec, architecture, head).save_pretrained(tmp_path / "ckpt")
    manifest = export_checkpoint(tmp_path / "ckpt", tmp_path / "export", instruction="push the cube", atol=1e-4)
    for fmt in ("onnx", "torch_export", "hf"):
        assert max(manifest["formats"][fmt]["max_abs_err"].values()) <= 1e-4


@pytest.mark.slow
@pytest.mark.sim
def test_openvla_oft_trains_through_the_runner_and_reloads(tmp_path):
    """vlarl-train (Ray workers, ManiSkill PushCube with a camera, PPO) with policy=openvla_oft, then vlarl-eval
    reloads the checkpoint and reproduces the in-training evaluation."""
    import os
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    run_dir = tmp_path / "run"

    def run(cmd: list[str]) -> None:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL,
                           env={**os.environ, "RAY_DEDUP_LOGS": "0"})
        assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"

    run([str(bin_dir / "vlarl-train"), PPO, "env=maniskill_pushcube_rgb", "env.image_size=32", "policy=openvla_oft",
         f"run_dir={run_dir}", "policy.chunk_size=2", "env.num_envs=4", "algorithm.num_steps=8",
         "algorithm.num_minibatches=2", "total_env_steps=64", "eval.episodes=4", "eval.num_envs=4",
         "eval.video_episodes=0", "time_limit_minutes=0", "logger.progress_bar=false"])
    ckpt = run_dir / "checkpoints" / "latest"
    for f in ("model.safetensors", "tokenizer_config.json", "backbone_config.json", "processor_config.json"):
        assert (ckpt / f).is_file(), f
    trained = json.loads((run_dir / "eval" / "eval.json").read_text())
    run([str(bin_dir / "vlarl-eval"), f"checkpoint={ckpt}", "episodes=4", "num_envs=4", "video_episodes=0",
         f"output={tmp_path / 'eval'}"])
    again = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert again["episodes"] == 4 and again["return"] == pytest.approx(trained["return"], abs=1e-4)


def test_state_only_env_feeds_black_frames_and_arch_widens_the_llama(tmp_path):
    """``empty_cameras=1`` on an env without cameras: the towers see one black frame, the state reaches the
    model through the proprio token (actions depend on it); ``arch.text_config`` widens the tiny Llama only
    where set, and the saved policy restores with the same architecture and actions."""
    spec = PolicySpec(state_dim=6, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, instruction="push")
    pol = _policy(spec, empty_cameras=1, arch={"text_config": {"hidden_size": 16, "intermediate_size": 32}})
    assert pol.cfg.llm_dim == 16 and pol.cfg.text_config["num_hidden_layers"] == 2  # the rest stays tiny
    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.randn(3, 6, generator=g), "images": {}, "instruction": ["push"] * 3}
    pol.update_normalization(obs)
    a = pol.act(obs)
    moved = pol.act({**obs, "state": obs["state"] + 1.0})
    assert a.shape == (3, 2, 3) and not torch.allclose(a, moved)
    pol.save_pretrained(tmp_path / "ckpt")
    back = Policy.from_pretrained(tmp_path / "ckpt")
    assert back.cfg.llm_dim == 16 and torch.equal(back.act(obs), a)


def test_state_only_refusals_name_the_fix():
    spec = PolicySpec(state_dim=6, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3)
    with pytest.raises(ValueError, match="policy.empty_cameras=1"):
        _policy(spec)
    with pytest.raises(ValueError, match="does not know"):
        _policy(spec, empty_cameras=1, arch={"hidden": 3})
    with pytest.raises(ValueError, match="drop the policy.arch overrides"):
        _policy(spec, empty_cameras=1, arch={"num_images": 1},
                pretrained_path=str(FIXTURES / "openvla_oft" / "checkpoint"))
