"""Policy capabilities are declared Protocols (``policies.capabilities``) and each algorithm's spec names the ones
it needs: the registry answers which families have a capability, a built policy answers whether it has it
switched on, and no algorithm, exporter or evaluator probes a policy with ``getattr`` / ``hasattr``."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from policies.base import PolicySpec
from policies.capabilities import (
    CRITIC_IMAGE_ENCODER,
    INSTRUCTION_TOKENS,
    NOISE_STEERING,
    REPARAMETERIZED,
    SFT,
    FixedInstructionTokens,
    InstructionTokens,
    critic_cameras,
)
from policies.cnn import CNNPolicyConfig
from policies.mlp import MLPPolicy, MLPPolicyConfig
from policies.registry import make_policy
from vlarl.algorithms.registry import ALGORITHMS
from vlarl.algorithms.spec import AlgorithmConfig, capability_problem

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
STATE = PolicySpec(state_dim=3, action_dim=2, action_low=[-1.0] * 2, action_high=[1.0] * 2)
RGB = replace(STATE, image_keys=["base_camera", "hand_camera"], image_size=[64, 64])


def test_the_registry_says_which_families_have_each_capability():
    assert {"mlp", "cnn", "noise_steering"} <= set(REPARAMETERIZED.families())
    assert "diffusion" not in REPARAMETERIZED.families()
    assert NOISE_STEERING.families() == ["noise_steering", "noise_steering_cnn"]
    assert "noise_steering_cnn" in CRITIC_IMAGE_ENCODER.families()
    assert "cnn" in CRITIC_IMAGE_ENCODER.families() and "mlp" not in CRITIC_IMAGE_ENCODER.families()
    assert {"cnn", "diffusion", "flow_vla"} <= set(SFT.families()) and "mlp" not in SFT.families()
    assert INSTRUCTION_TOKENS.families() == ["ar_vla", "diffusion", "flow_vla", "openvla", "openvla_oft", "pi0", "pi05",
                                             "smolvla"]  # the VLM families (VLAPolicy), one per exact network


def test_a_built_policy_has_a_capability_only_when_switched_on():
    off = MLPPolicy(MLPPolicyConfig(chunk_size=2), STATE)
    on = MLPPolicy(MLPPolicyConfig(chunk_size=2, squash=True), STATE)
    assert REPARAMETERIZED.held_by(on) and not REPARAMETERIZED.held_by(off)
    assert REPARAMETERIZED.refusal(on, "algorithm=sac") is None
    msg = REPARAMETERIZED.refusal(off, "algorithm=sac")
    assert msg == ("algorithm=sac needs reparameterized sampling (rsample(obs) with a tanh-squashed chunk), which "
                   "policy=mlp has switched off: set policy.squash=true")
    steer = NOISE_STEERING.refusal(on, "algorithm=dsrl")
    assert "which policy=mlp does not have; policies that have it: policy=noise_steering" in steer


def test_critic_cameras_come_from_a_declared_critic_encoder():
    cnn = make_policy(CNNPolicyConfig(chunk_size=2, squash=True), RGB)
    assert critic_cameras(cnn) == ["base_camera", "hand_camera"]  # no selection: every camera of the spec
    assert critic_cameras(MLPPolicy(MLPPolicyConfig(chunk_size=2, squash=True), STATE)) == []
    assert CRITIC_IMAGE_ENCODER.held_by(cnn)


def test_every_algorithm_declares_its_config_and_capabilities():
    need = {name: [c.name for c in spec.requires] for name, spec in ALGORITHMS.items()}
    assert need == {"ppo": [], "grpo": [], "sac": ["reparameterized sampling"], "rlpd": ["reparameterized sampling"],
                    "dsrl": ["noise steering", "reparameterized sampling"], "pa_rl": ["supervised fine-tuning"]}
    for name, spec in ALGORITHMS.items():
        assert issubclass(spec.config, AlgorithmConfig) and spec.config().name == name
        yaml = (REPO / "configs" / "algorithm" / f"{name}.yaml").read_text()
        assert f"- {name}_schema" in yaml
    off = MLPPolicy(MLPPolicyConfig(chunk_size=2), STATE)
    assert "set policy.squash=true" in capability_problem(ALGORITHMS["rlpd"], off)
    assert capability_problem(ALGORITHMS["ppo"], off) is None
    assert "algorithm=pa_rl needs supervised fine-tuning" in capability_problem(ALGORITHMS["pa_rl"], off)


class _Tokenizing(FixedInstructionTokens):
    """A stand-in with the tokenizer method the mixin wraps (the real one is OpenVLA's, tested in tests/export)."""

    calls = 0

    def _text(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        type(self).calls += 1
        ids = torch.tensor([[len(s) for s in instructions]]).expand(batch, -1)
        return ids, torch.ones_like(ids)


def test_fixed_instruction_tokens_replace_the_tokenizer_inside_the_context_only():
    policy = _Tokenizing()
    assert isinstance(policy, InstructionTokens)
    ids, mask = policy.instruction_tokens(["push"], 1)
    assert ids.tolist() == [[4]]
    with policy.fixed_instruction(torch.tensor([[7, 8]]), torch.tensor([[1, 1]])):
        fixed, _ = policy._text(["anything"], 3)
        assert fixed.tolist() == [[7, 8]] * 3
    assert policy._text(["abc"], 1)[0].tolist() == [[3]]  # the class's tokenizer again
    with pytest.raises(RuntimeError), policy.fixed_instruction(ids, mask):
        raise RuntimeError("a failed trace")
    assert policy._text(["ab"], 1)[0].tolist() == [[2]]


def test_no_capability_probe_in_algorithms_export_or_evaluation():
    """A policy's capabilities are asked through the Protocols, never with getattr/hasattr on the policy."""
    probe = re.compile(r"\b(getattr|hasattr)\(\s*(self\.)?(policy|model|pol)\b")
    found = [f"{p.relative_to(REPO)}:{i}" for d in ("vlarl/algorithms", "vlarl/export", "vlarl/evaluation")
             for p in sorted((REPO / d).glob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
             if probe.search(line)]
    assert found == []
