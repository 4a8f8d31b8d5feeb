"""Bad pixels and words for the exact VLAs (SmolVLA, pi0, OpenVLA-OFT), refused in one line that names the fix.

Through ``Policy.act``: a camera the policy reads but the observation lacks, a float or channels-first image, an
empty instruction. Where the env is known: an instruction longer than the prompt the network keeps (SmolVLA / pi0
cut at ``tokenizer_max_length``; OFT's prompt is never cut) through ``check_instructions`` and ``vlarl-train``, which
refuses before a run directory exists and asks about every instruction the env can give (so the language task's
longer "blue" words count); a pixel checkpoint on an env that renders no camera, or another size, through
``vlarl-eval`` (the size case is slow: an RGB ManiSkill env is built).
"""

from __future__ import annotations

import json

import pytest
import torch

from policies import make_policy
from policies.base import Policy, PolicySpec
from tests.helpers.checkpoints import tree_hash
from tests.helpers.recipes import PPO
from tests.helpers.refusals import assert_one_line_refusal
from vlarl.config import load_train_config

FAMILIES = ["smolvla", "pi0", "openvla_oft"]
WORDS = "push the cube to the red goal"
SPEC = PolicySpec(state_dim=5, action_dim=3, action_low=[-1.0] * 3, action_high=[1.0] * 3, image_keys=["base_camera"],
                  image_size=[48, 48], task="PushCubeToColor-v1", instruction=WORDS)


def _obs(size: int = 48, dtype: torch.dtype = torch.uint8, words: list[str] | None = None,
         cameras: tuple[str, ...] = ("base_camera",), channels_first: bool = False) -> dict:
    g = torch.Generator().manual_seed(0)
    images = {}
    for k in cameras:
        x = torch.randint(0, 256, (2, size, size, 3), dtype=torch.uint8, generator=g).to(dtype)
        images[k] = x.permute(0, 3, 1, 2).contiguous() if channels_first else x
    return {"images": images, "state": torch.randn(2, 5, generator=g), "instruction": words or [WORDS, WORDS]}


@pytest.fixture(scope="module", params=FAMILIES)
def policy(request):
    torch.manual_seed(0)
    cfg = load_train_config([PPO, f"policy={request.param}", "env=maniskill_pushcube_color_rgb"])
    return make_policy(cfg.policy, SPEC).eval()


