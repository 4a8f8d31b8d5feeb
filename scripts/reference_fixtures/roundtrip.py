"""Round-trip fixtures: an RL-changed vlarl model, exported in its reference layout, loaded and run by the reference.

    python scripts/reference_fixtures/roundtrip.py [smolvla] [pi0] [pi05] [oft]    (default: all)

Run with vlarl's Python. For each family, vlarl (this process) loads the committed tiny reference checkpoint
(``tests/fixtures/reference/<family>/``), changes it as an RL update would (``perturb``: a seeded small change
to every network tensor and to the normalization statistics) and exports it with ``vlarl.export.export_policy``
(``formats=[lerobot]`` / ``[oft]``). The reference code then runs, in its own environment (the fixture scripts'
venvs: ``.reference-envs/smolvla`` for SmolVLA, ``pi0`` for pi0 / pi0.5, ``openvla_oft`` for OFT), this script
with ``--inside``: it loads the export with its own ``from_pretrained`` (LeRobot's policy + processor pipelines;
OFT's model class + its ``action_head`` / ``proprio_projector`` / ``dataset_statistics.json`` loading) and
computes actions on fixed observations and fixed noise. Written under
``tests/fixtures/reference/roundtrip/<family>/``:

* ``inputs.safetensors`` / ``inputs.json``: the observations (uint8 images, state), noise and task strings;
* ``reference.safetensors``: the reference's actions; ``reference.json``: a digest of every file it loaded
  (``digest``: tensors by name, dtype, shape and bytes; JSON canonicalized; other files by bytes) and versions.

``tests/export/test_roundtrip.py`` re-exports with vlarl from the same committed inputs, checks the export's
digest equals the one the reference loaded, and vlarl's actions against the reference's (1e-4).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FIXTURES = ROOT / "tests" / "fixtures" / "reference"
OUT = FIXTURES / "roundtrip"
ENVS = ROOT / ".reference-envs"
SEED = 7
BATCH = 2
TASKS = ["pick up the red cube", "open the top drawer slowly"]
# family -> (reference venv, committed reference checkpoint, vlarl policy name, export format)
FAMILIES = {
    "smolvla": ("smolvla", FIXTURES / "smolvla" / "checkpoint", "smolvla", "lerobot"),
    "pi0": ("pi0", FIXTURES / "pi0" / "checkpoint", "pi0", "lerobot"),
    "pi05": ("pi0", FIXTURES / "pi05" / "checkpoint", "pi05", "lerobot"),
    "oft": ("openvla_oft", FIXTURES / "openvla_oft", "openvla_oft", "oft"),
}


# -- shared by both sides ------------------------------------------------------------------------------
def digest(folder: str | Path) -> dict[str, str]:
    """sha256 per file of an export: safetensors by (name, dtype, shape, bytes) of each tensor in name order,
    JSON canonicalized (sorted keys), every other file by its bytes. Equal digests: the same model files."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        if f.suffix == ".safetensors":
            for name, t in sorted(load_file(str(f)).items()):
                h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
                h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif f.suffix == ".json":
            h.update(json.dumps(json.loads(f.read_text()), sort_keys=True).encode())
        else:
            h.update(f.read_bytes())
        out[str(f.relative_to(folder))] = h.hexdigest()
    return out


# -- vlarl's side (vlarl's Python) ---------------------------------------------------------------------
def vlarl_policy(family: str) -> Any:
    """The committed reference checkpoint loaded whole as a vlarl policy (through ``policy.pretrained_path``)."""
    from policies import make_policy
    from policies.base import PolicySpec
    from policies.registry import policy_class

    _, source, name, _ = FAMILIES[family]
    if family == "oft":
        from policies.ar_vla.oft_export import fixture_policy

        return fixture_policy(source)
    lerobot = json.loads((source / "config.json").read_text())
    cams = [k.split(".")[-1] for k, v in lerobot["input_features"].items()
            if v["type"] == "VISUAL" and "empty_camera" not in k]
    state = lerobot["input_features"]["observation.state"]["shape"][0]
    action = lerobot["output_features"]["action"]["shape"][0]
    spec = PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=cams, image_size=[32, 32], instruction=TASKS[0])
    cfg = policy_class(name).config_class(pretrained_path=str(source), chunk_size=0, num_steps=0)
    return make_policy(cfg, spec)


