"""Multi-node without a second machine: a real two-node Ray cluster on 127.0.0.1 (``ray start --head`` plus
a second ``ray start --address=...`` node, each with its own custom resource), env workers placed on one
node and rollout/actor on the other through the placement config, a short training, then shutdown.

The cluster processes run in their own process groups and a private temp dir; the test stops exactly
those groups (never ``ray stop``, which would end other users' Ray instances)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture
def two_node_cluster(monkeypatch):
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="rmn", dir="/tmp")  # short: Ray's unix sockets live under it
    # a private cluster on 127.0.0.1 only: no token (the user's ~/.ray token stays untouched and unused)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    env = dict(os.environ)
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--block", "--disable-usage-stats"]
    procs = [subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
                               f"--temp-dir={tmp}", "--resources", json.dumps({"env_node": 1}), *common],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)]
    address = f"127.0.0.1:{port}"
    try:
        import ray

        deadline = time.time() + 120
        while True:  # the head is up when a driver can connect
            try:
                ray.init(address=address, log_to_driver=False)
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(2)
        procs.append(subprocess.Popen([RAY, "start", f"--address={address}", "--resources",
                                       json.dumps({"train_node": 1}), *common],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True))
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.time() < deadline, "second Ray node did not join"
            time.sleep(1)
        ray.shutdown()
        yield address
    finally:
        import ray

        ray.shutdown()
        _stop(procs)


@pytest.mark.slow
def test_env_on_one_node_rollout_and_actor_on_the_other(two_node_cluster, tmp_path):
    import ray

    from vlarl.config import load_train_config
    from vlarl.runner import Runner

    cfg = load_train_config([
        "placement=collocated", f"placement.ray_address={two_node_cluster}", "placement.env.resource=env_node",
        "placement.rollout.resource=train_node", "placement.actor.resource=train_node",
        "env.num_envs=2", "env.num_workers=2", "algorithm.num_steps=5", "algorithm.num_minibatches=1",
        "policy.hidden_sizes=[16,16]", "total_env_steps=20", "eval.episodes=2", "eval.num_envs=2",
        "eval.video_episodes=0", "logger.tensorboard=false", "logger.progress_bar=false", "checkpoint_every=1",
    ])
    (tmp_path / "run").mkdir()
    r = Runner(cfg, tmp_path / "run")
    try:
        r.setup()
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}

        def node_of(actor):
            return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))

        assert all("env_node" in nodes[node_of(w)] for w in r.env_workers)
        assert "train_node" in nodes[node_of(r.rollout)] and "train_node" in nodes[node_of(r.actor)]
        final = r.train()
    finally:
        r.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["env_steps"] for x in rows if "iteration" in x] == [10, 20]
    assert final["episodes"] == 2 and (tmp_path / "run" / "checkpoints" / "latest" / "model.safetensors").is_file()
