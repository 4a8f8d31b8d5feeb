"""``vlarl-deploy`` / ``scripts/deploy_franka.py``: run a trained policy on a Franka behind the safety layer.

    vlarl-deploy robot=franka robot.franky.ip=<arm address> checkpoint=<policy dir> episodes=5 \
        robot.instruction="pick up the cube" robot.policy_hz=10 robot.max_episode_steps=200
    vlarl-deploy robot=franka_sim server=127.0.0.1:8000      # policy served by robots.serve

The policy is either loaded locally (``checkpoint``, a ``save_pretrained`` directory) or reached
over the openpi-compatible websocket (``server=host:port``; a server started with an API key needs the same
key in ``VLARL_POLICY_API_KEY`` here). Every episode (observations, executed
and requested actions, clamps) is written to ``<output>/episodes.hdf5`` in the robomimic layout SFT reads.
Press Enter (or ``s``/``q`` + Enter) in the terminal to stop the arm at any time.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robots.franka_env import FrankaEnv, FrankaEnvConfig
from robots.franky_driver import RobotLinkError

log = logging.getLogger("vlarl.deploy")


@dataclass
class DeployConfig:
    robot: FrankaEnvConfig = field(default_factory=FrankaEnvConfig)
    checkpoint: str = ""  # a save_pretrained directory ...
    server: str = ""  # ... or host:port of a running policy server
    episodes: int = 1
    output: str = "outputs/deploy"
    keyboard_stop: bool = True  # read the operator stop from stdin
    replan_every: int = 0  # execute this many actions of each chunk (0 = all)


class DeployError(ValueError):
    """A deployment configuration problem; one line naming the key and the fix."""


def register_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="deploy_schema", node=DeployConfig)
    cs.store(group="robot", name="franka_schema", node=FrankaEnvConfig)


def load_config(overrides: list[str]) -> DeployConfig:
    """Compose ``configs/robot/<robot>.yaml`` + overrides into a typed ``DeployConfig``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    register_schemas()
    robot = next((o.split("=", 1)[1] for o in overrides if o.startswith("robot=")), "franka_sim")
    rest = [o for o in overrides if not o.startswith("robot=")]
    cfg_dir = Path(__file__).resolve().parents[1] / "configs"
    if not (cfg_dir / "robot" / f"{robot}.yaml").is_file():
        choices = sorted(p.stem for p in (cfg_dir / "robot").glob("*.yaml"))
        raise DeployError(f"robot='{robot}' has no configs/robot/{robot}.yaml; choose robot=<one of {choices}>")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(cfg_dir), version_base="1.3"):
        try:
            raw = compose(config_name="deploy_schema", overrides=[f"+robot={robot}", *rest])
        except Exception as exc:
            raise DeployError(f"invalid deploy configuration: {str(exc).splitlines()[0]}") from exc
    try:
        cfg = OmegaConf.to_object(raw)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", "?")
        raise DeployError(f"config key '{key}' has no value; set it on the command line ({key}=...)") from exc
    if not cfg.robot.franky.ip:
        raise DeployError("robot.franky.ip is empty; set robot.franky.ip=<the arm's FCI address>")
    if bool(cfg.checkpoint) == bool(cfg.server):
        raise DeployError("give exactly one of checkpoint=<policy dir> or server=<host:port>")
    return cfg


class LocalPolicy:
    """``infer``-compatible wrapper of an in-process policy (same call shape as ``PolicyClient``)."""

    def __init__(self, checkpoint: str):
        import torch

        from policies.base import Policy

        torch.set_num_threads(1)
        self.policy = Policy.from_pretrained(checkpoint).eval()
        self.metadata = {"action_dim": self.policy.spec.action_dim, "state_dim": self.policy.spec.state_dim,
                         "image_keys": list(self.policy.spec.image_keys)}

    def infer(self, request: dict[str, Any]) -> dict[str, Any]:
        from robots.policy_server import observation_from_request

        obs, _ = observation_from_request(request, self.policy.spec)
        return {"actions": self.policy.act(obs)[0].detach().cpu().numpy()}

    def close(self) -> None:
        pass