def perturb(policy: Any, seed: int = SEED) -> Any:
    """Change the policy as an RL update would, deterministically: every tensor of the network moves by
    ``0.02 * N(0, 1) * (its RMS or 1)``, the normalization shifts by ``0.1 * N(0, 1)`` and scales by
    ``exp(0.1 * N(0, 1))`` (so the exported statistics differ from the checkpoint's too)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(policy.net.named_parameters()):
            rms = p.float().pow(2).mean().sqrt().clamp_min(1e-3) if p.numel() else torch.tensor(1.0)
            p.add_((0.02 * rms * torch.randn(p.shape, generator=g)).to(p.dtype))
        for prefix in ("state", "action"):
            shift, scale = getattr(policy, f"{prefix}_shift"), getattr(policy, f"{prefix}_scale")
            shift.add_(0.1 * torch.randn(shift.shape, generator=g))
            scale.mul_(torch.exp(0.1 * torch.randn(scale.shape, generator=g)))
    return policy


def fixed_inputs(policy: Any, family: str, seed: int = SEED + 1) -> tuple[dict, Any]:
    """Observations in the env schema (uint8 images at the checkpoint's camera sizes, state) and the noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = {"state": torch.randn(BATCH, policy.spec.state_dim, generator=g)}
    shapes = policy_camera_shapes(policy, family)
    for cam, (h, w) in shapes.items():
        tensors[f"image.{cam}"] = torch.randint(0, 256, (BATCH, h, w, 3), dtype=torch.uint8, generator=g)
    tensors["noise"] = torch.randn(BATCH, policy.chunk_size, policy.model_action_dim, generator=g)
    return tensors, {"tasks": TASKS, "cameras": list(shapes)}


def policy_camera_shapes(policy: Any, family: str) -> dict[str, tuple[int, int]]:
    source = FAMILIES[family][1]
    if family == "oft":
        return {cam: (policy.spec.image_size[0], policy.spec.image_size[1]) for cam in policy.spec.image_keys}
    feats = json.loads((source / "config.json").read_text())["input_features"]
    return {k.split(".")[-1]: tuple(v["shape"][1:]) for k, v in feats.items()
            if v["type"] == "VISUAL" and "empty_camera" not in k}


def obs_of(tensors: dict, meta: dict) -> dict:
    return {"images": {c: tensors[f"image.{c}"] for c in meta["cameras"]}, "state": tensors["state"],
            "instruction": list(meta["tasks"])}


def vlarl_actions(policy: Any, tensors: dict, meta: dict) -> Any:
    """vlarl's actions [B, T, A] for the fixed observations and noise (the policy's own processor and network)."""
    import torch

    with torch.no_grad():
        if hasattr(policy, "actions_with_noise"):
            return policy.actions_with_noise(obs_of(tensors, meta), tensors["noise"])
        inputs, _ = policy.flow_inputs(obs_of(tensors, meta))
        chunk = policy.net.sample_actions(inputs, tensors["noise"].to(policy.device))
        return policy.unnormalize_actions(chunk.float())


def export(policy: Any, family: str, out: Path) -> Path:
    """``vlarl.export.export_policy`` in the family's reference layout -> the layout's folder."""
    from vlarl.export import export_policy

    fmt = FAMILIES[family][3]
    export_policy(policy, out, formats=[fmt], instruction=TASKS[0])
    return out / fmt


def vlarl_side(family: str, work: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    policy = perturb(vlarl_policy(family)).eval()
    tensors, meta = fixed_inputs(policy, family)
    folder = OUT / family
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "inputs.safetensors"))
    (folder / "inputs.json").write_text(json.dumps(meta, indent=2) + "\n")
    save_file({"actions": vlarl_actions(policy, tensors, meta).contiguous()}, str(folder / "vlarl_actions.safetensors"))
    return export(policy, family, work / family)


