"""LIBERO observation parity: vlarl's LIBERO env + processor steps against the references' own evaluation code.

The fixture (``tests/fixtures/reference/libero_obs``, made by ``scripts/reference_fixtures/libero_obs.py``) holds
what LeRobot 0.4.4's ``LiberoEnv`` + ``LiberoProcessorStep`` + pi0.5 pre/post-processors and OpenVLA-OFT's
``run_libero_eval`` functions (TensorFlow resize, center crop, proprio normalization, gripper handling) made of the
same LIBERO scenes: each reference env's raw robosuite observation, SHA-256 of every processed image, states,
normalized states, prompt tokens, actions. Two questions, checked apart:

* the conventions, exact: the reference's own raw observation through vlarl's (``simulators.libero.scene_obs``,
  the env's conversion, then the ``policies.processors`` steps) gives the reference's processed images bit for
  bit, its state, normalized state, tokens and actions;
* the scene: vlarl's env (``rendering=published``) reaches the reference env's observation. MuJoCo's physics
  rounds differently on different CPUs (a state 2.4e-7 apart, a few frame pixels one level apart, between the
  machine that made the fixture and another), so here the state agrees within 1e-5 and each frame is equal or
  within ``_same_frame``'s bound, which a turned, shifted or channel-swapped frame is far outside.

The first scene runs in the default tier, the second is ``slow``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.processors import Normalize, Processor
from policies.processors.libero import LiberoCameras, LiberoGripper, OFTImages, oft_libero_steps

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "libero_obs"
PI05_TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "pi05" / "checkpoint" / "tokenizer"
needs_libero = pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="pip install -e .[libero]")
META = json.loads((FIXTURE / "meta.json").read_text())
SCENES = [pytest.param(0, id="libero_spatial"), pytest.param(1, id="libero_object", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURE / "obs.npz"))


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


RAW = ("agentview_image", "robot0_eye_in_hand_image", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")
CAMERAS = ("agentview", "robot0_eye_in_hand")


def as_reference(obs: dict, ref: dict, layout: str, k: int, image_size: int) -> dict:
    """``obs`` (vlarl's env batch) with its images and state made from the reference env's raw observation ``k``
    by vlarl's own conversion (``scene_obs``)."""
    from simulators.libero import scene_obs

    scene_ = scene_obs({key: ref[f"{layout}.raw.{key}"][k] for key in RAW}, CAMERAS, image_size)
    return {**obs, "state": torch.from_numpy(scene_.state)[None],
            "images": {c: torch.from_numpy(img)[None] for c, img in scene_.images.items()}}


def assert_same_scene(obs: dict, reference: dict) -> None:
    """vlarl's env observation is the reference env's, up to the CPU's physics rounding (module docstring)."""
    ours, theirs = obs["state"][0].numpy(), reference["state"][0].numpy()
    assert np.abs(ours - theirs).max() <= 1e-5, np.abs(ours - theirs).max()
    assert list(obs["images"]) == list(CAMERAS)
    for cam in CAMERAS:
        _same_frame(obs["images"][cam][0].numpy(), reference["images"][cam][0].numpy(), cam)


def _same_frame(ours: np.ndarray, theirs: np.ndarray, cam: str) -> None:
    """Equal, or at least 97% of pixels equal and a mean difference under half a level. Actions changed by 1e-5
    (states 2e-7 apart, as between two CPUs) leave up to 0.7% of the wrist camera's pixels changed, mean 0.002
    levels; on these frames a 180-degree turn differs by 41-77 levels on average, a one-pixel shift by 3-9 and
    BGR order by 11-14, with at most 35% of pixels equal."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.uint8, (cam, ours.shape, theirs.shape)
    diff = np.abs(ours.astype(int) - theirs.astype(int))
    equal = float((diff.max(-1) == 0).mean())
    assert equal >= 0.97 and diff.mean() <= 0.5, (cam, equal, diff.mean())


def play(scene: int, image_size: int) -> list[dict]:
    """The fixture's scene in vlarl's env: the observation after the reset (10 no-op steps), and after the
    fixed actions."""
    from simulators.libero import LiberoConfig, LiberoEnv

    suite, task_id, state_id = META["scenes"][scene]
    env = LiberoEnv(LiberoConfig(task=suite, task_ids=[task_id], image_size=image_size, rendering="published",
                                 settle_steps=META["settle_steps"]), num_envs=1)
    try:
        first = env.reset(reset_state_ids=[state_id])
        res = env.chunk_step(torch.tensor(META["actions"], dtype=torch.float32)[None])
        assert not bool(res.done.any()), "the fixed actions must not end the episode"
        return [first, res.obs]
    finally:
        env.close()


@needs_libero
@pytest.mark.parametrize("scene", SCENES)
def test_lerobot_pi05_layout_matches_lerobot(ref, scene):
    """LeRobot's LIBERO layout: cameras ``image`` / ``image2`` (flipped), the 8-dim state, QUANTILES state
    normalization, pi0.5's state-in-prompt tokens, un-normalized actions: all bit-equal on the reference env's
    raw observation; vlarl's env reaches that observation."""
    from transformers import AutoTokenizer

    from policies.flow_vla.pi0 import PI0Config, tokenize

    lr = META["lerobot"]
    state_norm = Normalize.from_stats("state", "quantiles", {"q01": lr["state_q01"], "q99": lr["state_q99"]})
    proc = Processor([LiberoCameras("lerobot"), state_norm])
    cfg = PI0Config(type="pi05", tokenizer_max_length=lr["pi05_tokenizer_max_length"])
    tokenizer = AutoTokenizer.from_pretrained(str(PI05_TOKENIZER))
    for j, played in enumerate(play(scene, lr["image_size"])):
        k = 2 * scene + j
        obs = as_reference(played, ref, "lerobot", k, lr["image_size"])
        assert_same_scene(played, obs)
        out = proc(obs)
        assert list(out["images"]) == ["image", "image2"]
        for cam in ("image", "image2"):
            img = out["images"][cam][0].numpy()
            assert sha(img) == ref[f"lerobot.{cam}.sha256"][k], (
                cam, k, np.abs(img[:16, :16].astype(int) - ref[f"lerobot.{cam}.corner"][k]).max())
        assert np.array_equal(obs["state"][0].numpy(), ref["lerobot.state"][k])
        assert np.array_equal(out["state"][0].numpy(), ref["lerobot.state_normalized"][k])
        assert obs["instruction"][0] == ref["lerobot.task"][k]
        ids, mask = tokenize(cfg, tokenizer, list(obs["instruction"]), out["state"])
        assert torch.equal(ids[0], torch.as_tensor(ref["lerobot.tokens"][k]))
        assert torch.equal(mask[0], torch.as_tensor(ref["lerobot.token_mask"][k]).bool())
    action_norm = Normalize.from_stats("action", "quantiles", {"q01": lr["action_q01"], "q99": lr["action_q99"]})
    actions = action_norm.inverse({"action": torch.as_tensor(ref["outputs"], dtype=torch.float32)})["action"]
    assert torch.equal(actions, torch.as_tensor(ref["lerobot.actions"]))


@needs_libero
@pytest.mark.parametrize("scene", SCENES)
def test_oft_layout_matches_openvla_oft(ref, scene):
    """OpenVLA-OFT's LIBERO eval: the flipped 256 px renders, TensorFlow's JPEG + Lanczos resize to 224 and the
    center crop (bit-equal), the 8-dim proprio normalized with q01/q99 (float32 of OFT's float64), the chunk
    un-normalized with the ``unnorm_key`` statistics (gripper masked) and ``process_action`` (exact), on the
    reference env's raw observation; vlarl's env reaches that observation."""
    oft = META["oft"]
    proprio = Normalize.from_bounds("state", oft["state_q01"], oft["state_q99"], eps=1e-8, clip=1.0,
                                    precision="float64")
    resize_only = OFTImages(center_crop=False)
    proc = Processor([*oft_libero_steps(), proprio])
    for j, played in enumerate(play(scene, oft["image_size"])):
        k = 2 * scene + j
        obs = as_reference(played, ref, "oft", k, oft["image_size"])
        assert_same_scene(played, obs)
        renamed = LiberoCameras("oft")(obs)
        out = proc(obs)
        assert list(out["images"]) == ["full_image", "wrist_image"]
        for cam in ("full_image", "wrist_image"):
            resized = resize_only.one(renamed["images"][cam][0].numpy())
            assert sha(resized) == ref[f"oft.{cam}.sha256"][k], (
                cam, k, np.abs(resized[:16, :16].astype(int) - ref[f"oft.{cam}.corner"][k]).max())
            model = out["images"][cam][0].numpy()
            assert model.shape == (224, 224, 3)
            assert sha(model) == ref[f"oft.{cam}.model.sha256"][k], cam
        state = obs["state"][0].numpy()
        # LeRobot's float32 axis-angle vs OFT's float64 one: a few float32 ulps apart
        d_state = np.abs(state.astype(np.float64) - ref["oft.state"][k])
        assert (d_state <= 4 * np.spacing(np.abs(state))).all(), d_state
        normalized = out["state"][0].numpy()
        # that state difference through OFT's 2 / (q99 - q01 + 1e-8), plus the float32 result's own rounding
        span = np.asarray(oft["state_q99"]) - np.asarray(oft["state_q01"])
        bound = d_state * 2 / span * (1 + 1e-6) + np.spacing(np.float32(1.0))
        assert (np.abs(normalized - ref["oft.state_normalized"][k]) <= bound).all()
        assert ref["oft.prompt"][k] == f"In: What action should the robot take to {obs['instruction'][0].lower()}?\nOut:"
    actions = Normalize.from_bounds("action", oft["action_q01"], oft["action_q99"], eps=1e-8,
                                    mask=oft["action_mask"], precision="float64")
    unnorm = actions.inverse({"action": torch.as_tensor(ref["outputs"], dtype=torch.float64)})["action"]
    assert torch.equal(unnorm, torch.as_tensor(ref["oft.actions"]))
    env_actions = proc.inverse({"action": unnorm})["action"]
    assert torch.equal(env_actions, torch.as_tensor(ref["oft.env_actions"]))
    assert set(env_actions[..., -1].unique().tolist()) <= {-1.0, 0.0, 1.0}


@needs_libero
@pytest.mark.parametrize("change", ["turned", "shifted", "channels"])
def test_a_frame_off_the_convention_is_not_the_same_frame(ref, change):
    """The scene check's bound for CPU rounding still refuses the conventions' mistakes: a frame left upside
    down, shifted by one pixel, or in BGR."""
    from simulators.libero import scene_obs

    frame = scene_obs({key: ref[f"oft.raw.{key}"][0] for key in RAW}, CAMERAS, 256).images["agentview"]
    wrong = {"turned": frame[::-1, ::-1], "shifted": np.roll(frame, 1, axis=1), "channels": frame[..., ::-1]}[change]
    _same_frame(frame, frame.copy(), "agentview")
    with pytest.raises(AssertionError):
        _same_frame(np.ascontiguousarray(wrong), frame, "agentview")


def test_gripper_step_is_ofts_process_action():
    """0 -> +1 (close), 1 -> -1 (open), 0.5 -> 0 (np.sign's zero), the arm dims untouched."""
    a = torch.tensor([[0.1, 0.2, 0.3, 0.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 0, 0.5],
                      [0, 0, 0, 0, 0, 0, 0.7]], dtype=torch.float64)
    out = LiberoGripper().inverse({"action": a})["action"]
    assert out[:, -1].tolist() == [1.0, -1.0, -0.0, -1.0]
    assert torch.equal(out[:, :-1], a[:, :-1])


def test_libero_cameras_refuse_an_env_without_the_wrist_camera():
    from policies.base import PolicySpec
    from policies.processors import ProcessorMismatch

    spec = PolicySpec(state_dim=8, action_dim=7, action_low=[-1.0] * 7, action_high=[1.0] * 7, image_keys=["agentview"])
    with pytest.raises(ProcessorMismatch, match="env.cameras=\\[agentview,robot0_eye_in_hand\\]"):
        LiberoCameras("lerobot").check(spec)
