"""pi0 / pi0.5 behind the env schema (policies/flow_vla/pi0_adapter.py): tiny configs and the LeRobot fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from policies.base import PolicySpec
from policies.flow_vla.pi0 import tiny_config
from policies.flow_vla.pi0_adapter import build_pi0

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"


def spec(state_dim: int, action_dim: int, cameras: tuple[str, ...] = ("base",)) -> PolicySpec:
    return PolicySpec(state_dim=state_dim, action_dim=action_dim, action_low=[-1.0] * action_dim,
                      action_high=[1.0] * action_dim, image_keys=list(cameras))


def obs(batch: int, cameras: tuple[str, ...], size: int = 48) -> dict:
    rng = np.random.default_rng(0)
    return {"images": {c: rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8) for c in cameras},
            "instruction": ["push the cube"] * batch}


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_tiny_config_acts_on_env_observations(kind):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    arch = build_pi0(tiny_config(kind), spec(5, 4, ("base", "wrist")))
    state = torch.randn(2, 5)
    inputs = arch.inputs(obs(2, ("base", "wrist")), state)
    assert [im.shape for im in inputs.images] == [(2, 3, 32, 32)] * 2 and inputs.state.shape == (2, 8)
    ids, mask = arch.tokens(["push the cube"] * 2, state if kind == "pi05" else None)
    assert torch.equal(ids, inputs.tokens) and torch.equal(mask, inputs.token_masks)
    with torch.no_grad():
        chunk = arch.model.sample_actions(inputs, torch.randn(2, 4, 8))
    assert chunk.shape == (2, 4, 8) and torch.isfinite(chunk).all()
    if kind == "pi05":  # the prompt carries the state: no fixed tokens, inputs() tokenizes with the state
        assert arch.tokens(["push the cube"] * 2) is None
        again = arch.inputs(obs(2, ("base", "wrist")), state, arch.tokens(["push the cube"] * 2))
        assert torch.equal(again.tokens, inputs.tokens)


def test_fixture_with_env_cameras_by_name_matches_lerobot():
    """The pi0 fixture behind an env whose cameras are named like the checkpoint's: same actions as LeRobot."""
    torch.set_num_threads(1)
    path = FIXTURES / "pi0" / "checkpoint"
    io = load_file(str(path / "io.safetensors"))
    arch = build_pi0(None, spec(6, 5, ("wrist", "base")), pretrained_path=path, vlm_path=path / "tokenizer")
    assert arch.cameras == ["base", "wrist"] and arch.empty_cameras == 1
    ckpt = arch.checkpoint
    assert ckpt is not None and ckpt.report.missing == [] == ckpt.report.unused
    images = {"base": io["raw.observation.images.base"], "wrist": io["raw.observation.images.wrist"]}
    env_obs = {"images": {k: (v * 255).round().to(torch.uint8).permute(0, 2, 3, 1) for k, v in images.items()},
               "instruction": ["pick up the red cube", "open_the top drawer slowly"]}
    inputs = arch.inputs(env_obs, ckpt.state_norm.normalize(io["raw.observation.state"]))
    assert torch.equal(inputs.tokens, io["model.tokens"])
    with torch.no_grad():
        actions = ckpt.actions(arch.model.sample_actions(inputs, io["noise"]))
    assert actions.shape == io["actions"].shape
    assert (actions - io["actions"]).abs().max().item() < 0.5  # uint8 images: close, not equal (parity: test_pi0_parity)


def test_bad_env_for_a_checkpoint_is_one_line():
    path = FIXTURES / "pi05" / "checkpoint"
    with pytest.raises(ValueError, match="state / action dims 4 / 33 exceed the checkpoint's padding") as err:
        build_pi0(None, spec(4, 33), pretrained_path=path)  # within max_action_dim=32 a new embodiment fine-tunes
    assert "\n" not in str(err.value)
    from policies.flow_vla.exact import PI0PolicyConfig
    from policies.registry import make_policy

    with pytest.raises(ValueError, match="state dim 9 exceeds the network's padding max_state_dim=8"):
        make_policy(PI0PolicyConfig(), spec(9, 4))  # the policy's processor (pad_vector) checks the padding
    with pytest.raises(ValueError, match="unknown config keys"):
        build_pi0({"chunk": 3}, spec(4, 4))
    arch = build_pi0({"num_inference_steps": 3}, spec(4, 3), pretrained_path=path)
    assert arch.model.num_steps == 3 and arch.model.cfg.type == "pi05"


def test_freezing_and_gradient_checkpointing():
    """LeRobot's freezing flags, and checkpointed layers giving the same gradients as plain ones."""
    from policies.flow_vla.pi0 import PI0

    torch.set_num_threads(1)
    frozen = PI0(tiny_config("pi05", train_expert_only=True))
    trainable = {n.split(".")[1] if n.startswith("paligemma_with_expert.") else n.split(".")[0]
                 for n, p in frozen.named_parameters() if p.requires_grad}
    assert trainable == {"gemma_expert", "action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"}
    vision = PI0(tiny_config("pi0", freeze_vision_encoder=True)).paligemma_with_expert.paligemma.model
    assert not any(p.requires_grad for p in vision.vision_tower.parameters())
    assert all(p.requires_grad for p in vision.language_model.parameters())

    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = PI0(tiny_config("pi0", gradient_checkpointing=ckpt))
        arch = build_pi0(model.cfg, spec(5, 4))
        arch.model.load_state_dict(model.state_dict())
        inputs = arch.inputs(obs(2, ("base",)), torch.randn(2, 5, generator=torch.Generator().manual_seed(1)))
        prefix = arch.model.encode_prefix(inputs)
        v = arch.model.velocity(prefix, inputs, torch.ones(2, 4, 8), torch.full((2,), 0.3))
        v.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in arch.model.parameters() if p.grad is not None]))
    assert arch.model.paligemma_with_expert.gradient_checkpointing
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
