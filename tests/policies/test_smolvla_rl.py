"""SmolVLA as an RL actor through its FlowArchitecture methods (encode_prefix / velocity / sample_actions).

One Flow-SDE step is scored the way the flow family scores it (Gaussian around the Euler mean); the
tests check that a re-score reproduces the sample's log-prob, that a clipped-PPO step moves only the
trainable parts (action expert, projections, state projection) and leaves the frozen SmolVLM
bit-identical, and that gradient checkpointing changes nothing but memory.
"""

from __future__ import annotations

import pytest
import torch

from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.smolvla import SmolVLA, published_config, tiny_config
from policies.heads.gaussian import gaussian_logprob
from vlarl.algorithms.losses import ppo_policy_loss

STD = 0.1


def tiny_inputs(batch: int = 3, seed: int = 0) -> FlowInputs:
    g = torch.Generator().manual_seed(seed)
    return FlowInputs(
        images=[torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1],
        image_masks=[torch.ones(batch, dtype=torch.bool)],
        tokens=torch.randint(0, 259, (batch, 6), generator=g),
        token_masks=torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]][:batch], dtype=torch.bool),
        state=torch.randn(batch, 8, generator=g),
    )


def sde_step_logprob(model: SmolVLA, inputs: FlowInputs, x: torch.Tensor, x_next: torch.Tensor, k: int):
    """log N(x_next; x + v(x, t_k) dt, STD^2) per element: one stochastic step of the chain."""
    dt = -1.0 / model.num_steps
    t = torch.full((x.shape[0],), 1.0 + k * dt)
    v = model.velocity(model.encode_prefix(inputs), inputs, x, t)
    return gaussian_logprob(x_next, x + v * dt, torch.full_like(x, STD))


@pytest.fixture
def model() -> SmolVLA:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return SmolVLA(tiny_config())


def test_ppo_step_moves_the_expert_and_not_the_frozen_vlm(model):
    inputs = tiny_inputs()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, model.chunk_size, model.max_action_dim, generator=g)
    k = 2
    with torch.no_grad():
        dt = -1.0 / model.num_steps
        v = model.velocity(model.encode_prefix(inputs), inputs, x, torch.full((3,), 1.0 + k * dt))
        x_next = x + v * dt + STD * torch.randn(x.shape, generator=g)
        old = sde_step_logprob(model, inputs, x, x_next, k)

    model.train()
    new = sde_step_logprob(model, inputs, x, x_next, k)
    assert (new.detach() - old).abs().max().item() <= 1e-5  # re-scoring a sample reproduces its log-prob
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.5)
    advantages = torch.tensor([1.0, -1.0, 0.5])[:, None, None].expand_as(new)
    loss, _ = ppo_policy_loss(new, old, advantages, 0.2, 0.2)
    loss.backward()
    opt.step()

    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    vlm = {n for n in before if n.startswith("vlm_with_expert.vlm.")}
    assert vlm and not (changed & vlm)  # the SmolVLM (vision tower included) is frozen by default
    for name in ("action_in_proj.weight", "action_out_proj.weight", "action_time_mlp_in.weight", "state_proj.weight",
                 "vlm_with_expert.lm_expert.layers.0.self_attn.q_proj.weight",
                 "vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"):  # a cross-attention layer
        assert name in changed, name
    with torch.no_grad():
        after = sde_step_logprob(model, inputs, x, x_next, k)
    assert not torch.allclose(after, old)


def test_unfrozen_trunk_trains_except_parts_that_never_reach_the_expert():
    torch.manual_seed(0)
    m = SmolVLA(tiny_config(train_expert_only=False, freeze_vision_encoder=False))
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert "vlm_with_expert.vlm.model.vision_model.embeddings.patch_embedding.weight" in trainable
    assert "vlm_with_expert.vlm.model.text_model.layers.0.mlp.up_proj.weight" in trainable
    assert not any(n.startswith("vlm_with_expert.vlm.model.text_model.layers.3.") for n in trainable)
    assert "vlm_with_expert.vlm.lm_head.weight" not in trainable


def test_gradient_checkpointing_gives_the_same_gradients():
    inputs = tiny_inputs()
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        m = SmolVLA(tiny_config(gradient_checkpointing=ckpt, train_expert_only=False)).train()
        x = torch.randn(3, m.chunk_size, m.max_action_dim, generator=torch.Generator().manual_seed(2))
        m.velocity(m.encode_prefix(inputs), inputs, x, torch.full((3,), 0.7)).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 50
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


def test_published_config_is_smolvla_base_size():
    with torch.device("meta"):
        m = SmolVLA(published_config("smolvla"))
    total = sum(p.numel() for p in m.parameters())
    expert = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("vlm_with_expert.vlm."))
    assert len(m.vlm_with_expert.vlm.model.text_model.layers) == 16
    assert m.vlm_with_expert.expert_hidden_size == 720
    assert (m.chunk_size, m.num_steps, m.max_action_dim, m.max_state_dim) == (50, 10, 32, 32)
    assert 440e6 < total < 460e6 and 95e6 < expert < 105e6  # the paper's ~450M model with a ~100M expert


def _spec(state: int, action: int, cams: list[str]):
    from policies.base import PolicySpec

    return PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=cams)


def test_env_observations_drive_a_tiny_smolvla_and_a_loaded_checkpoint():
    from pathlib import Path

    from policies.flow_vla.smolvla_adapter import build_smolvla

    torch.manual_seed(0)
    arch = build_smolvla(tiny_config(), _spec(5, 4, ["base_camera"]))
    g = torch.Generator().manual_seed(3)
    obs = {"images": {"base_camera": torch.randint(0, 256, (2, 48, 64, 3), dtype=torch.uint8, generator=g)},
           "instruction": ["push the cube", "pick the cube up"]}
    inputs = arch.inputs(obs, torch.randn(2, 5, generator=g))
    assert inputs.images[0].shape == (2, 3, 32, 32) and inputs.images[0].min() >= -1.0
    assert inputs.state.shape == (2, 8) and bool((inputs.state[:, 5:] == 0).all())
    assert inputs.token_masks[0].sum() < inputs.token_masks[1].sum()  # the shorter task is padded
    with torch.no_grad():
        chunk = arch.model.sample_actions(inputs, torch.randn(2, 4, 8, generator=g))
    assert chunk.shape == (2, 4, 8) and torch.isfinite(chunk).all()

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "smolvla"
    loaded = build_smolvla(None, _spec(4, 3, ["front"]), pretrained_path=fixtures / "variant")
    assert loaded.cameras == ["front"] and loaded.empty_cameras == 1  # the checkpoint's empty camera
    with pytest.raises(ValueError, match="action dims 6 / 33 exceed the checkpoint's padding"):
        build_smolvla(None, _spec(6, 33, ["top", "wrist"]), pretrained_path=fixtures / "checkpoint")
    from policies.flow_vla.exact import SmolVLAPolicyConfig
    from policies.registry import make_policy

    with pytest.raises(ValueError, match="state dim 9 exceeds the network's padding max_state_dim=8"):
        make_policy(SmolVLAPolicyConfig(), _spec(9, 4, ["base_camera"]))  # the processor's pad_vector check
