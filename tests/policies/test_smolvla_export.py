"""SmolVLA's deterministic chunk (prefix + 10 Euler steps) exports: torch.export and ONNX (ONNX Runtime),
one dynamic-batch program checked at batch 1 and 8 against eager within 1e-4, on the LeRobot fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from policies.flow_vla.interface import FlowInputs
from policies.flow_vla.smolvla import SmolVLA
from policies.flow_vla.smolvla_checkpoint import load_smolvla
from tests.helpers.recipes import PPO

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "smolvla" / "checkpoint"
pytestmark = pytest.mark.slow


class ChunkGraph(nn.Module):
    """(cameras..., tokens, token mask, state, noise) -> chunk [B, T, A_pad]: what a deployment runs."""

    def __init__(self, model: SmolVLA):
        super().__init__()
        self.model = model

    def forward(self, top, wrist, tokens, token_mask, state, noise):
        present = torch.ones_like(token_mask[:, 0])
        return self.model.sample_actions(FlowInputs([top, wrist], [present, present], tokens, token_mask, state), noise)


def batch_of(io: dict[str, torch.Tensor], n: int) -> tuple[torch.Tensor, ...]:
    idx = torch.arange(n) % 2
    keys = ("model.image.0", "model.image.1", "model.tokens", "model.token_mask", "model.state", "noise")
    return tuple(io[k][idx] for k in keys)


@pytest.fixture(scope="module")
def graph_and_io():
    torch.set_num_threads(1)
    return ChunkGraph(load_smolvla(FIXTURE).model).eval(), load_file(str(FIXTURE / "io.safetensors"))


def _dynamic():
    b = torch.export.Dim("batch", min=1, max=64)
    return tuple({0: b} for _ in range(6))


def test_torch_export_matches_eager(graph_and_io):
    graph, io = graph_and_io
    program = torch.export.export(graph, batch_of(io, 2), dynamic_shapes=_dynamic())
    for n in (1, 8):
        args = batch_of(io, n)
        with torch.no_grad():
            assert (program.module()(*args) - graph(*args)).abs().max().item() <= 1e-4


def test_onnx_matches_eager(graph_and_io, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    graph, io = graph_and_io
    names = ["top", "wrist", "tokens", "token_mask", "state", "noise"]
    program = torch.onnx.export(graph, batch_of(io, 2), dynamo=True, input_names=names, output_names=["chunk"],
                                dynamic_shapes=_dynamic(), verbose=False)
    program.save(str(tmp_path / "smolvla.onnx"))
    session = ort.InferenceSession(str(tmp_path / "smolvla.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 8):
        args = batch_of(io, n)
        out = session.run(None, {k: v.numpy() for k, v in zip(names, args, strict=True)})[0]
        with torch.no_grad():
            assert (torch.from_numpy(out) - graph(*args)).abs().max().item() <= 1e-4


def test_exact_policy_exports_through_vlarl_export(tmp_path):
    """``policy=smolvla`` (RL policy: state normalization, the camera transform, 4 Euler steps, action
    scaling, LoRA) saved as a vlarl checkpoint and exported by ``vlarl-export`` to ONNX, torch.export and
    the HF layout (LoRA merged), each within 1e-4 of eager ``act()`` at batch 1 and 8."""
    import json

    from policies import make_policy
    from policies.base import PolicySpec
    from vlarl.config import load_train_config
    from vlarl.export.cli import main

    torch.set_num_threads(1)
    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0, -2.0, 0.0], action_high=[1.0, 2.0, 1.0],
                      image_keys=["base"], image_size=[40, 40], instruction="push the cube to the goal")
    torch.manual_seed(0)
    policy = make_policy(load_train_config([PPO, "policy=smolvla", "policy.lora.rank=2"]).policy, spec)
    with torch.no_grad():  # LoRA B starts at zero: give the adapters something to merge
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    policy.update_normalization({"state": torch.randn(64, 5, generator=torch.Generator().manual_seed(1)) * 3})
    ckpt = policy.save_pretrained(tmp_path / "ckpt")
    assert main([f"checkpoint={ckpt}", f"output={tmp_path / 'out'}", "formats=[onnx,torch_export,hf]"]) == 0
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert set(manifest["formats"]) == {"onnx", "torch_export", "hf"}
    assert manifest["formats"]["hf"]["lora_layers_merged"] > 0
    for rep in manifest["formats"].values():
        assert set(rep["max_abs_err"]) == {"1", "8"} and max(rep["max_abs_err"].values()) <= 1e-4