def _check_compatible(meta: dict[str, Any], env: FrankaEnv) -> None:
    if meta.get("action_dim") != env.spec.action_dim:
        raise DeployError(f"policy acts in dim {meta.get('action_dim')} but robot.action_mode="
                          f"'{env.cfg.action_mode}' needs {env.spec.action_dim}; set robot.action_mode to match")
    if meta.get("state_dim") not in (None, env.spec.state_dim):
        raise DeployError(f"policy expects state dim {meta['state_dim']}, the Franka env gives {env.spec.state_dim}")
    missing = [k for k in meta.get("image_keys", []) if k not in env.spec.image_keys]
    if missing:
        raise DeployError(f"policy needs cameras {missing}; add them to robot.cameras (names {list(env.spec.image_keys)})")


def run(cfg: DeployConfig, operator_stream: Any = None) -> dict[str, Any]:
    """Run ``cfg.episodes`` episodes; returns a summary (episodes, steps, clamps, faults, latency)."""
    from robots.policy_client import PolicyClient
    from robots.recorder import HDF5EpisodeRecorder
    from robots.safety import OperatorStop

    if cfg.server:
        host, _, port = cfg.server.rpartition(":")
        if not host or not port.isdigit():
            raise DeployError(f"server='{cfg.server}' must be host:port, e.g. server=127.0.0.1:8000")
        policy: Any = PolicyClient(host, int(port))
    else:
        policy = LocalPolicy(cfg.checkpoint)
    stop = OperatorStop(operator_stream) if (cfg.keyboard_stop or operator_stream is not None) else None
    recorder = None
    try:
        env = FrankaEnv(cfg.robot, operator_stop=stop)  # connects: an unreachable arm fails before any file exists
    except BaseException:
        policy.close()
        raise
    summary: dict[str, Any] = {"episodes": 0, "steps": 0, "clamps": 0, "faults": []}
    try:
        _check_compatible(policy.metadata, env)
        # the episode file is created once the arm answers and the policy fits it
        recorder = env.recorder = HDF5EpisodeRecorder(Path(cfg.output) / "episodes.hdf5", env_args=asdict(cfg.robot))
        for ep in range(cfg.episodes):
            obs = env.reset()
            while True:
                request = {"state": obs["state"][0], "images": {k: v[0] for k, v in obs["images"].items()},
                           "prompt": cfg.robot.instruction}
                chunk = np.asarray(policy.infer(request)["actions"], np.float32)
                if cfg.replan_every > 0:
                    chunk = chunk[: cfg.replan_every]
                res = env.chunk_step(chunk[None])
                summary["steps"] += int(res.step_mask.sum())
                if bool(res.done[0]):
                    break
                obs = res.obs
            summary["clamps"] += len(env.safety.clamps)
            summary["episodes"] += 1
            if env.last_fault:
                summary["faults"].append(env.last_fault)
            log.info("episode %d: %d steps, %d clamps, fault=%s", ep, env.elapsed, len(env.safety.clamps),
                     env.last_fault)
            if env.last_fault == "operator stop":
                break
    finally:
        env.close()
        if recorder is not None:
            recorder.close()
        policy.close()
    lat = getattr(policy, "latencies_ms", [])
    summary["latency_ms_p50"] = float(np.median(lat)) if lat else None
    summary["record"] = str(recorder.path) if recorder is not None else ""
    return summary


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_config(args)
        summary = run(cfg)
    except (DeployError, ValueError, OSError, RobotLinkError, ImportError) as exc:  # OSError: files, sockets
        msg = str(exc).strip().splitlines()
        print(f"vlarl-deploy: error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr)
        return 2
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
