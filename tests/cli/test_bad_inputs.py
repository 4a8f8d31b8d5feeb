"""The battery: bad inputs to vlarl-train, vlarl-eval, vlarl-export, vlarl-deploy and the policy server.

Each command must answer with exactly one line on stderr, exit != 0, and leave every file as it was: the test
hashes the whole working tree (the command runs with ``tmp_path`` as its working directory, so a default
``outputs/`` would show up too) before and after. The entry points are called in-process (their ``main``);
``test_console_scripts_answer_in_one_line`` runs the installed scripts themselves for one case each.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.checkpoints import pushcube_checkpoint, tree_hash, truncate, write_checkpoint
from tests.helpers.net import free_port
from tests.helpers.recipes import PPO, pinned


@pytest.fixture(scope="module")
def shared_world(tmp_path_factory) -> Path:
    """Built once for the module (every case leaves it as it was, and each test checks that with a hash of the
    whole tree before and after): good/ (PushCube checkpoint), trunc/ (truncated weights), badjson/ (invalid
    config.json), run/ (a run dir whose only checkpoint is corrupt), noconf/ (a dir without config.yaml)."""
    tmp_path = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)  # built from inside, as the commands run
        return _build_world(tmp_path)


def _build_world(tmp_path: Path) -> Path:
    good = pushcube_checkpoint(tmp_path / "good")
    trunc = Path(shutil.copytree(good, tmp_path / "trunc"))
    truncate(trunc / "model.safetensors")
    badjson = Path(shutil.copytree(good, tmp_path / "badjson"))
    (badjson / "config.json").write_text('{"policy": "mlp", ')
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    from vlarl.config import load_train_config
    from vlarl.config.loader import to_yaml

    (run / "config.yaml").write_text(to_yaml(load_train_config([PPO])))
    ck = write_checkpoint(run / "checkpoints" / "iter_000001")
    truncate(ck / "trainer_state.pt")
    (run / "checkpoints" / "latest").symlink_to("iter_000001")
    (tmp_path / "noconf").mkdir()
    from vlarl.algorithms.critic_files import save_critics
    from vlarl.algorithms.sac import QEnsemble

    q = QEnsemble(8, [16], 1, 2, True)  # critics of another shape than algorithm=sac's [256, 256]
    save_critics(tmp_path / "critics.pt", q, q)
    return tmp_path


@pytest.fixture
def world(shared_world, monkeypatch) -> Path:
    """The shared world as the working directory, so a default ``outputs/`` would show in its hash."""
    monkeypatch.chdir(shared_world)
    return shared_world


def _train(*args):
    from vlarl.cli import train_main

    return lambda **kw: train_main(pinned([a.format(**kw) for a in args]))


def _eval(*args):
    from vlarl.cli import eval_main

    return lambda **kw: eval_main([a.format(**kw) for a in args])


def _export(*args):
    from vlarl.export.cli import main

    return lambda **kw: main([a.format(**kw) for a in args])


def _deploy(*args):
    from robots.deploy import main

    return lambda **kw: main([a.format(**kw) for a in args])


def _serve(*args):
    from robots.serve import main

    return lambda **kw: main([a.format(**kw) for a in args])


FAST = ["env.num_envs=2", "env.num_workers=1"]
CASES: dict[str, tuple[Callable[..., int], str]] = {
    # vlarl-train: configs
    "train-unknown-key": (_train("env.num_envz=3"), "Did you mean 'env.num_envs'?"),
    "train-negative-lr": (_train("algorithm.lr=-1"), "algorithm.lr=-1.0"),
    "train-gamma-above-1": (_train("algorithm.gamma=1.5"), "algorithm.gamma and algorithm.gae_lambda must lie in [0, 1]"),
    "train-negative-entropy": (_train("algorithm.ent_coef=-1"), "algorithm.ent_coef=-1.0 is out of range"),
    "train-policy-activation": (_train("policy.activation=swish"), "policy.activation='swish' is unknown"),
    "train-cnn-on-state-env": (_train("policy=cnn"), "needs camera images"),
    "train-sac-unsquashed-actor": (_train("algorithm=sac"), "needs reparameterized sampling (rsample(obs) with a "
                                   "tanh-squashed chunk), which policy=mlp has switched off: set policy.squash=true"),
    "train-sac-cnn-unsquashed": (_train("algorithm=sac", "policy=cnn", "env.obs_mode=rgb"), "set policy.squash=true"),
    "train-dsrl-without-noise-steering": (_train("algorithm=dsrl"), "algorithm=dsrl needs noise steering"),
    "train-sac-ppo-key": (_train("algorithm=sac", "policy.squash=true", "algorithm.kl_coef=0.1"),
                          "unknown config key 'algorithm.kl_coef'"),
    "train-ppo-hl-gauss-scalar-head": (_train("algorithm.value_loss=hl_gauss"), "add policy.value_bins=51"),
    "train-grpo-binned-value-head": (_train("algorithm=grpo", "policy.value_bins=51"), "set policy.value_bins=0"),
    "train-sac-binned-value-head": (_train("algorithm=sac", "policy.squash=true", "policy.value_bins=51"),
                                    "algorithm.critic_loss=hl_gauss"),
    "train-sac-critics-from-missing": (_train("algorithm=sac", "policy.squash=true", "algorithm.critics_from={w}/no.pt"),
                                       "write one with scripts/offline_then_online.py"),
    "train-sac-critics-from-other-shape": (_train("algorithm=sac", "policy.squash=true",
                                                  "algorithm.critics_from={w}/critics.pt"),
                                           "set algorithm.critic_hidden_sizes to match"),
    # a policy whose processor does not fit the env (checked on the meta-device build, before anything is written)
    "train-pi0-state-past-padding": (_train("policy=pi0", "policy.arch.max_state_dim=4"),
                                     "the env's state dim 8 exceeds the network's padding max_state_dim=4; raise "
                                     "policy.arch.max_state_dim to at least 8"),
    "train-smolvla-action-past-padding": (_train("policy=smolvla", "+policy.arch.max_action_dim=4"),
                                          "action dim 7 exceeds the network's padding max_action_dim=4"),
    "train-smolvla-camera-not-rendered": (_train("policy=smolvla", "env.obs_mode=rgb", "policy.cameras=[wrist]"),
                                          "expects camera(s) ['wrist'] that the env does not render (env cameras: "
                                          "['base_camera']); add them to env.cameras"),
    "train-reward-no-critic": (_train("reward=vlm_critic"), "reward.critic_path is empty"),
    "train-reward-missing-critic": (_train("reward=vlm_critic", "reward.critic_path={w}/nowhere"), "does not exist"),
    "train-placement-mode": (_train("placement.mode=magic"), "placement.mode='magic' is unknown"),
    "train-zero-steps": (_train("total_env_steps=0"), "total_env_steps=0 must be >= 1"),
    "train-faults": (_train("faults.max_worker_deaths=0"), "faults.max_worker_deaths=0"),
    "train-init-from-missing": (_train(*FAST, "init_from={w}/nowhere", "run_dir={w}/new"), "nowhere"),
    "train-init-from-truncated": (_train(*FAST, "init_from={w}/trunc", "run_dir={w}/new"), "model.safetensors"),
    "train-resume-not-a-run": (_train("resume={w}/noconf"), "has no config.yaml"),
    "train-resume-corrupt-only": (_train("resume={w}/run"), "has no complete checkpoint"),
    "train-resume-unknown-key": (_train("resume={w}/run", "env.num_envz=3"),  # the keys listed on resume too
                                 "Did you mean 'env.num_envs'? Valid keys of env: ['cameras', 'control_mode'"),
    "train-unknown-env": (_train("env=maniskil"), "Did you mean env=maniskill?"),
    # vlarl-eval: checkpoints and settings
    "eval-no-checkpoint": (_eval("episodes=2"), "missing checkpoint="),
    "eval-missing-dir": (_eval("checkpoint={w}/nowhere"), "does not exist"),
    "eval-truncated-weights": (_eval("checkpoint={w}/trunc"), "model.safetensors' is truncated"),
    "eval-invalid-config-json": (_eval("checkpoint={w}/badjson"), "config.json' is not valid JSON"),
    "eval-zero-episodes": (_eval("checkpoint={w}/good", "episodes=0"), "episodes and num_envs must be >= 1"),
    "eval-no-server": (_eval("checkpoint=ws://127.0.0.1:{port}", "output={w}/out"), "127.0.0.1"),
    "eval-compare-missing": (_eval("--compare", "{w}/a.json", "{w}/b.json"), "a.json"),
    # vlarl-export
    "export-truncated-weights": (_export("checkpoint={w}/trunc"), "model.safetensors' is truncated"),
    "export-invalid-config-json": (_export("checkpoint={w}/badjson"), "config.json' is not valid JSON"),
    "export-unknown-argument": (_export("checkpoint={w}/good", "fmt=onnx"), "unknown argument 'fmt=onnx'"),
    "export-bad-opset": (_export("checkpoint={w}/good", "opset=abc"), "opset must be an integer"),
    # vlarl-deploy
    "deploy-unknown-robot": (_deploy("robot=ur5", "checkpoint={w}/good"), "robot='ur5' has no configs/robot/ur5.yaml"),
    "deploy-no-policy": (_deploy("robot=franka_sim"), "give exactly one of checkpoint="),
    "deploy-truncated-weights": (_deploy("robot=franka_sim", "checkpoint={w}/trunc", "output={w}/dep"),
                                 "model.safetensors' cannot be read"),
    "deploy-no-server": (_deploy("robot=franka_sim", "server=127.0.0.1:{port}", "output={w}/dep"), "127.0.0.1"),
    "deploy-arm-unreachable": (_deploy("robot=franka_sim", "robot.franky.ip=127.0.0.2", "checkpoint={w}/good",
                                       "output={w}/dep", "keyboard_stop=false"), "127.0.0.2"),
    # the policy server's command line
    "serve-missing-checkpoint": (_serve("checkpoint={w}/nowhere", "port=0"), "does not exist"),
    "serve-truncated-weights": (_serve("checkpoint={w}/trunc", "port=0"), "model.safetensors' cannot be read"),
    "serve-bad-port": (_serve("checkpoint={w}/good", "port=http"), "port='http' must be an integer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_changes_nothing(case, world, capsys):
    run, needle = CASES[case]
    before = tree_hash(world)
    rc = run(w=world, port=free_port())
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not _is_library_log(ln)]
    assert rc != 0, f"{case}: exit {rc}; stderr: {err}"
    assert len(lines) == 1, f"{case}: {len(lines)} lines on stderr:\n{err}"
    assert needle in lines[0], f"{case}: expected {needle!r} in {lines[0]!r}"
    assert "Traceback" not in out + err
    assert tree_hash(world) == before, f"{case}: files were created or changed"


def _is_library_log(line: str) -> bool:
    """Log records of libraries (e.g. ManiSkill's render-device warning) are not the command's answer."""
    return " WARNING " in line or " INFO " in line or line.startswith("[33;1m") or "\x1b[" in line


def _server_request(**change):
    rng = np.random.default_rng(0)
    req = {"state": rng.normal(size=8).astype(np.float32),
           "images": {k: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for k in ("base", "wrist")},
           "prompt": "pick up the cube"}
    req.update(change)
    return req


_IMG = np.zeros((32, 32, 3), np.uint8)
SERVER_MESSAGES = {  # observations and messages a client may send; the reply is one line, the server lives
    "float-image": (_server_request(images={"base": _IMG.astype(np.float32), "wrist": _IMG}), "(float? send uint8"),
    "chw-image": (_server_request(images={"base": _IMG.transpose(2, 0, 1).copy(), "wrist": _IMG}),
                  "(channels first? send HWC)"),
    "nan-state": (_server_request(state=np.full(8, np.nan, np.float32)), "'state' contains NaN or inf"),
    "wrong-state-size": (_server_request(state=np.zeros(5, np.float32)), "'state' must have shape [8]"),
    "missing-camera": (_server_request(images={"base": _IMG}), "needs image 'wrist'"),
    "not-a-dict": ([1, 2, 3], "request must be a dict"),
    "batch-mismatch": (_server_request(images={"base": np.stack([_IMG] * 2), "wrist": _IMG}), "image 'base' must be"),
}


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from policies.base import Policy
    from robots.policy_server import PolicyServer
    from tests.robots.robot_policies import build_tiny_policy

    d = build_tiny_policy().save_pretrained(tmp_path_factory.mktemp("serve") / "policy")
    with PolicyServer(Policy.from_pretrained(d), host="127.0.0.1", port=0) as server:
        yield server


@pytest.mark.parametrize("case", sorted(SERVER_MESSAGES))
def test_policy_server_answers_a_bad_request_in_one_line_and_keeps_serving(case, tiny_server):
    from robots.policy_client import PolicyClient, PolicyServerError

    request, needle = SERVER_MESSAGES[case]
    with PolicyClient("127.0.0.1", tiny_server.port) as client:
        with pytest.raises(PolicyServerError) as e:
            client.infer(request)
        assert needle in str(e.value) and "\n" not in str(e.value).strip()
        assert client.infer(_server_request())["actions"].shape == (4, 7)  # the same connection still serves


@pytest.mark.parametrize("message, needle", [(b"\xc1 not msgpack", "not valid msgpack"), ("text", "binary")])
def test_policy_server_refuses_malformed_frames(message, needle, tiny_server):
    from robots.policy_client import PolicyClient

    with PolicyClient("127.0.0.1", tiny_server.port) as client:
        client._ws.send(message)
        reply = client._ws.recv()
        assert isinstance(reply, str) and needle in reply and "\n" not in reply.strip()


@pytest.mark.parametrize("script, args, needle", [
    ("vlarl-train", ["algorithm.lr=-1"], "algorithm.lr=-1.0"),
    ("vlarl-eval", ["checkpoint={w}/trunc"], "is truncated"),
    ("vlarl-export", ["checkpoint={w}/badjson"], "is not valid JSON"),
    ("vlarl-deploy", ["robot=ur5", "checkpoint={w}/good"], "robot='ur5'"),
])
def test_console_scripts_answer_in_one_line(script, args, needle, world):
    """The installed entry points themselves (a fresh process each): one line on stderr, exit 2, no files."""
    before = tree_hash(world)
    exe = Path(sys.executable).parent / script
    proc = subprocess.run([str(exe), *[a.format(w=world) for a in args]], cwd=world, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stderr.strip().splitlines() if not _is_library_log(ln)]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert tree_hash(world) == before
