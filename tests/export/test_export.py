"""Export of the MLP family to ONNX (run in ONNX Runtime), torch.export and an HF-layout directory:
numerically equal to eager act() within 1e-4 at batch sizes the exporter did not check; clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from policies.base import Policy, PolicySpec
from policies.mlp import MLPPolicy, MLPPolicyConfig
from vlarl.export import ExportError, export_checkpoint, export_policy, obs_from_inputs, random_inputs
from vlarl.export.cli import main as export_main

SPEC = PolicySpec(state_dim=11, action_dim=4, action_low=[-1.0, -0.5, 0.0, -2.0], action_high=[1.0, 0.5, 1.0, 2.0],
                  task="PushCube-v1", instruction="push the cube")


def _mlp(chunk: int = 3) -> MLPPolicy:
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(hidden_sizes=[32, 32], chunk_size=chunk), SPEC)
    g = torch.Generator().manual_seed(1)
    policy.update_normalization({"state": torch.randn(64, 11, generator=g) * 3 + 1})  # non-trivial stats
    with torch.no_grad():
        policy.actor[-1].weight.mul_(20.0)  # actions spread over (and past) the bounds: clipping is exercised
    return policy.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    ckpt = _mlp().save_pretrained(root / "ckpt")
    manifest = export_checkpoint(ckpt, root / "out")
    return ckpt, root / "out", manifest


def _eager(policy, inputs):
    with torch.no_grad():
        return policy.act(obs_from_inputs(policy, inputs, SPEC.instruction)).numpy()


def test_all_formats_written_with_verification_in_the_manifest(exported):
    _, out, manifest = exported
    assert json.loads((out / "export.json").read_text()) == manifest
    assert set(manifest["formats"]) == {"onnx", "torch_export", "hf"}
    for rep in manifest["formats"].values():
        assert set(rep["max_abs_err"]) == {"1", "8"} and max(rep["max_abs_err"].values()) <= 1e-4
    assert manifest["inputs"] == [{"name": "state", "dtype": "float32", "shape": ["batch", 11]}]
    assert manifest["outputs"][0]["shape"] == ["batch", 3, 4]
    assert manifest["formats"]["onnx"]["opset"] >= 17
    assert (out / "policy.onnx").is_file() and (out / "policy.pt2").is_file() and (out / "normalization.json").is_file()
    hf = json.loads((out / "hf" / "config.json").read_text())
    assert hf["architectures"] == ["MLPPolicy"] and hf["model_type"] == "vlarl_mlp"
    assert not list(out.glob(".tmp-*"))


def test_onnx_runtime_and_torch_export_match_eager_at_new_batch_sizes(exported):
    import onnxruntime as ort

    ckpt, out, _ = exported
    policy = Policy.from_pretrained(ckpt).eval()
    session = ort.InferenceSession(str(out / "policy.onnx"), providers=["CPUExecutionProvider"])
    program = torch.export.load(str(out / "policy.pt2")).module()
    g = torch.Generator().manual_seed(7)
    for batch in (3, 17):
        inputs = random_inputs(policy, batch, g)
        ref = _eager(policy, inputs)
        got_ort = session.run(["actions"], {"state": inputs[0].numpy()})[0]
        got_pt2 = program(*inputs).numpy()
        assert got_ort.shape == got_pt2.shape == (batch, 3, 4)
        np.testing.assert_allclose(got_ort, ref, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got_pt2, ref, atol=1e-4, rtol=0)
    assert np.all(ref <= np.array(SPEC.action_high)) and np.all(ref >= np.array(SPEC.action_low))


def test_hf_directory_reloads_to_the_same_policy(exported):
    ckpt, out, _ = exported
    a, b = Policy.from_pretrained(ckpt), Policy.from_pretrained(out / "hf")
    inputs = random_inputs(a, 5, torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(_eager(a, inputs), _eager(b, inputs))


class _NumpyActPolicy(MLPPolicy):
    """act() leaves torch for numpy: a step no exporter can trace."""

    def act(self, obs):
        return torch.from_numpy(np.tanh(super().act(obs).numpy()))


def test_unsupported_op_is_a_clear_error_and_writes_nothing(tmp_path):
    policy = _NumpyActPolicy(MLPPolicyConfig(hidden_sizes=[8]), SPEC)
    with pytest.raises(ExportError, match=r"torch.export export of policy 'mlp' failed .*must be tensor code"):
        export_policy(policy, tmp_path, ["torch_export"])
    assert not list(tmp_path.iterdir())


def test_cli_errors_are_one_line(tmp_path, capsys):
    ckpt = _mlp().save_pretrained(tmp_path / "ckpt")
    assert export_main([f"checkpoint={ckpt}", "formats=[tflite]", f"output={tmp_path / 'o'}"]) == 2
    assert "unknown export format(s) ['tflite']" in capsys.readouterr().err
    assert export_main([f"checkpoint={ckpt}", "opset=high"]) == 2
    assert "opset must be an integer" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "normalization.json").unlink()
    assert export_main([f"checkpoint={broken}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing ['normalization.json']" in err and len(err.splitlines()) == 1


def test_cli_exports_torch_program(tmp_path, capsys):
    ckpt = _mlp(chunk=1).save_pretrained(tmp_path / "ckpt")
    assert export_main([f"checkpoint={ckpt}", "formats=[torch_export]"]) == 0
    assert (ckpt / "export" / "policy.pt2").is_file()
    assert "torch_export -> " in capsys.readouterr().out


def test_vla_checkpoint_without_processor_is_refused_by_export_and_eval(tmp_path, capsys):
    """A VLA checkpoint whose processor files were lost must not load with a default tokenizer/backbone."""
    pytest.importorskip("transformers", reason="the VLA families need the vla extra (pip install -e .[vla])")
    from policies import make_policy
    from policies.diffusion import DiffusionPolicyConfig
    from vlarl.cli import eval_main

    spec = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3,
                      task="PushCube-v1", instruction="push the cube")
    ckpt = make_policy(DiffusionPolicyConfig(chunk_size=2), spec).save_pretrained(tmp_path / "ckpt")
    assert Policy.from_pretrained(ckpt).name == "diffusion"  # complete: loads
    (ckpt / "processor_config.json").unlink()
    assert export_main([f"checkpoint={ckpt}", "formats=[hf]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing its processor files ['processor_config.json']" in err
    assert "policy.save_pretrained" in err and not (ckpt / "export").exists()
    assert eval_main([f"checkpoint={ckpt}"]) == 2
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vlarl-eval:")]
    assert len(ours) == 1 and "missing its processor files ['processor_config.json']" in ours[0]