# -- the reference's side (its own venv) ---------------------------------------------------------------
def lerobot_actions(family: str, export_dir: Path, tensors: dict, meta: dict) -> Any:
    """LeRobot 0.4.4: the export through its ``from_pretrained`` and its saved processor pipelines."""
    import torch

    if family == "smolvla":
        sys.path.insert(0, str(HERE))
        import smolvla as fixture  # the fixture script: torchvision shim

        fixture.shim_torchvision_ops()
        from lerobot.policies.smolvla import processor_smolvla  # noqa: F401  (registers its steps)
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy as Policy
    else:
        sys.path.insert(0, str(HERE))
        import pi0 as fixture  # the fixture script: torchvision shim, tiny Gemma builders

        fixture.shim_torchvision_ops()
        if (export_dir / "tiny_dims.json").is_file():
            fixture.TINY = json.loads((export_dir / "tiny_dims.json").read_text())
        if family == "pi0":
            from lerobot.policies.pi0 import modeling_pi0 as modeling
            from lerobot.policies.pi0 import processor_pi0  # noqa: F401
            Policy = modeling.PI0Policy  # noqa: N806
        else:
            from lerobot.policies.pi05 import modeling_pi05 as modeling
            from lerobot.policies.pi05 import processor_pi05  # noqa: F401
            Policy = modeling.PI05Policy  # noqa: N806
        fixture.tiny_builders(modeling)
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import (
        batch_to_transition,
        policy_action_to_transition,
        transition_to_batch,
        transition_to_policy_action,
    )

    os.chdir(export_dir)  # the saved vlm_model_name / tokenizer_name are relative to it
    policy = Policy.from_pretrained(str(export_dir)).eval()
    pre = PolicyProcessorPipeline.from_pretrained(str(export_dir), config_filename="policy_preprocessor.json",
                                                  to_transition=batch_to_transition, to_output=transition_to_batch)
    post = PolicyProcessorPipeline.from_pretrained(str(export_dir), config_filename="policy_postprocessor.json",
                                                   to_transition=policy_action_to_transition,
                                                   to_output=transition_to_policy_action)
    batch = {f"observation.images.{c}": tensors[f"image.{c}"].permute(0, 3, 1, 2).float() / 255.0
             for c in meta["cameras"]}
    batch["observation.state"] = tensors["state"].clone()
    batch["task"] = list(meta["tasks"])
    with torch.no_grad():
        processed = pre(batch)
        policy.reset()
        return post(policy.predict_action_chunk(processed, noise=tensors["noise"].clone()))


def reference_side(family: str, export_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    folder = OUT / family
    tensors = load_file(str(folder / "inputs.safetensors"))
    meta = json.loads((folder / "inputs.json").read_text())
    loaded = digest(export_dir)  # what the reference is about to load
    if family == "oft":
        sys.path.insert(0, str(HERE))
        from roundtrip_oft import oft_actions  # noqa: PLC0415

        actions, versions = oft_actions(export_dir, tensors, meta)
    else:
        import lerobot
        import transformers

        actions = lerobot_actions(family, export_dir, tensors, meta)
        versions = {"lerobot": lerobot.__version__, "transformers": transformers.__version__}
    save_file({"actions": actions.float().contiguous()}, str(folder / "reference.safetensors"))
    record = {"family": family, "export_digest": loaded, "seed": SEED,
              "versions": {**versions, "torch": torch.__version__}}
    (folder / "reference.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"[roundtrip] {family}: reference actions {tuple(actions.shape)} written to {folder}")


def reference_python(family: str) -> Path:
    venv = ENVS / FAMILIES[family][0]
    python = venv / "bin" / "python"
    if python.exists():
        return python
    sys.path.insert(0, str(HERE))
    if family == "smolvla":
        import smolvla

        return smolvla.ensure_env()
    if family in ("pi0", "pi05"):
        import pi0

        return pi0.ensure_env(pi0.DEFAULT_OPENPI)
    import openvla_oft

    return openvla_oft.ensure_oft_env()


def main() -> int:
    args = sys.argv[1:]
    if "--inside" in args:
        i = args.index("--inside")
        reference_side(args[i + 1], Path(args[i + 2]))
        return 0
    families = [a for a in args if a in FAMILIES] or list(FAMILIES)
    unknown = [a for a in args if a not in FAMILIES]
    if unknown:
        print(f"roundtrip fixtures: error: unknown families {unknown}; choose from {list(FAMILIES)}", file=sys.stderr)
        return 2
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as work:
        for family in families:
            exported = vlarl_side(family, Path(work))
            python = reference_python(family)
            rc = subprocess.call([str(python), str(Path(__file__).resolve()), "--inside", family, str(exported)],
                                 env=env)
            if rc:
                return rc
            shutil.rmtree(exported)
            from safetensors.torch import load_file

            ours, ref = (load_file(str(OUT / family / f))["actions"] for f in
                         ("vlarl_actions.safetensors", "reference.safetensors"))
            print(f"[roundtrip] {family}: max |vlarl - reference| = {(ours - ref).abs().max().item():.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
