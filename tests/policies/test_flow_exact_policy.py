"""``policy=smolvla`` / ``pi0`` / ``pi05``: exact networks as RL policies, one registered family each.

Built through the config YAML and ``make_policy``; sample/evaluate re-score within 1e-5 for both
likelihoods, PPO moves the expert and leaves a frozen VLM bit-identical, save/load gives identical
``act()``, a LeRobot checkpoint loaded through ``policy.pretrained_path`` acts exactly as
``load_smolvla`` + ``sample_actions``, and bad input is refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from vla_helpers import ppo_step

from policies import make_policy
from policies.base import CheckpointError, Policy, PolicySpec
from policies.flow_vla import SmolVLAPolicyConfig
from policies.flow_vla.exact import ExactFlowPolicy
from policies.flow_vla.smolvla import SmolVLA
from policies.flow_vla.smolvla_checkpoint import load_smolvla
from policies.flow_vla.smolvla_policy import SmolVLAPolicy
from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.config.loader import ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "smolvla" / "checkpoint"
VLM = "net.vlm_with_expert.vlm."


def smolvla(spec: PolicySpec, *overrides: str) -> ExactFlowPolicy:
    torch.manual_seed(0)
    cfg = load_train_config([PPO, "policy=smolvla", *overrides])
    return make_policy(cfg.policy, spec)


@pytest.mark.parametrize("likelihood", ["flow_sde", "flow_noise"])
def test_sample_evaluate_rescore_and_gradients(vla_spec, obs, likelihood):
    pol = smolvla(vla_spec, f"policy.likelihood={likelihood}")
    assert isinstance(pol, ExactFlowPolicy) and isinstance(pol.net, SmolVLA)
    assert pol.adapter.cameras == ["base", "wrist"] and pol.adapter.empty_cameras == 1  # the yaml's blank camera
    s = pol.sample(obs)
    K, T, A_pad = pol.config.num_steps, pol.config.chunk_size, pol.net.max_action_dim
    assert s.actions.shape == s.logprob.shape == (3, T, 3) and s.replay["chain"].shape == (3, K + 1, T, A_pad)
    low, high = torch.tensor(vla_spec.action_low), torch.tensor(vla_spec.action_high)
    assert ((s.actions >= low) & (s.actions <= high)).all()
    lp, ent, v = pol.evaluate(obs, s.replay)
    assert (lp - s.logprob).abs().max().item() <= 1e-5 and (v - s.value).abs().max().item() <= 1e-5
    assert torch.isfinite(ent).all()
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in pol.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert "net.action_out_proj.weight" in grads and "net.vlm_with_expert.lm_expert.layers.0.mlp.up_proj.weight" in grads
    assert not any(n.startswith(VLM) for n in grads)  # freeze_vlm (the yaml's default): expert only
    assert ("noise_head.weight" in grads) == (likelihood == "flow_noise")


def test_ppo_update_moves_the_expert_and_leaves_the_frozen_vlm_bit_identical(vla_spec):
    pol = smolvla(vla_spec)
    before = {n: p.detach().clone() for n, p in pol.named_parameters()}
    stats = ppo_step(pol)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != "explained_variance"), stats
    changed = {n for n, p in pol.named_parameters() if not torch.equal(p.detach(), before[n])}
    vlm = {n for n in before if n.startswith(VLM)}
    assert vlm and not (changed & vlm)
    assert {"net.action_in_proj.weight", "net.state_proj.weight", "value_head.0.weight"} <= changed
    assert any(n.startswith("net.vlm_with_expert.lm_expert.") for n in changed)


def test_unfrozen_lora_and_value_from(vla_spec, obs):
    full = smolvla(vla_spec, "policy.freeze_vlm=false", "policy.value_from=state")
    trainable = {n for n, p in full.named_parameters() if p.requires_grad}
    assert f"{VLM}model.text_model.layers.0.self_attn.q_proj.weight" in trainable
    assert full.value_head[0].in_features == vla_spec.state_dim
    lora = smolvla(vla_spec, "policy.lora.rank=2")
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad and n.startswith(VLM)}
    assert trainable and all("lora_" in n for n in trainable)
    assert lora.value_head[0].in_features == lora.net.vlm_with_expert.vlm_hidden_size  # pooled prefix features


def test_save_load_round_trip_gives_identical_act(vla_spec, obs, tmp_path):
    pol = smolvla(vla_spec, "policy.likelihood=flow_noise", "policy.lora.rank=2")
    pol.update_normalization(obs)
    a = pol.act(obs)
    loaded = Policy.from_pretrained(pol.save_pretrained(tmp_path / "ckpt"))
    assert isinstance(loaded, SmolVLAPolicy) and loaded.name == loaded.config.name == "smolvla"
    assert torch.equal(loaded.act(obs), a)
    assert torch.equal(loaded.state_norm.mean, pol.state_norm.mean)


def test_the_processor_is_saved_with_the_weights_and_older_checkpoints_still_load(vla_spec, obs, tmp_path):
    """processor.json lists the env <-> network steps; a checkpoint written before the statistics moved into the
    processor (``state_norm.*`` / ``action_*`` buffers, no processor files) loads to the same actions."""
    from safetensors.torch import load_file, save_file

    from policies.processors import CameraMap, Processor, RunningNormalize

    pol = smolvla(vla_spec)
    pol.update_normalization(obs)
    d = pol.save_pretrained(tmp_path / "ckpt")
    steps = [s["type"] for s in json.loads((d / "processor.json").read_text())["steps"]]
    assert steps == ["camera_map", "images_to_float", "running_normalize", "pad_vector", "normalize", "pad_vector"]
    saved = Processor.load(d)
    assert saved.find(CameraMap).fed == ["base", "wrist"] and saved.find(CameraMap).blank == 1
    assert torch.equal(saved.find(RunningNormalize).mean, pol.state_norm.mean)
    a = pol.act(obs)
    state = load_file(str(d / "model.safetensors"))
    old = {}
    for k, v in state.items():  # the names of the older layout
        if k.startswith("processor.steps.2."):
            old["state_norm." + k.split(".")[-1]] = v
        elif k.startswith("processor.steps.4."):
            old["action_" + k.split(".")[-1]] = v
        elif not k.startswith("processor."):
            old[k] = v
    old.update({f"state_{n}": torch.zeros(()) for n in ("shift", "scale", "mul", "add")})  # unused, dropped
    save_file(old, str(d / "model.safetensors"), metadata={"policy": "smolvla"})
    for f in ("processor.json", "processor.safetensors"):
        (d / f).unlink()
    assert torch.equal(Policy.from_pretrained(d).act(obs), a)


def test_bf16_and_gradient_checkpointing(vla_spec, obs):
    pol = smolvla(vla_spec, "policy.dtype=bfloat16", "policy.gradient_checkpointing=true", "policy.freeze_vlm=false")
    assert pol.net.action_in_proj.weight.dtype == torch.bfloat16 and pol.net.vlm_with_expert.gradient_checkpointing
    s = pol.sample(obs)
    lp, _, _ = pol.evaluate(obs, s.replay)
    assert (lp - s.logprob).abs().max().item() <= 1e-5
    lp.sum().backward()
    assert pol.net.vlm_with_expert.vlm.model.text_model.layers[0].mlp.up_proj.weight.grad is not None


def loaded(spec: PolicySpec, path: Path = FIXTURE) -> ExactFlowPolicy:
    """A LeRobot checkpoint through ``policy.pretrained_path`` (built directly: the config loader would also
    check it against the default env, whose action space differs from the fixture's); the caller's config keeps
    its 0s (the policy records the checkpoint's chunk and steps in its own copy)."""
    cfg = SmolVLAPolicyConfig(pretrained_path=str(path), chunk_size=0, num_steps=0)
    pol = make_policy(cfg, spec)
    assert (cfg.chunk_size, cfg.num_steps) == (0, 0)
    return pol


@pytest.mark.parametrize("arch,likelihood", [("pi0", "flow_sde"), ("pi05", "flow_noise")])
def test_pi0_and_pi05_through_the_same_policy(vla_spec, obs, tmp_path, arch, likelihood):
    """The registry's other entries: re-score 1e-5, PPO leaves the frozen PaliGemma bit-identical, save/load."""
    pol = smolvla(vla_spec, f"policy={arch}", f"policy.likelihood={likelihood}")
    assert type(pol.net).__name__ == "PI0" and pol.net.pi05 == (arch == "pi05")
    s = pol.sample(obs)
    lp, _, v = pol.evaluate(obs, s.replay)
    assert (lp - s.logprob).abs().max().item() <= 1e-5 and (v - s.value).abs().max().item() <= 1e-5
    a = pol.act(obs)
    before = {n: p.detach().clone() for n, p in pol.named_parameters()}
    ppo_step(pol)
    changed = {n for n, p in pol.named_parameters() if not torch.equal(p.detach(), before[n])}
    pali = {n for n in before if n.startswith("net.paligemma_with_expert.paligemma.")}
    assert pali and not (changed & pali) and "net.action_out_proj.weight" in changed
    pol2 = smolvla(vla_spec, f"policy={arch}", f"policy.likelihood={likelihood}")
    restored = Policy.from_pretrained(pol2.save_pretrained(tmp_path / arch))  # tied embeddings saved as copies
    assert torch.equal(restored.act(obs), pol2.act(obs)) and torch.equal(pol2.act(obs), a)


def _fixture_spec(state: int = 6, action: int = 5) -> PolicySpec:
    return PolicySpec(state_dim=state, action_dim=action, action_low=[-10.0] * action, action_high=[10.0] * action,
                      image_keys=["top", "wrist"], image_size=[32, 32], instruction="pick the cube")


def test_lerobot_checkpoint_through_pretrained_path_acts_as_the_loader(tmp_path):
    pol = loaded(_fixture_spec())
    assert (pol.config.chunk_size, pol.config.num_steps) == (50, 10)  # the checkpoint's own
    g = torch.Generator().manual_seed(0)
    images = {k: torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=g) for k in ("top", "wrist")}
    state = torch.randn(2, 6, generator=g)
    tasks = ["pick the cube", "open a drawer"]  # the fixture keeps 16 prompt tokens; longer words are refused
    actions = pol.act({"images": images, "state": state, "instruction": tasks})

    ckpt = load_smolvla(FIXTURE)
    raw = {f"observation.images.{k}": v.permute(0, 3, 1, 2).float() / 255.0 for k, v in images.items()}
    with torch.no_grad():
        chunk = ckpt.model.sample_actions(ckpt.inputs(raw, state, tasks), torch.zeros(2, 50, 32))
    assert (actions - ckpt.actions(chunk)).abs().max().item() <= 1e-5
    restored = Policy.from_pretrained(pol.save_pretrained(tmp_path / "rl"))  # no LeRobot dir needed any more
    assert torch.equal(restored.act({"images": images, "state": state, "instruction": tasks}), actions)


def test_bad_input_is_one_line(vla_spec, tmp_path):
    wide = PolicySpec(state_dim=70, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, image_keys=["base"])
    with pytest.raises(ValueError, match="state dim 70 exceeds the network's padding max_state_dim=64; raise "
                       "policy.arch.max_state_dim to at least 70") as e:  # the processor's pad_vector step
        smolvla(wide)
    assert "\n" not in str(e.value)
    wide_actions = PolicySpec(state_dim=5, action_dim=9, action_low=[-1.0] * 9, action_high=[1.0] * 9,
                              image_keys=["base"])
    with pytest.raises(ValueError, match="action dim 9 exceeds the network's padding max_action_dim=8"):
        smolvla(wide_actions)
    with pytest.raises(ValueError, match="state / action dims 6 / 33 exceed the checkpoint's padding") as e:
        loaded(_fixture_spec(6, 33))  # past max_action_dim=32 (within it, a new embodiment fine-tunes)
    assert "\n" not in str(e.value)
    other = tmp_path / "pi0"
    shutil.copytree(FIXTURE, other)
    meta = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**meta, "type": "pi0"}))
    with pytest.raises(CheckpointError, match="says type 'pi0', not 'smolvla'; load it with the 'pi0' policy"):
        loaded(_fixture_spec(), other)
    with pytest.raises(ValueError, match="does not know"):
        smolvla(vla_spec, "+policy.arch.no_such_key=1")
    with pytest.raises(ConfigError, match="unknown config key 'policy.architecture'"):  # the family is the network
        smolvla(vla_spec, "policy.architecture=nope")
