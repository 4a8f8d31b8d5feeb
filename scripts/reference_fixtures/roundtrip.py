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
* ``stats.safetensors``: the changed normalization statistics the export carried. ``perturb`` draws them
  through float32 ``exp``, whose last bit differs between CPUs' vector math libraries (one element of pi0's
  action scale did, between the machine that made this fixture and another); the test re-exports with these
  recorded values (``recorded_stats``) after checking they are that draw within 2 ulp;
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
        if f.suffix in (".safetensors", ".pt"):  # by tensors: a file's own framing may differ run to run
            state = load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, weights_only=True)
            for name, t in sorted(state.items()):
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
        return oft_policy(source)
    lerobot = json.loads((source / "config.json").read_text())
    cams = [k.split(".")[-1] for k, v in lerobot["input_features"].items()
            if v["type"] == "VISUAL" and "empty_camera" not in k]
    state = lerobot["input_features"]["observation.state"]["shape"][0]
    action = lerobot["output_features"]["action"]["shape"][0]
    spec = PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=cams, image_size=[32, 32], instruction=TASKS[0])
    cfg = policy_class(name).config_class(pretrained_path=str(source), chunk_size=0, num_steps=0)
    return make_policy(cfg, spec)


OFT_UNNORM = "fixture_sim"  # which of the OFT fixture's two statistics entries the policy acts with


def oft_policy(source: Path) -> Any:
    """The OFT fixture (``openvla_oft/checkpoint``: L1 head, proprio projector, two cameras, chunk 8)."""
    from policies import make_policy
    from policies.ar_vla.openvla_config import OpenVLAOFTPolicyConfig
    from policies.base import PolicySpec

    io = json.loads((source / "io.json").read_text())["constants"]
    action, state = io["ACTION_DIM"], io["PROPRIO_DIM"]
    spec = PolicySpec(state_dim=state, action_dim=action, action_low=[-1.0] * action, action_high=[1.0] * action,
                      image_keys=["third_person", "wrist"], image_size=[32, 32], instruction=TASKS[0])
    cfg = OpenVLAOFTPolicyConfig(pretrained_path=str(source / "checkpoint"), unnorm_key=OFT_UNNORM,
                                 chunk_size=io["NUM_ACTIONS_CHUNK"], action_head="l1")
    return make_policy(cfg, spec)


def _network_and_stats(policy: Any, family: str) -> tuple[Any, list[tuple[Any, Any]]]:
    """(the network, [(shift or low, scale or high)] of every normalization the policy applies)."""
    if family == "oft":
        stats = [(policy.stat_low, policy.stat_high)]
        if policy.proprio_stats is not None:
            stats.append((policy.proprio_stats.low, policy.proprio_stats.high))
        return policy.model, stats
    return policy.net, [(policy.state_shift, policy.state_scale), (policy.action_shift, policy.action_scale)]


def perturb(policy: Any, family: str, seed: int = SEED) -> Any:
    """Change the policy as an RL update would, deterministically: every tensor of the network moves by
    ``0.02 * N(0, 1) * (its RMS or 1)``; each normalization's shift (low) moves by ``0.1 * N(0, 1)`` and its
    scale (or high - low) by ``exp(0.1 * N(0, 1))``, so the exported statistics differ from the checkpoint's."""
    import torch

    network, stats = _network_and_stats(policy, family)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(network.named_parameters()):
            # the RMS in float64, rounded to float32: the same bits whatever the thread count's reduction order
            rms = p.double().pow(2).mean().sqrt().float().clamp_min(1e-3) if p.numel() else torch.tensor(1.0)
            p.add_((0.02 * rms * torch.randn(p.shape, generator=g)).to(p.dtype))
        for shift, scale in stats:
            step = 0.1 * torch.randn(shift.shape, generator=g).to(shift.dtype)
            factor = torch.exp(0.1 * torch.randn(scale.shape, generator=g)).to(scale.dtype)
            if family == "oft":  # bounds: (low, high) -> (low + step, low + step + (high - low) * factor)
                span = (scale - shift) * factor
                shift.add_(step)
                scale.copy_(shift + span)
            else:
                shift.add_(step)
                scale.mul_(factor)
    return policy


