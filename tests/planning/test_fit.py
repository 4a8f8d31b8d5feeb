"""The memory planner's decision: ``placement.gpu_memory_gb`` picks the largest micro-batch that fits, the
recipes order their knobs, and a budget nothing fits is refused in one line with exit code 2 and nothing written.

Budgets are set relative to the planner's own predictions (no absolute memory numbers in a test)."""

from __future__ import annotations

import pytest

from tests.helpers.recipes import PPO
from vlarl.config import load_train_config
from vlarl.planning.fit import (
    ALLOCATOR_HEADROOM,
    GIB,
    PlanError,
    Planner,
    apply_fit,
    choose_fit,
    micro_batches,
)
from vlarl.planning.knobs import Recipe, apply_recipe, configured_recipe, recipes_from

MLP = [PPO, "policy=mlp", "policy.hidden_sizes=[64,64]", "env.num_envs=4", "env.num_workers=2", "algorithm.num_steps=8",
       "algorithm.num_minibatches=1"]


def _gb_for(nbytes: int) -> float:
    """The gpu_memory_gb whose usable budget is ``nbytes`` (inverse of fit.budget_bytes, rounded up a little)."""
    return (nbytes + 64) / (GIB * (1 - ALLOCATOR_HEADROOM))


def test_auto_fit_picks_the_largest_micro_batch_that_fits(capsys):
    cfg = load_train_config(MLP)
    planner = Planner(cfg)
    (recipe,) = recipes_from(cfg.policy)  # the MLP declares no dtype / checkpointing / LoRA knob
    sizes = micro_batches(cfg)
    assert sizes[0] == (1, 32) and sizes[-1] == (32, 1)
    full = planner.device_bytes(recipe, 32)
    half = planner.device_bytes(recipe, 16)
    assert half < full  # activations scale with the rows of a step
    gb = _gb_for(half)  # room for 16 rows, not 32
    fit = choose_fit(cfg, gb, planner)
    assert (fit.micro_batch, fit.num_minibatches) == (16, 2)
    assert fit.predicted_bytes == half <= fit.budget_bytes < full

    # what vlarl-train does with placement.gpu_memory_gb: rewrite the config and say so
    fitted = load_train_config([*MLP, f"placement.gpu_memory_gb={gb!r}"])
    assert fitted.algorithm.num_minibatches == 1  # the loader leaves the config as written
    assert apply_fit(fitted).micro_batch == 16
    assert fitted.algorithm.num_minibatches == 2
    assert "memory plan: full/fp32/no-ckpt, micro-batch 16" in capsys.readouterr().out


def test_nothing_fits_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    from vlarl.cli import train_main

    cfg = load_train_config(MLP)
    smallest = Planner(cfg).device_bytes(configured_recipe(cfg.policy), 1)
    gb = _gb_for(smallest) * 0.5
    with pytest.raises(PlanError):
        choose_fit(cfg, gb)
    run_dir = tmp_path / "run"
    code = train_main([*MLP, f"placement.gpu_memory_gb={gb!r}", f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "nothing fits" in err[0] and "placement.gpu_memory_gb" in err[0]
    assert not run_dir.exists()


def test_plan_cli_prints_the_table_and_refuses_bad_numbers(capsys):
    from vlarl.planning.cli import main

    assert main([*MLP, "gpu_memory_gb=lots"]) == 2
    assert "not a number" in capsys.readouterr().err
    assert main([*MLP, "gpu_memory_gb=1000"]) == 0
    out = capsys.readouterr().out
    assert "| full/fp32/no-ckpt | 32 |" in out and "| yes |" in out and "fit 1000 GB: full/fp32/no-ckpt" in out


@pytest.mark.heavy
def test_recipes_order_and_what_each_knob_saves():
    """pi0 (tiny): checkpointing, then bf16, then fewer trained weights; each saves what it should."""
    cfg = load_train_config([PPO, "policy=pi0", "policy.freeze_vlm=false", "env.num_envs=4", "env.num_workers=2",
                             "algorithm.num_steps=2", "algorithm.num_minibatches=1"])
    recipes = recipes_from(cfg.policy)
    assert recipes[0] == Recipe("full", "float32", False) == configured_recipe(cfg.policy)
    assert [r.label() for r in recipes[:4]] == ["full/fp32/no-ckpt", "full/fp32/ckpt", "full/bf16/no-ckpt",
                                                "full/bf16/ckpt"]
    assert recipes[-1] == Recipe("expert", "bfloat16", True)
    assert apply_recipe(cfg.policy, Recipe("lora", "float32", False)).lora.rank > 0
    planner = Planner(cfg)
    full = planner.trace(recipes[0], 8)
    bf16 = planner.trace(Recipe("full", "bfloat16", False), 8)
    expert = planner.trace(Recipe("expert", "float32", False), 8)
    assert bf16.update.parameters < 0.6 * full.update.parameters  # 2-byte weights (fp32 heads and norms stay)
    assert expert.trainable_parameters < full.trainable_parameters
    assert expert.update.optimizer < full.update.optimizer  # Adam keeps state for trained weights only
    with pytest.raises(PlanError):
        choose_fit(cfg, _gb_for(planner.device_bytes(recipes[-1], 1)) * 0.5, planner)
