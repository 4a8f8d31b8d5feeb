"""vlarl-eval against a running policy server (robots.policy_server on 127.0.0.1) gives exactly the
numbers of evaluating the checkpoint in-process."""

from __future__ import annotations

import json

import pytest

from vlarl.cli import eval_main

pytest.importorskip("websockets", reason="the policy server needs the robot extra (pip install -e .[robot])")
pytest.importorskip("msgpack", reason="the policy server needs the robot extra (pip install -e .[robot])")


def test_server_address_evaluates_like_the_checkpoint(pushcube_checkpoint, tmp_path, capsys):
    from policies.base import Policy
    from robots.policy_server import PolicyServer

    args = ["env.task=PushCube-v1", "episodes=2", "num_envs=2"]
    assert eval_main([f"checkpoint={pushcube_checkpoint}", *args, f"output={tmp_path / 'local'}"]) == 0
    with PolicyServer(Policy.from_pretrained(pushcube_checkpoint), host="127.0.0.1", port=0) as server:
        address = f"ws://127.0.0.1:{server.port}"
        assert eval_main([f"checkpoint={address}", *args, f"output={tmp_path / 'remote'}"]) == 0
        assert server.requests_served > 0
    local = json.loads((tmp_path / "local" / "eval.json").read_text())
    remote = json.loads((tmp_path / "remote" / "eval.json").read_text())
    assert remote["checkpoint"] == address and remote["policy"] == "remote:mlp"
    assert remote["per_episode"] == local["per_episode"]


def test_unreachable_server_is_one_clear_line(capsys):
    assert eval_main(["checkpoint=ws://127.0.0.1:9", "output=/tmp/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach the policy server at ws://127.0.0.1:9" in err and len(err.splitlines()) == 1
