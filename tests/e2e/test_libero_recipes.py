"""The headline LIBERO recipes (configs/experiment/libero_spatial_{pi05_ppo,pi0_ppo,oft_grpo}.yaml) end to end on
the CPU with tiny checkpoints in the published layouts (tests/helpers/libero_checkpoints.py): the config loader
builds each as a run would (default tier); ``vlarl-train`` runs two iterations on LIBERO and ``vlarl-eval`` writes
its report from the run's checkpoint (``slow``: LIBERO env creation, Ray start-up and the two processes take
minutes on a shared CPU). A GPU user runs the same commands with ``policy.pretrained_path=`` (README, docs/libero.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.libero_checkpoints import OFT_LIBERO, lerobot_libero

BIN = Path(sys.executable).parent
needs_libero = pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="pip install -e .[libero]")
# the CPU-sized run: one env (a GRPO group of two), 32 px frames, short episodes, two iterations
TINY = ["policy.dtype=float32", "env.num_workers=1", "env.task_ids=[0]", "env.image_size=32",
        "eval.episodes=1", "eval.num_envs=1", "eval.video_episodes=0", "checkpoint_every=1", "logger.progress_bar=false"]
RECIPES = {
    "libero_spatial_pi05_ppo": (["env.num_envs=1", "env.max_episode_steps=10", "algorithm.num_steps=2",
                                 "algorithm.num_minibatches=1", "total_env_steps=20"], 5),
    "libero_spatial_pi0_ppo": (["env.num_envs=1", "env.max_episode_steps=10", "algorithm.num_steps=2",
                                "algorithm.num_minibatches=1", "total_env_steps=20"], 5),
    # a random tiny OFT never succeeds: every group is all-fail, and the recipe's dynamic sampling would drop them
    # all (no update); the CPU run keeps them to exercise the update
    "libero_spatial_oft_grpo": (["env.num_envs=2", "env.max_episode_steps=16", "algorithm.group_size=2",
                                 "algorithm.num_minibatches=1", "total_env_steps=64", "policy.unnorm_key=fixture_sim",
                                 "algorithm.filter_groups=false"], 8),
}


def checkpoint(recipe: str, tmp: Path) -> Path:
    if "oft" in recipe:
        return OFT_LIBERO
    return lerobot_libero("pi05" if "pi05" in recipe else "pi0", tmp / "ckpt")


def overrides(recipe: str, ckpt: Path) -> list[str]:
    return [f"experiment={recipe}", f"policy.pretrained_path={ckpt}", *TINY, *RECIPES[recipe][0]]


@needs_libero
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_builds_with_a_published_layout_checkpoint(recipe, tmp_path):
    """The recipe composes, and its policy loads the checkpoint on the meta device, as ``vlarl-train`` does first;
    the published numbers survive the CPU overrides."""
    from vlarl.config.loader import load_train_config

    cfg = load_train_config(overrides(recipe, checkpoint(recipe, tmp_path)))
    assert cfg.env.task == "libero_spatial" and cfg.env.rendering == "published"
    assert cfg.policy.chunk_size == RECIPES[recipe][1]
    assert cfg.algorithm.lr == 5.0e-6 and cfg.algorithm.clip_low == 0.2


def _run(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.heavy
@needs_libero
@pytest.mark.parametrize("recipe", [pytest.param(r, marks=[] if "pi05" in r else [pytest.mark.slow])
                                    for r in sorted(RECIPES)])
def test_recipe_trains_and_evaluates_on_libero(recipe, tmp_path):
    """Two iterations of ``vlarl-train`` on LIBERO-Spatial task 0, then ``vlarl-eval`` on the run's checkpoint.
    The headline (pi0.5) runs in the default tier (~1.5 min); pi0 and OFT, which share its path, in the slow tier."""
    run = tmp_path / "run"
    _run([str(BIN / "vlarl-train"), f"run_dir={run}", *overrides(recipe, checkpoint(recipe, tmp_path))])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "train/policy_loss" in m]
    assert len(trained) >= 1 and all(abs(m["train/policy_loss"]) < 1e6 for m in trained)
    ckpt = run / "checkpoints" / "latest"
    assert (ckpt / "model.safetensors").is_file()
    out = tmp_path / "eval"
    # in this process: vlarl-eval's own entry point, without a second interpreter's imports
    from vlarl.cli import eval_main

    assert eval_main([f"checkpoint={ckpt}", "episodes=1", "num_envs=1", f"output={out}"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["episodes"] == 1 and report["task"] == "libero_spatial"
    assert 0.0 <= report["success_once"] <= 1.0


def test_oft_libero_conventions_wrap_the_network():
    """``policy.conventions=libero_oft``: the OFT fixture checkpoint acting on LIBERO-shaped observations feeds the
    TF-exact 224 px crops (the same network input as feeding them by hand) and sends +-1 grippers to the env."""
    import torch

    from policies.ar_vla.openvla_config import OpenVLAOFTPolicyConfig
    from policies.base import PolicySpec
    from policies.processors.libero import OFTImages
    from policies.registry import make_policy

    spec = PolicySpec(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7,
                      image_keys=["agentview", "robot0_eye_in_hand"], image_size=[256, 256],
                      instruction="put the bowl on the plate")
    gen = torch.Generator().manual_seed(0)
    obs = {"images": {k: torch.randint(0, 256, (2, 256, 256, 3), dtype=torch.uint8, generator=gen)
                      for k in spec.image_keys},
           "state": torch.randn(2, 8, generator=gen), "instruction": [spec.instruction] * 2}

    def policy(conventions: str):
        cfg = OpenVLAOFTPolicyConfig(pretrained_path=str(OFT_LIBERO), unnorm_key="fixture_sim", chunk_size=8,
                                     action_head="l1", conventions=conventions)
        return make_policy(cfg, spec).eval()

    wrapped, plain = policy("libero_oft"), policy("")
    cropped = {**obs, "images": {k: OFTImages().apply(v) for k, v in obs["images"].items()}}
    with torch.no_grad():
        a, b = wrapped.act(obs), plain.act(cropped)
    assert torch.equal(a[..., :6], b[..., :6])  # the arm: the same network input, the same statistics
    assert set(a[..., 6].unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.equal(a[..., 6], -torch.sign(2 * b[..., 6] - 1))  # OFT's normalize + invert of the plain output
    with pytest.raises(ValueError, match="policy.conventions='libero' is unknown"):
        policy("libero")