def fixed_inputs(policy: Any, family: str, seed: int = SEED + 1) -> tuple[dict, Any]:
    """Observations in the env schema (uint8 images at the checkpoint's camera sizes, state) and the noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = {"state": torch.randn(BATCH, policy.spec.state_dim, generator=g)}
    shapes = policy_camera_shapes(policy, family)
    for cam, (h, w) in shapes.items():
        tensors[f"image.{cam}"] = torch.randint(0, 256, (BATCH, h, w, 3), dtype=torch.uint8, generator=g)
    if family != "oft":  # OFT's L1 head is deterministic: no noise
        tensors["noise"] = torch.randn(BATCH, policy.chunk_size, policy.model_action_dim, generator=g)
    meta = {"tasks": TASKS, "cameras": list(shapes)}
    if family == "oft":  # OFT's deploy code takes prompt ids: vlarl's, one sample at a time (no padding)
        for b, task in enumerate(TASKS):
            tensors[f"input_ids.{b}"] = policy._text([task], 1)[0][0].cpu()  # noqa: SLF001
        meta["unnorm_key"] = OFT_UNNORM
    return tensors, meta


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
        if "noise" not in tensors:  # OFT: the L1 head's chunk un-normalized as OFT does (no clip to [-1, 1] first),
            # one sample at a time as OFT deploys (vlarl's batch pads prompts of different lengths after <s>
            # without shifting the position ids, which moves a padded sample's actions by ~1e-2)
            rows = []
            for b, task in enumerate(meta["tasks"]):
                one = {k: v[b : b + 1] for k, v in tensors.items() if k == "state" or k.startswith("image.")}
                mean = policy._forward(obs_of(one, {**meta, "tasks": [task]}), None)[0]  # noqa: SLF001
                rows.append(policy.stats.unnormalize(mean)[0])
            return torch.stack(rows)
        inputs, _ = policy.flow_inputs(obs_of(tensors, meta))
        chunk = policy.net.sample_actions(inputs, tensors["noise"].to(policy.device))
        return policy.unnormalize_actions(chunk.float())


def stats_tensors(policy: Any, family: str) -> dict[str, Any]:
    """The policy's normalization statistics as ``{"<i>.shift", "<i>.scale"}`` (the order of
    ``_network_and_stats``)."""
    _, stats = _network_and_stats(policy, family)
    return {f"{i}.{name}": t.detach().clone().contiguous()
            for i, pair in enumerate(stats) for name, t in zip(("shift", "scale"), pair, strict=True)}


def recorded_stats(policy: Any, family: str) -> Any:
    """Set the statistics the fixture's export carried (``stats.safetensors``) on a ``perturb``-ed policy; each
    must be this machine's draw within 2 ulp (an ulp of ``exp`` is all a CPU may change)."""
    import torch
    from safetensors.torch import load_file

    recorded = load_file(str(OUT / family / "stats.safetensors"))
    ours = stats_tensors(policy, family)
    assert sorted(recorded) == sorted(ours), (sorted(recorded), sorted(ours))
    _, stats = _network_and_stats(policy, family)
    with torch.no_grad():
        for i, pair in enumerate(stats):
            for name, t in zip(("shift", "scale"), pair, strict=True):
                r = recorded[f"{i}.{name}"]
                ulps = (r.view(torch.int32).long() - t.view(torch.int32).long()).abs().max().item()
                assert r.dtype == t.dtype and r.shape == t.shape and ulps <= 2, (family, i, name, ulps)
                t.copy_(r)
    return policy


def export(policy: Any, family: str, out: Path) -> Path:
    """``vlarl.export.export_policy`` in the family's reference layout -> the layout's folder."""
    from vlarl.export import export_policy

    fmt = FAMILIES[family][3]
    export_policy(policy, out, formats=[fmt], instruction=TASKS[0])
    return out / fmt


def vlarl_side(family: str, work: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    torch.set_num_threads(1)  # as the test re-exports
    torch.manual_seed(0)
    policy = perturb(vlarl_policy(family), family).eval()
    tensors, meta = fixed_inputs(policy, family)
    folder = OUT / family
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "inputs.safetensors"))
    (folder / "inputs.json").write_text(json.dumps(meta, indent=2) + "\n")
    save_file(stats_tensors(policy, family), str(folder / "stats.safetensors"))
    save_file({"actions": vlarl_actions(policy, tensors, meta).contiguous()}, str(folder / "vlarl_actions.safetensors"))
    return export(policy, family, work / family)


# -- the reference's side (its own venv) ---------------------------------------------------------------
def lerobot_actions(family: str, export_dir: Path, tensors: dict, meta: dict) -> Any:
    """LeRobot 0.4.4: the export through its ``from_pretrained`` and its saved processor pipelines."""
    import torch

    sys.path.insert(0, str(HERE))
    import _lerobot_common as lerobot_common  # the fixture scripts' shared parts: torchvision shim

    lerobot_common.shim_torchvision_ops()
    if family == "smolvla":
        from lerobot.policies.smolvla import processor_smolvla  # noqa: F401  (registers its steps)
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy as Policy
    else:
        import pi0 as fixture  # the fixture script: tiny Gemma builders

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


