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


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def two_node_cluster(monkeypatch):
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="rmn", dir="/tmp")  # short: Ray's unix sockets live under it
    # a private cluster on 127.0.0.1 only: no token (the user's ~/.ray token stays untouched and unused)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--block", "--disable-usage-stats"]
    procs = [subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
                               f"--temp-dir={tmp}", "--resources", json.dumps({"env_node": 1}), *common],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)]
    try:
        deadline = time.time() + 120
        while not _port_open(port):
            assert time.time() < deadline and procs[0].poll() is None, "Ray head did not start"
            time.sleep(1)
        procs.append(subprocess.Popen([RAY, "start", f"--address=127.0.0.1:{port}", "--resources",
                                       json.dumps({"train_node": 1}), *common],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True))
        yield f"127.0.0.1:{port}", env
    finally:
        _stop(procs)


# The driver runs in its own process: Ray keeps per-process state (auth mode, the connected cluster)
# that must not leak from or into other tests.
DRIVER = r"""
import json, sys, time
import ray, torch
torch.set_num_threads(1)
from vlarl import system_env
system_env.apply()
from vlarl.config import load_train_config
from vlarl.runner import Runner

address, run_dir = sys.argv[1], sys.argv[2]
ray.init(address=address, log_to_driver=False)
deadline = time.time() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    assert time.time() < deadline, "second Ray node did not join"
    time.sleep(1)
cfg = load_train_config(["experiment=pushcube_mlp_ppo",
    "placement=collocated", f"placement.ray_address={address}", "placement.env.resource=env_node",
    "placement.rollout.resource=train_node", "placement.actor.resource=train_node",
    "env.num_envs=2", "env.num_workers=2", "algorithm.num_steps=5", "algorithm.num_minibatches=1",
    "policy.hidden_sizes=[16,16]", "total_env_steps=20", "eval.episodes=2", "eval.num_envs=2",
    "eval.video_episodes=0", "logger.tensorboard=false", "logger.progress_bar=false", "checkpoint_every=1",
])
r = Runner(cfg, run_dir)
try:
    r.setup()
    nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k.endswith("_node")) for n in ray.nodes() if n["Alive"]}
    def node_of(actor):
        return nodes[ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))]
    where = {"env": [node_of(w) for w in r.env_workers], "rollout": node_of(r.rollout), "actor": node_of(r.actor)}
    final = r.train()
finally:
    r.close()
print("RESULT " + json.dumps({"where": where, "episodes": final["episodes"]}))
"""


@pytest.mark.slow
def test_env_on_one_node_rollout_and_actor_on_the_other(two_node_cluster, tmp_path):
    address, env = two_node_cluster
    run = tmp_path / "run"
    run.mkdir()
    p = subprocess.run([sys.executable, "-c", DRIVER, address, str(run)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["where"] == {"env": [["env_node"], ["env_node"]], "rollout": ["train_node"], "actor": ["train_node"]}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["env_steps"] for x in rows if "iteration" in x] == [10, 20]
    assert out["episodes"] == 2 and (run / "checkpoints" / "latest" / "model.safetensors").is_file()