LONG = "push the cube to the red goal, then back to where it started, then to the red goal again, and stop there"
CASES = {
    "missing-camera": (dict(cameras=("hand_camera",)), "reads camera(s) ['base_camera'] but the observation has "
                                                       "['hand_camera']: render them (env.obs_mode=rgb, env.cameras)"),
    "float-image": (dict(dtype=torch.float32), "gives torch.float32 [2, 48, 48, 3]; policy={f} needs uint8 [B, H, W, 3]"),
    "channels-first": (dict(channels_first=True), "gives torch.uint8 [2, 3, 48, 48]; policy={f} needs uint8 [B, H, W, 3]"),
    "empty-instruction": (dict(words=[WORDS, "  "]), "policy={f} got an empty instruction ('  ') but is conditioned "
                                                     "on words"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_act_refuses_bad_pixels_and_words_in_one_line(policy, case):
    family = policy.name
    kwargs, needle = CASES[case]
    with torch.no_grad():
        good = policy.act(_obs())  # the same policy acts on good input
    assert good.shape == (2, policy.chunk_size, 3) and torch.isfinite(good).all()
    with pytest.raises(ValueError) as e, torch.no_grad():
        policy.act(_obs(**kwargs))
    msg = str(e.value)
    assert needle.format(f=family) in msg and "\n" not in msg, msg


def test_an_instruction_past_the_prompt_is_refused_where_the_env_is_known(policy):
    """``check_instructions`` (asked at config load and by vlarl-eval with the env's words) refuses words the
    prompt would cut; a batch itself is cut as the reference's own code cuts it (parity), and an image of another
    size is resized by the network: both are refused against the env (vlarl-train / vlarl-eval below)."""
    if policy.name == "openvla_oft":  # OFT's prompt is never cut: any length fits
        policy.check_instructions([LONG])
    else:
        keep = int(policy.net.cfg.tokenizer_max_length)
        with pytest.raises(ValueError, match=rf"is {len(LONG) + 1} tokens but policy={policy.name} keeps {keep}: the "
                                             r"rest would be cut off; raise policy.arch.tokenizer_max_length to at "
                                             rf"least {len(LONG) + 1}"):
            policy.check_instructions([LONG])
        policy.check_instructions(["y" * (keep - 1)])  # + its newline: fits exactly
    with torch.no_grad():
        assert torch.isfinite(policy.act(_obs(size=64, words=[LONG, LONG]))).all()


def test_the_language_fixture_reads_the_words_of_both_goals():
    """The env's declared instructions are the language task's own (config-time checks read the declaration)."""
    pytest.importorskip("mani_skill")
    from simulators.language_tasks import INSTRUCTIONS, TASK_ID
    from simulators.maniskill_tasks import task_instructions

    assert task_instructions(TASK_ID) == list(INSTRUCTIONS)


@pytest.mark.parametrize("args, match", [
    # 30 tokens keep "push the cube to the red goal\n" but cut the blue goal's words (31): every instruction counts
    (["policy=smolvla", "env=maniskill_pushcube_color", "+policy.arch.tokenizer_max_length=30"],
     "refused its config: the instruction 'push the cube to the blue goal' is 31 tokens but policy=smolvla keeps 30"),
    (["policy=pi0", "env=maniskill_pickcube"],
     "'pick up the cube and move it to the goal position' is 50 tokens but policy=pi0 keeps 48"),
    (["policy=smolvla", "env=maniskill_pushcube_color_rgb", "policy.cameras=[hand_camera]"],
     "expects camera(s) ['hand_camera'] that the env does not render"),
])
def test_vlarl_train_refuses_before_a_run_dir_exists(args, match, tmp_path, monkeypatch, capsys):
    from vlarl.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert_one_line_refusal(train_main, [PPO, *args, f"run_dir={tmp_path}/run"], "vlarl-train", match, capsys, tmp_path)
    assert not (tmp_path / "run").exists()


def test_the_tiny_smolvla_keeps_the_whole_pushcube_instruction():
    """The default tiny SmolVLA (policy=smolvla) builds for state PushCube: its 47-token instruction fits."""
    from vlarl.config.construct import check_policy

    cfg = load_train_config([PPO, "policy=smolvla", "env=maniskill_pushcube"])
    assert check_policy(cfg.policy, cfg.env) is None


def _pixel_checkpoint(directory, size: int):
    """A tiny SmolVLA saved for env=maniskill_pushcube_rgb at ``size`` px (its env.json as training writes it; the
    default experiment's end-effector controller: state 25, action 4)."""
    from vlarl.data.sft import save_policy_dir

    cfg = load_train_config([PPO, "policy=smolvla", "env=maniskill_pushcube_rgb", f"env.image_size={size}"])
    spec = PolicySpec(state_dim=25, action_dim=4, action_low=[-1.0] * 4, action_high=[1.0] * 4,  # pd_ee_delta_pos
                      image_keys=["base_camera"], image_size=[size, size], task="PushCube-v1",
                      instruction="push the cube to the red and white goal region")
    torch.manual_seed(0)
    return save_policy_dir(make_policy(cfg.policy, spec), cfg.env, directory)


def _eval_refuses(args: list[str], match: str, capsys, root) -> None:
    """vlarl-eval's one-line refusal (exit 2, nothing written). ManiSkill's logger also writes to stderr (its
    render-device warning, and in a second test of one process a "Logging error" block: its handler still holds
    the first test's closed capture), so the command's own lines are those it prefixes with its name."""
    from vlarl.cli import eval_main

    before = tree_hash(root)
    assert eval_main(args) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("vlarl-eval")]
    assert len(err) == 1 and err[0].startswith("vlarl-eval: error:") and match in err[0], err
    assert tree_hash(root) == before


def test_vlarl_eval_refuses_a_pixel_checkpoint_on_an_env_without_its_camera(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mani_skill")
    monkeypatch.chdir(tmp_path)
    ck = _pixel_checkpoint(tmp_path / "ck", 32)
    assert json.loads((ck / "env.json").read_text())["obs_mode"] == "rgb"
    assert isinstance(Policy.from_pretrained(ck), Policy)
    _eval_refuses([f"checkpoint={ck}", "env.obs_mode=state", "episodes=1", "num_envs=1"],
                  "checkpoint needs cameras ['base_camera'] that env PushCube-v1 does not render (it has []); set "
                  "env.obs_mode=rgb", capsys, tmp_path)


@pytest.mark.slow
def test_vlarl_eval_refuses_a_pixel_checkpoint_on_another_image_size(tmp_path, monkeypatch, capsys):
    """Slow: the probe env renders (an RGB ManiSkill env compiles its shaders, ~10-60 s here)."""
    pytest.importorskip("mani_skill")
    monkeypatch.chdir(tmp_path)
    ck = _pixel_checkpoint(tmp_path / "ck", 32)
    _eval_refuses([f"checkpoint={ck}", "env.image_size=40", "episodes=1", "num_envs=1"],
                  "checkpoint was trained on 32x32 images but env PushCube-v1 renders 40x40; set env.image_size=32",
                  capsys, tmp_path)
