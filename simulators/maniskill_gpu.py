"""ManiSkill3 GPU-parallel (``physx_cuda``): one simulator holds all ``num_envs`` scenes.

Everything stays a torch tensor on the simulator's device (observations, rewards, masks, metrics):
no copy to the host per step. The chunk semantics are the batched interface's: all scenes are
stepped together (a GPU simulator cannot pause one scene), so a scene whose episode ended inside a
chunk keeps simulating until the boundary but its steps are masked out (``step_mask`` False,
reward 0) and its ``final_obs`` row is the observation at its episode end; at the boundary the
finished scenes are reset together with ManiSkill's partial reset (``options={"env_idx": ...}``).

``reset_state_ids``: scenes with the same id are made identical by resetting them to the simulator
state of the group's first scene (a batched GPU reset draws one random stream for the whole batch, so
equal seeds alone do not give equal scenes). That initial state is kept, and a scene that ends its
episode is reset to its group's initial state (ManiSkill's ``reset_to_env_states``, so controllers are
reset after the state is set), never to the state of another scene mid-episode.

``sim_backend="cpu"`` with ``num_envs=1`` runs this same code path on a CPU machine (that is how it
is tested without a GPU); for many CPU envs use ``env=maniskill`` with several env workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from simulators.base import EnvError, EnvSpec, Obs
from simulators.chunk_stepper import ChunkStepper, StepOutcome, SteppedEnv
from simulators.maniskill import (
    ManiSkillConfig,
    _camera_slices,
    _import_maniskill,
    _make_quietly,
    _step_unrendered,
    _time_limit,
    check_task_config,
    instruction_for,
    make_kwargs,
    proprio_dims,
)
from simulators.registry import register_env
from simulators.serial import SimulatorCrash, resolve_seeds


@dataclass
class ManiSkillGPUConfig(ManiSkillConfig):
    name: str = "maniskill_gpu"
    sim_backend: str = "physx_cuda"
    num_envs: int = 256
    num_workers: int = 1
    # obs_mode=rgb: True renders every scene's cameras at every control step (ManiSkill's own step); False
    # renders them at the chunk boundary and at the step where an episode ends, as env=maniskill does by
    # default. True here until a GPU run has measured the other (docs/gpu.md); the CPU backend tests both.
    render_every_step: bool = True


def sim_backends(cfg: ManiSkillGPUConfig) -> tuple[str, str | None]:
    """(ManiSkill ``sim_backend``, ``render_backend`` or None for its default) for ``cfg``: on CUDA both name
    torch's current device (``physx_cuda:i``, ``cuda:i``), which the env worker sets to the GPU its placement
    bound it to; ManiSkill alone would take the first GPU whatever the worker was given."""
    if cfg.sim_backend not in ("physx_cuda", "gpu", "cuda"):
        return "physx_cpu", None
    index = torch.cuda.current_device()
    return f"physx_cuda:{index}", f"cuda:{index}"


@register_env("maniskill_gpu", ManiSkillGPUConfig)
class ManiSkillGPUEnv(SteppedEnv):
    @staticmethod
    def validate_config(cfg: ManiSkillGPUConfig, num_envs: int | None = None) -> None:
        if cfg.obs_mode not in ("state", "rgb"):
            raise EnvError(f"env.obs_mode='{cfg.obs_mode}' is not supported; use 'state' or 'rgb'")
        if cfg.sim_backend in ("physx_cuda", "gpu", "cuda"):
            if not torch.cuda.is_available():
                raise EnvError(
                    f"env.sim_backend='{cfg.sim_backend}' needs a CUDA GPU and none is visible; "
                    "use env=maniskill (CPU, several env workers) on this machine"
                )
        elif cfg.sim_backend in ("cpu", "physx_cpu"):
            if (num_envs or cfg.num_envs) != 1:
                raise EnvError(
                    "ManiSkill's CPU backend simulates one scene per env: use env=maniskill for many CPU envs, "
                    "or env.num_envs=1 here"
                )
        else:
            raise EnvError(
                f"env.sim_backend='{cfg.sim_backend}' is unknown; use physx_cuda (or cpu with num_envs=1)"
            )
        if cfg.mesh_detail != 1.0:
            raise EnvError(f"env.mesh_detail={cfg.mesh_detail} lightens the meshes of env=maniskill's CPU renderer; "
                           f"env=maniskill_gpu renders on the GPU, where triangles are cheap: drop env.mesh_detail")
        check_task_config(cfg)  # task id, reward mode, assets

    def __init__(self, cfg: ManiSkillGPUConfig, num_envs: int, worker_index: int = 0, render: bool = False):
        gym = _import_maniskill()
        self.validate_config(cfg, num_envs)
        self.cfg = cfg
        self.num_envs = num_envs
        self.worker_index = worker_index
        self.instruction = instruction_for(cfg.task)
        backend, render_backend = sim_backends(cfg)
        kwargs = make_kwargs(cfg, sim_backend=backend, num_envs=num_envs, render=render)
        if render_backend:
            kwargs["render_backend"] = render_backend
        self._render = render
        self._render_at_boundaries = cfg.obs_mode == "rgb" and not cfg.render_every_step
        self._info: dict[str, Any] | None = None  # the last unrendered step's info, rendered at the boundary
        env = _make_quietly(gym, cfg.task, kwargs)
        if cfg.obs_mode == "rgb":
            from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

            env = FlattenRGBDObservationWrapper(env, rgb=True, depth=False, state=True)
        self.env = env
        self.base = env.unwrapped
        self.device = torch.device(self.base.device)
        self._slices = _camera_slices(env, cfg) if cfg.obs_mode == "rgb" and cfg.cameras else None
        self.max_episode_steps = int(cfg.max_episode_steps or _time_limit(env))
        space = self.base.single_action_space
        low = np.asarray(space.low, dtype=np.float32).reshape(-1)
        high = np.asarray(space.high, dtype=np.float32).reshape(-1)
        first = self._convert(env.reset(seed=0)[0])
        self.spec = EnvSpec(
            state_dim=int(first["state"].shape[-1]),
            action_dim=int(low.shape[0]),
            action_low=low,
            action_high=high,
            image_keys=tuple(first["images"]),
            image_size=(cfg.image_size, cfg.image_size) if cfg.obs_mode == "rgb" else None,
            max_episode_steps=self.max_episode_steps,
            task=cfg.task,
            instruction=self.instruction,
            proprio_dims=proprio_dims(env, int(first["state"].shape[-1])),
        )
        self._ids: torch.Tensor | None = None
        self._init_state: torch.Tensor | None = None  # [B, D] initial simulator state per scene (groups)
        self._seed_desc = "from 0"
        self._obs: Obs = first  # the simulator's current observation of every scene
        self._final: Obs | None = None  # rows latched at each scene's last executed step (see step_once)
        self._ended = torch.zeros(num_envs, dtype=torch.bool, device=self.device)  # rows latched in this chunk
        self.stepper = ChunkStepper(num_envs, low, high, self.max_episode_steps, self.device,
                                    ignore_terminations=cfg.ignore_terminations)

    # -- observations -----------------------------------------------------------------------------
    def _convert(self, obs: Any) -> Obs:
        B = self.num_envs
        if isinstance(obs, dict):
            rgb = obs["rgb"].reshape(B, *obs["rgb"].shape[-3:])
            slices = self._slices or {"base_camera": slice(0, 3)}
            images = {k: rgb[..., sl].to(torch.uint8).contiguous() for k, sl in slices.items()}
            state = obs["state"].float().reshape(B, -1)
        else:
            images, state = {}, obs.float().reshape(B, -1)
        return {"state": state, "images": images, "instruction": [self.instruction] * B}

    def _group_initial_states(self, ids: list[int]) -> Any:
        """Obs after resetting every scene to the state of its group's first scene; keeps those states
        (``[B, D]`` on the device) for the partial resets of later episodes."""
        first: dict[int, int] = {}
        for j, k in enumerate(ids):
            first.setdefault(k, j)
        src = torch.tensor([first[k] for k in ids], device=self.device)
        self._init_state = self.base.get_state()[src].clone()
        raw, _ = self.env.reset(options={"reset_to_env_states": {"env_states": self._init_state}})
        return raw

    # -- interface --------------------------------------------------------------------------------
    def reset(self, seed: int | list[int] | None = None, reset_state_ids: list[int] | None = None) -> Obs:
        B = self.num_envs
        if reset_state_ids is not None and len(reset_state_ids) != B:
            raise EnvError(f"reset_state_ids has {len(reset_state_ids)} ids for {B} envs")
        self._ids = torch.tensor(reset_state_ids, device=self.device) if reset_state_ids is not None else None
        seeds = list(reset_state_ids) if reset_state_ids is not None else resolve_seeds(seed, B)
        self._seed_desc = f"reset_state_ids {seeds[:4]}..." if reset_state_ids is not None else f"from {seed}"
        raw, _ = self.env.reset(seed=None if seeds[0] is None else seeds)
        if reset_state_ids is not None:
            raw = self._group_initial_states(list(reset_state_ids))
        obs = self._convert(raw)
        self._obs, self._final, self._info = obs, None, None
        self._ended = torch.zeros(B, dtype=torch.bool, device=self.device)
        self.stepper.start_episodes()
        return obs

    # -- the per-step protocol of the chunk stepper -----------------------------------------------
    def step_once(self, actions: torch.Tensor, active: torch.Tensor) -> StepOutcome:
        """Step all scenes (a GPU batch cannot pause one); a scene whose episode ended keeps simulating
        until the chunk boundary, so its observation is latched at its last active step for ``observe``.
        Rendering at boundaries, a step renders only when an active scene's episode ends in it."""
        B, dev = self.num_envs, self.device
        try:
            if self._render_at_boundaries:
                obs, r, term, trunc, info = _step_unrendered(self.env, actions)
            else:
                obs, r, term, trunc, info = self.env.step(actions)
        except Exception as e:
            raise SimulatorCrash(
                f"ManiSkillGPUEnv ({self.num_envs} envs, worker {self.worker_index}, task '{self.cfg.task}', "
                f"seeds {self._seed_desc}) crashed in step: {type(e).__name__}: {e}"
            ) from e
        term = torch.as_tensor(term, device=dev).reshape(B).bool()
        trunc = torch.as_tensor(trunc, device=dev).reshape(B).bool()
        if self._render_at_boundaries:
            self._info = info
            ends = torch.logical_or(*self.stepper.end_flags(active, term, trunc, self.stepper.length + 1))
            if bool(ends.any()):  # their final observation is this step's: render it now
                self._obs = self._rendered()
                self._latch(ends)
                self._ended |= ends
        else:
            cur = self._convert(obs)
            if self._final is None and not bool(active.all()):  # from now on some rows stop following the sim
                self._latch(active)  # the first latch copies every row as of the previous step
            self._obs = cur
            if self._final is not None:
                self._latch(active)
        success = info["success"].reshape(B).bool() if "success" in info else torch.zeros(B, dtype=torch.bool,
                                                                                           device=dev)
        return StepOutcome(reward=torch.as_tensor(r, device=dev).float().reshape(B), terminated=term,
                           truncated=trunc, success=success)

    def _rendered(self) -> Obs:
        """Every scene's observation now: the cameras rendered through ManiSkill's ``get_obs`` with the last
        step's ``info`` and flattened as FlattenRGBD does (the scenes have not moved since that step)."""
        info, self._info = self._info, None
        return self._convert(self.env.observation(self.base.get_obs(info)))

    def _latch(self, rows: torch.Tensor) -> None:
        """Copy ``rows`` of the current observation into ``_final`` (made from it at the first call of a chunk)."""
        if self._final is None:
            self._final = {"state": self._obs["state"].clone(),
                           "images": {k: v.clone() for k, v in self._obs["images"].items()}}
            return
        self._final["state"][rows] = self._obs["state"][rows]
        for k in self._final["images"]:
            self._final["images"][k][rows] = self._obs["images"][k][rows]

    def observe(self) -> Obs:
        if self._info is not None:  # steps since the last picture: render the boundary
            self._obs = self._rendered()
        if self._final is None:
            return self._obs
        if self._render_at_boundaries:  # the rows still running follow the sim; ended ones keep their latch
            self._latch(~self._ended)
        return {**self._final, "instruction": [self.instruction] * self.num_envs}

    def end_chunk(self, done: torch.Tensor, episode: dict[str, torch.Tensor]) -> None:
        """Partial reset of the finished scenes (ManiSkill's ``env_idx``), back to their group's initial state
        when ``reset_state_ids`` pinned one."""
        self._final = None
        self._ended = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        idx = done.nonzero().flatten()
        if idx.numel() == 0:
            return
        options: dict[str, Any] = {"env_idx": idx}
        if self._ids is not None:  # back to the group's initial state (rows of idx only)
            options["reset_to_env_states"] = {"env_states": self._init_state[idx]}
        raw, _ = self.env.reset(options=options)
        self._obs = self._convert(raw)

    def render(self) -> np.ndarray | None:
        if not self._render:
            return None
        f = self.env.render()
        f = f.cpu().numpy() if isinstance(f, torch.Tensor) else np.asarray(f)
        return f.reshape(-1, *f.shape[-3:]).astype(np.uint8)

    def close(self) -> None:
        self.env.close()