def oft_actions(export_dir: Path, tensors: dict, meta: dict) -> tuple[Any, dict]:
    """OpenVLA-OFT's deploy path on the export: ``OpenVLAForActionPrediction.from_pretrained``, the dataset
    statistics, action head and proprio projector loaded by OFT's own ``openvla_utils`` functions (compiled from
    its source: that module imports tensorflow), its processor, ``normalize_proprio`` and ``predict_action``."""
    import ast

    import numpy as np
    import torch
    from PIL import Image

    sys.path.insert(0, str(HERE))
    import _openvla_common as common
    import openvla_oft as fixture

    common.shim_torchvision_ops()  # before timm / transformers import torchvision
    import timm
    import transformers

    common.register_tiny_towers()
    from prismatic.extern.hf.modeling_prismatic import OpenVLAForActionPrediction
    from prismatic.extern.hf.processing_prismatic import PrismaticImageProcessor
    from prismatic.models.action_heads import L1RegressionActionHead
    from prismatic.models.projectors import ProprioProjector
    from prismatic.vla import constants as K

    tree = ast.parse(common.read_repo_file("oft", "experiments/robot/openvla_utils.py"))
    wanted = ("find_checkpoint_file", "load_component_state_dict", "_load_dataset_stats", "normalize_proprio")
    scope = {"torch": torch, "os": os, "json": json, "np": np, "Any": object, "Dict": dict,
             "model_is_on_hf_hub": lambda _: False, "NormalizationType": K.NormalizationType,
             "ACTION_PROPRIO_NORMALIZATION_TYPE": K.ACTION_PROPRIO_NORMALIZATION_TYPE}
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    exec(compile(ast.Module(body=fns, type_ignores=[]), "openvla_utils.py", "exec"), scope)

    ckpt = str(export_dir)
    vla = OpenVLAForActionPrediction.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="sdpa")
    vla.vision_backbone.set_num_images_in_input(fixture.NUM_IMAGES)
    vla.eval()
    scope["_load_dataset_stats"](vla, ckpt)
    llm_dim = vla.config.text_config.hidden_size
    head = L1RegressionActionHead(input_dim=llm_dim, hidden_dim=llm_dim, action_dim=K.ACTION_DIM)
    head.load_state_dict(scope["load_component_state_dict"](scope["find_checkpoint_file"](ckpt, "action_head")))
    proprio_projector = ProprioProjector(llm_dim=llm_dim, proprio_dim=K.PROPRIO_DIM)
    proprio_projector.load_state_dict(
        scope["load_component_state_dict"](scope["find_checkpoint_file"](ckpt, "proprio_projector")))
    head.eval(), proprio_projector.eval()
    processor = PrismaticImageProcessor.from_pretrained(ckpt)
    key = meta["unnorm_key"]
    actions = []
    with torch.no_grad():
        for b in range(len(meta["tasks"])):
            pv = torch.cat([processor([Image.fromarray(tensors[f"image.{c}"][b].numpy())], return_tensors="pt")
                            ["pixel_values"] for c in meta["cameras"]], 1)
            ids = tensors[f"input_ids.{b}"][None]
            proprio = scope["normalize_proprio"](tensors["state"][b].double().numpy(), vla.norm_stats[key]["proprio"])
            chunk, _ = vla.predict_action(input_ids=ids, unnorm_key=key, pixel_values=pv,
                                          attention_mask=torch.ones_like(ids), proprio=proprio,
                                          proprio_projector=proprio_projector, action_head=head)
            actions.append(torch.as_tensor(np.asarray(chunk)))
    versions = {"transformers": transformers.__version__, "timm": timm.__version__,
                "openvla_oft_commit": common.repo_commit("oft")}
    return torch.stack(actions), versions


def reference_side(family: str, export_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    folder = OUT / family
    tensors = load_file(str(folder / "inputs.safetensors"))
    meta = json.loads((folder / "inputs.json").read_text())
    loaded = digest(export_dir)  # what the reference is about to load
    if family == "oft":
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
    import _openvla_common as common

    return common.ensure_env(venv, patch_llama=True)


def reference_env(family: str) -> dict[str, str]:
    """OFT's code is not a package on the registry: its files go into a package folder on PYTHONPATH."""
    if family != "oft":
        return {}
    sys.path.insert(0, str(HERE))
    import _openvla_common as common
    import openvla_oft

    root = openvla_oft.VENV / "reference_code"
    common.write_reference_package(root, openvla_oft.FILES)
    return {"PYTHONPATH": str(root), "_CHECK_PEFT": "0"}


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
                                 env={**env, **reference_env(family)})
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
