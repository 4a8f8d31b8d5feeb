"""vlarl-eval against a running policy server (robots.policy_server on 127.0.0.1) gives exactly the
numbers of evaluating the checkpoint in-process."""

from __future__ import annotations

import json

import pytest

from vlarl.cli import eval_main

pytest.importorskip("websockets", reason="the policy server needs the robot extra (pip install -e .[robot])")
pytest.importorskip("msgpack", reason="the policy server needs the robot extra (pip install -e .[robot])")


@pytest.mark.heavy
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


def test_server_failing_to_act_is_one_line_and_writes_nothing(pushcube_checkpoint, tmp_path, capsys):
    """A served policy whose inference raises (injected: a multi-line error, as a CUDA out-of-memory or a
    distribution refusing NaN parameters gives) fails on the server: vlarl-eval says so in one line."""
    from policies.base import Policy
    from robots.policy_server import PolicyServer

    policy = Policy.from_pretrained(pushcube_checkpoint)

    def failing_act(obs):
        raise RuntimeError("inference failed: injected fault\ntensor([[nan, nan, nan]])")

    policy.act = failing_act
    out = tmp_path / "remote"
    with PolicyServer(policy, host="127.0.0.1", port=0) as server:
        rc = eval_main([f"checkpoint=ws://127.0.0.1:{server.port}", "env.task=PushCube-v1", "episodes=2",
                        "num_envs=2", f"output={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    errors = [line for line in err.splitlines() if line.startswith("vlarl-eval")]  # not the libraries' logs
    assert len(errors) == 1 and "could not act: inference failed" in errors[0], err[-2000:]
    assert "nan, nan" not in err  # the server's multi-line tensor dump is cut to its first line
    assert not out.exists()


def test_reply_of_the_wrong_size_or_non_finite_is_named(pushcube_checkpoint):
    """Actions that do not fit the server's own metadata (batch x chunk x action_dim), or are NaN, are refused
    by name."""
    import numpy as np

    from policies.base import CheckpointError, Policy
    from robots.policy_server import PolicyServer
    from vlarl.evaluation.remote import RemotePolicy

    with PolicyServer(Policy.from_pretrained(pushcube_checkpoint), host="127.0.0.1", port=0) as server:
        remote = RemotePolicy(f"ws://127.0.0.1:{server.port}")
        try:
            a = remote.check_actions(np.zeros((2, remote.chunk_size, remote.spec.action_dim)), 2)
            assert a.shape == (2, remote.chunk_size, remote.spec.action_dim)
            with pytest.raises(CheckpointError, match=r"replied with actions of shape \(2, 3\), expected 2 x chunk"):
                remote.check_actions(np.zeros((2, 3)), 2)
            with pytest.raises(CheckpointError, match="replied with no actions"):
                remote.check_actions({"not": "an array"}, 2)
            with pytest.raises(CheckpointError, match="non-finite actions"):
                remote.check_actions(np.full((2, remote.chunk_size, remote.spec.action_dim), np.nan), 2)
        finally:
            remote.close()
