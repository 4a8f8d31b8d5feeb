"""Vision pretraining (``vlarl/vision_pretrain.py``, ``scripts/pretrain_vision.py``): the tiny OFT's towers learn to
say where things are in a frame; the script's saved policy holds the trained towers, the untouched rest and the
demonstrations' state statistics, and loads for SFT; bad input is one line, exit 2, nothing written.

The learning check uses synthetic frames (a white square on black; the target is its position), so it is quick and
its answer is known; the script runs the real ManiSkill language task with its scripted expert's demonstrations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

TASK = "PushCubeToColor-v1"


def _tiny_oft(experiment: str = "multitask_oft_sft_rl", *more: str):
    from vlarl.experiments import training_policy

    return training_policy([f"experiment={experiment}", f"env.tasks=[{TASK}]", "env.image_size=32", *more], seed=0)


def _squares(n: int, size: int = 32, side: int = 8, seed: int = 0):
    from vlarl.vision_pretrain import Frames

    g = np.random.default_rng(seed)
    xy = g.integers(0, size - side, size=(n, 2))
    im = np.zeros((n, size, size, 3), np.uint8)
    for i, (x, y) in enumerate(xy):
        im[i, y:y + side, x:x + side] = 255
    states = np.concatenate([xy.astype(np.float32), np.full((n, 1), 3.0, np.float32)], 1)  # a constant third dim
    return Frames(torch.from_numpy(im), torch.from_numpy(states), episodes=n)


@pytest.mark.parametrize("frozen", [False, True])
def test_the_towers_learn_where_a_square_is_and_nothing_else_moves(frozen):
    """With policy.freeze_vision=true the towers are trained here all the same, and stay frozen for SFT and RL."""
    from vlarl.vision_pretrain import pretrain_towers

    _, _, policy = _tiny_oft("multitask_oft_sft_rl", f"policy.freeze_vision={str(frozen).lower()}")
    grad = {n: p.requires_grad for n, p in policy.named_parameters()}
    assert any(grad.values()) and all(not g for n, g in grad.items() if "vision_backbone" in n) == frozen
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    seen = []
    rec = pretrain_towers(policy, _squares(640), epochs=12, batch_size=32, lr=2e-3, seed=0,
                          log=lambda e, loss, r2: seen.append((e, loss, r2)))
    assert rec["targets"] == 2 and rec["target_dims"] == [0, 1]  # the constant dim is not a target
    assert rec["val_r2_before"] < 0.2 and rec["val_r2_after"] > 0.6, rec
    assert [e for e, _, _ in seen] == list(range(12)) and rec["loss"][-1] < rec["loss"][0]
    after = policy.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved and all(k.startswith("model.vision_backbone.") for k in moved), sorted(moved)[:5]
    assert not policy.model.vision_backbone.training  # left in eval mode, as the policy was
    assert {n: p.requires_grad for n, p in policy.named_parameters()} == grad


def test_film_towers_are_pretrained_as_plain_towers_and_left_as_the_identity_for_sft():
    """OFT+ towers (policy.arch.use_film): the FiLM maps are zeroed and kept out of the stage, so after it the towers
    see where the square is and their features do not depend on the words yet; with freeze_vision SFT then trains
    the FiLM maps only."""
    from vlarl.vision_pretrain import pretrain_towers

    _, _, policy = _tiny_oft("multitask_oft_sft_rl", "+policy.arch.use_film=true", "policy.freeze_vision=true")
    backbone = policy.model.vision_backbone
    film = backbone.film_parameters()
    assert backbone.film and len(film) == 4 * len(backbone.featurizer.blocks) * (2 if backbone.fused else 1)
    assert any(bool(p.abs().sum() > 0) for p in film)  # nn.Linear's random start: not the identity before
    rec = pretrain_towers(policy, _squares(640), epochs=12, batch_size=32, lr=2e-3, seed=0)
    assert rec["film_zeroed"] == len(film) and rec["val_r2_after"] > 0.6, rec
    assert all(bool((p == 0).all()) for p in film)
    frames = policy.pixel_inputs({"images": {policy.spec.image_keys[0]: _squares(4).images}})
    with torch.no_grad():
        one = backbone(frames, torch.randn(4, backbone.film_dim))
        other = backbone(frames, torch.randn(4, backbone.film_dim))
    assert torch.equal(one, other)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad and "vision_backbone" in n}
    assert trainable == {n for n, _ in policy.named_parameters()
                         if "vision_backbone" in n and n.split(".")[-2] in ("scale", "shift")}


def _two_squares(n: int, size: int = 32, side: int = 8, seed: int = 0):
    """A red and a blue square, each drawn on either half; the words name one, the grounding target is its x. The
    scene state is the red square's x only, so the target needs the words (which square) and the frame (where)."""
    from vlarl.vision_pretrain import Frames

    g = np.random.default_rng(seed)
    im = np.zeros((n, size, size, 3), np.uint8)
    red_x = np.zeros(n, np.float32)
    target = np.zeros((n, 2), np.float32)
    words = []
    for i in range(n):
        left = g.integers(0, size // 2 - side, 2)
        xs = (left[0], size // 2 + left[1]) if g.random() < 0.5 else (size // 2 + left[1], left[0])
        y = g.integers(0, size - side)
        im[i, y:y + side, xs[0]:xs[0] + side, 0] = 255
        im[i, y:y + side, xs[1]:xs[1] + side, 2] = 255
        red_x[i] = xs[0]
        named = int(g.integers(2))
        words.append(f"push the cube to the {('red', 'blue')[named]} goal")
        target[i] = (xs[named], y)
    states = np.stack([red_x, np.full(n, 3.0, np.float32)], 1)
    return Frames(torch.from_numpy(im), torch.from_numpy(states), episodes=n, words=words,
                  grounding=torch.from_numpy(target))


def test_grounded_film_towers_learn_to_find_what_the_words_name():
    """--grounded: the FiLM maps train with the towers and the input embeddings, fed each frame's own words; the record
    says the named square is found with its own words and missed with the other square's. Of the language model
    only the input embeddings move; with freeze_film and freeze_embeddings all of it stays frozen for SFT."""
    from vlarl.vision_pretrain import pretrain_towers

    _, _, policy = _tiny_oft("multitask_oft_sft_rl", "+policy.arch.use_film=true", "policy.freeze_vision=true",
                             "policy.freeze_film=true", "policy.freeze_embeddings=true")
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    rec = pretrain_towers(policy, _two_squares(960), epochs=25, batch_size=32, lr=2e-3, seed=0, grounded=True)
    assert rec["grounded"] and rec["grounding_dims"] == 2 and rec["grounding_frames"] == 960
    assert rec["grounding_r2_after"] > 0.6, rec
    assert rec["grounding_r2_other_words"] < rec["grounding_r2_after"] - 0.5, rec
    backbone = policy.model.vision_backbone
    film = {id(p) for p in backbone.film_parameters()}
    last = {f"{t}.blocks.{len(getattr(backbone, t).blocks) - 1}." for t in ("featurizer", "fused_featurizer")}
    used = [p for n, p in backbone.named_parameters() if id(p) in film and not any(n.startswith(x) for x in last)]
    assert used and all(bool(p.abs().sum() > 0) for p in used)  # trained from zero here (the features skip the last block)
    after = policy.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert {k for k in moved if k.startswith("model.language_model.")} == {"model.language_model.model.embed_tokens.weight"}
    frames = policy.pixel_inputs({"images": {policy.spec.image_keys[0]: _two_squares(4).images}})
    lang = [policy.model.film_language(policy.model.language_model.get_input_embeddings()(ids), mask)
            for ids, mask in (policy._text([f"push the cube to the {c} goal"] * 4, 4) for c in ("red", "blue"))]
    with torch.no_grad():
        assert not torch.allclose(policy.model.vision_backbone(frames, lang[0]),
                                  policy.model.vision_backbone(frames, lang[1]))
    assert not any(p.requires_grad for p in policy.model.vision_backbone.parameters())  # frozen again for SFT
    assert not policy.model.language_model.get_input_embeddings().weight.requires_grad


def test_grounded_pretraining_refuses_plain_towers_and_frames_that_name_nothing():
    from vlarl.vision_pretrain import pretrain_towers

    _, _, plain = _tiny_oft()
    with pytest.raises(ValueError, match="use_film=true"):
        pretrain_towers(plain, _two_squares(8), epochs=1, grounded=True)
    _, _, film = _tiny_oft("multitask_oft_sft_rl", "+policy.arch.use_film=true")
    with pytest.raises(ValueError, match="GroundedTask"):
        pretrain_towers(film, _squares(8), epochs=1, grounded=True)


def test_constant_scene_states_and_other_families_are_refused():
    from vlarl.vision_pretrain import Frames, check_supported, pretrain_towers

    _, _, policy = _tiny_oft()
    flat = Frames(torch.zeros(8, 32, 32, 3, dtype=torch.uint8), torch.ones(8, 3), episodes=8)
    with pytest.raises(ValueError, match="constant"):
        pretrain_towers(policy, flat, epochs=1)
    _, _, smolvla = _tiny_oft("multitask_smolvla_sft_rl")
    with pytest.raises(ValueError, match="OpenVLA family"):
        check_supported(smolvla)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from simulators.maniskill_multitask import ManiSkillMultiTaskConfig
    from vlarl import system_env
    from vlarl.multitask_demos import build_multitask_demos

    system_env.apply()
    root = tmp_path_factory.mktemp("pv")
    cfg = ManiSkillMultiTaskConfig(tasks=[TASK], control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=32,
                                   num_envs=2, reward_mode="normalized_dense")
    build_multitask_demos(cfg, root / "demos", 2, root=root, seed=0, log=lambda m: None)
    return root / "demos" / "trajectories.h5"


def test_the_script_saves_a_policy_with_trained_towers_and_the_demonstrations_statistics(demos, tmp_path):
    from policies.base import Policy
    from scripts import pretrain_vision as script
    from vlarl.data.demonstrations import read_maniskill_h5

    out = tmp_path / "seen"
    assert script.main(["--demos", str(demos), "--out", str(out), "--frames", "24", "--epochs", "2",
                        "--num-envs", "2", "--scene-steps", "8", "--", f"env.tasks=[{TASK}]",
                        "env.image_size=32"]) == 0
    rec = json.loads((out / "pretrain.json").read_text())
    assert (rec["frames"], rec["val_frames"], rec["epochs"]) == (24, 2, 2)
    # 2 envs, 8-step scenes of 2 chunks: 24 frames are 12 rounds, so about 12 scenes (not 2 long episodes)
    assert rec["episodes"] >= 8 and rec["targets"] >= 4 and len(rec["val_r2_per_dim"]) == rec["targets"]
    saved = Policy.from_pretrained(out)
    _, _, fresh = _tiny_oft()  # what the script built before training (same seed)
    sd, fd = saved.state_dict(), fresh.state_dict()
    tower = [k for k in sd if k.startswith("model.vision_backbone.")]
    assert any(not torch.equal(sd[k], fd[k]) for k in tower)
    assert all(torch.equal(sd[k], fd[k]) for k in sd if k.startswith("model.language_model."))
    states = np.concatenate([e.state for e in read_maniskill_h5(demos, cameras=["base_camera"])])
    np.testing.assert_allclose(saved.state_norm.mean.numpy(), states.mean(0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("args, needle", [
    (["--demos", "{tmp}/none.h5"], "is not a file"),
    (["--frames", "1"], "--frames must be"),
    (["--experiment", "no_such_experiment"], "no_such_experiment"),
    (["--grounded"], "use_film=true"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(demos, tmp_path, capsys, args, needle):
    from scripts import pretrain_vision as script

    out = tmp_path / "seen"
    args = [a.format(tmp=tmp_path) for a in args]
    base = ["--demos", str(demos), "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        script.main([*base, *args, "--", f"env.tasks=[{TASK}]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in err and "error:" in err
    assert not out.exists()
