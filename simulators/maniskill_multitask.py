"""Several ManiSkill3 tasks in one batched env, for one policy trained over all of them.

``env=maniskill_multitask env.tasks=[PushCubeToColor-v1,PushCube-v1,PullCube-v1]``: env slot ``g`` (its global
index over all env workers, ``worker_index * num_envs + i``, as LIBERO spreads ``task_ids``) runs
``tasks[(g // task_block) % len(tasks)]``: with ``env.task_block=1`` (the default) consecutive slots run different
tasks; a GRPO run sets ``env.task_block`` to ``algorithm.group_size`` so that each group (consecutive slots that
share a reset state) holds one task, and a GRPO config whose groups would mix tasks is refused at load
(``global_slot_tasks`` / ``grouping_fix``, asked by ``vlarl.config.construct``). A group of the language task
shares its words too: they are drawn from the episode's seed, which the group shares. Each slot's observation carries its task's instruction (``instruction_for``: ManiSkill
tasks get vlarl's fixed sentence, e.g. "pull the cube back to the goal region"; the language task reports each
episode's own). Every slot is a ManiSkill CPU scene stepped by ``simulators.maniskill.ManiSkillEnv``'s code
(render once per chunk, ``fresh_reset``, camera slices); this module only says which task each scene is.

One observation layout for every task, or a refusal:
* one control mode for all tasks (``env.control_mode`` set, not ``''``, which would let each task's robot pick
  its own default controller), and the same action space (dim and bounds) in every task;
* the same cameras and the same state size. The state is the robot's own part of ManiSkill's (``env.state=proprio``,
  the default: ``agent/qpos``, ``agent/qvel``, ``extra/tcp_pose``, 25 dims for the Panda tasks above): what a task
  adds besides (PullCube's ``goal_pos`` even under ``obs_mode=rgb``, object poses under ``obs_mode=state``)
  differs from task to task and is dropped, so the policy reads the goal from the camera and the words.
  ``env.state=full`` keeps ManiSkill's whole state, and tasks whose states then differ in size are refused in
  one line.

Per-task success: every ``chunk_step`` adds ``success_once/<task>`` and ``success_at_end/<task>`` to the episode
metrics (NaN for rows of other tasks, and for every row whose episode did not end), for every task of
``env.tasks`` in every worker, so all workers report the same keys; the runner's episode statistics keep them
(``rollout/success_once/<task>``). ``vlarl-eval`` and the runner's evaluations run each task on its own
(``task_configs``: one config per task with ``tasks=[task]``) and report them in ``eval.json``'s ``tasks``.

A critic that sees the task (``env.critic_state=true``, asymmetric actor-critic): every observation also holds
``obs["critic_state"]`` float32 [B, C], for a value head only (``policy.value_from=critic_state``), never the actor:
each slot's full ManiSkill scene state (``get_state()``: every actor's pose and velocity, the goals included, and
the robot's joints), zero-padded to the longest task's size, then a one-hot of the slot's task (its index in
``env.tasks``) and a one-hot of the instruction the slot reports (its index in ``instructions(cfg)``: the
language task's state holds both goals, the words say which counts). C = max sim state + tasks + instructions
(``spec.critic_state_dim``). It is made with the observation it sits beside (reset, chunk end, ``final_obs``).

``env.task_kwargs`` is keyed by task: ``+env.task_kwargs.PushCubeToColor-v1.instruction=other`` passes
``instruction="other"`` to that task's constructor only.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simulators.base import EnvError, EnvSpec
from simulators.maniskill import (
    ManiSkillConfig,
    ManiSkillEnv,
    _camera_slices,
    _time_limit,
    import_maniskill,
    instruction_for,
    make_scene_env,
    proprio_dims,
    task_instructions,
)
from simulators.registry import register_env
from simulators.serial import SceneObs

#: the display name of a multi-task config (``EnvConfig.task``); each slot's own task is in ``tasks``
MULTITASK = "multitask"
#: the episode metrics reported per task, as ``<metric>/<task>``
PER_TASK_METRICS = ("success_once", "success_at_end")


@dataclass
class ManiSkillMultiTaskConfig(ManiSkillConfig):
    """ManiSkill's CPU config (``ManiSkillConfig``: control mode, cameras, image size, ...) over several tasks."""

    name: str = "maniskill_multitask"
    task: str = MULTITASK  # a label; slot g runs tasks[(g // task_block) % len(tasks)]
    tasks: list[str] = field(default_factory=list)
    # consecutive global slots that run one task (GRPO: algorithm.group_size, so a group is one task)
    task_block: int = 1
    # {task id: {constructor keyword: value}}: each task gets only its own (module doc)
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    # "proprio": the robot's own state dims only (the same layout in every task); "full": ManiSkill's whole state
    state: str = "proprio"
    # obs["critic_state"]: each slot's full scene state (padded) + task and instruction one-hots (module doc)
    critic_state: bool = False


STATES = ("proprio", "full")


@dataclass
class CriticSceneObs(SceneObs):
    """A scene's observation plus its privileged ``critic: float32 [C]`` (module doc), made at the same moment."""

    critic: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))


def slot_tasks(cfg: ManiSkillMultiTaskConfig, num_envs: int, worker_index: int) -> list[str]:
    """The task of each of this worker's ``num_envs`` slots: global slot g runs
    ``tasks[(g // task_block) % len(tasks)]``."""
    n, block = len(cfg.tasks), max(1, int(cfg.task_block))
    return [cfg.tasks[((worker_index * num_envs + i) // block) % n] for i in range(num_envs)]


def task_config(cfg: ManiSkillMultiTaskConfig, task: str) -> ManiSkillConfig:
    """The single-task ``ManiSkillConfig`` of one task of ``cfg`` (its own ``task_kwargs`` only)."""
    names = {f.name for f in dataclasses.fields(ManiSkillConfig)}
    values = {k: copy.deepcopy(v) for k, v in dataclasses.asdict(cfg).items() if k in names}
    values.update(name="maniskill", task=task, task_kwargs=dict(cfg.task_kwargs.get(task) or {}))
    return ManiSkillConfig(**values)


@register_env("maniskill_multitask", ManiSkillMultiTaskConfig)
class ManiSkillMultiTaskEnv(ManiSkillEnv):
    """ManiSkill CPU scenes of several tasks in one batch (module doc); stepping, observing and resetting a scene
    are ``ManiSkillEnv``'s."""

    @staticmethod
    def validate_config(cfg: ManiSkillMultiTaskConfig) -> None:
        """Start-up checks (before a run directory is made): the task list, one control mode, every task's own
        ManiSkill checks, ``task_kwargs`` keyed by tasks of the list."""
        tasks = list(cfg.tasks)
        if cfg.state not in STATES:
            raise EnvError(f"env.state='{cfg.state}' is unknown; use one of {list(STATES)}")
        if not tasks:
            raise EnvError("env.tasks is empty; list the ManiSkill tasks to train on, e.g. "
                           "env.tasks=[PushCubeToColor-v1,PushCube-v1,PullCube-v1]")
        twice = sorted({t for t in tasks if tasks.count(t) > 1})
        if twice:
            raise EnvError(f"env.tasks lists {twice} more than once; list each task once (slots are spread evenly)")
        if not cfg.control_mode:
            raise EnvError(f"env.control_mode='' lets each of env.tasks={tasks} use its robot's default controller, "
                           f"so their actions could mean different things; set one, e.g. "
                           f"env.control_mode=pd_ee_delta_pos")
        if cfg.task_block < 1:
            raise EnvError(f"env.task_block={cfg.task_block} must be >= 1 (consecutive env slots that run one task)")
        if cfg.num_envs < len(tasks):
            raise EnvError(f"env.num_envs={cfg.num_envs} is fewer than the {len(tasks)} tasks of env.tasks; give "
                           f"every task at least one env (env.num_envs >= {len(tasks)})")
        if cfg.num_envs < len(tasks) * cfg.task_block:
            raise EnvError(f"env.num_envs={cfg.num_envs} leaves tasks without an env: env.task_block="
                           f"{cfg.task_block} gives each of the {len(tasks)} tasks {cfg.task_block} consecutive "
                           f"slots; set env.num_envs >= {len(tasks) * cfg.task_block} or a smaller env.task_block")
        stray = sorted(k for k in cfg.task_kwargs if k not in tasks)
        if stray:
            raise EnvError(f"env.task_kwargs has {stray}, which are not in env.tasks={tasks}; key it by task, e.g. "
                           f"+env.task_kwargs.PushCubeToColor-v1.instruction=other")
        for t in tasks:
            try:
                ManiSkillEnv.validate_config(task_config(cfg, t))
            except EnvError as e:
                raise EnvError(f"env.tasks: {str(e).strip().splitlines()[0]}") from None

    @staticmethod
    def instructions(cfg: ManiSkillMultiTaskConfig) -> list[str]:
        """Every instruction any task of the list reports (checked against a policy's prompt before a run)."""
        return [s for t in cfg.tasks for s in task_instructions(t)]

    @staticmethod
    def global_slot_tasks(cfg: ManiSkillMultiTaskConfig) -> list[str]:
        """The task of every global env slot of a run (``cfg.num_envs`` over ``cfg.num_workers``), as the
        workers' ``slot_tasks`` assign them: what a GRPO config's groups are checked against before a run."""
        per = cfg.num_envs // max(1, cfg.num_workers)
        return [t for w in range(max(1, cfg.num_workers)) for t in slot_tasks(cfg, per, w)]

    @staticmethod
    def grouping_fix(cfg: ManiSkillMultiTaskConfig, group_size: int) -> str:
        """The override that makes every ``group_size`` consecutive slots one task (the refusal's fix)."""
        return (f"set env.task_block={group_size} (= algorithm.group_size: slot g runs "
                f"tasks[(g // task_block) % {len(cfg.tasks)}], so each group's slots run one task)")

    @staticmethod
    def task_configs(cfg: ManiSkillMultiTaskConfig) -> list[tuple[str, ManiSkillMultiTaskConfig]]:
        """(task, a config whose every slot runs it): how an evaluation reports each task on its own (without the
        critic state: an evaluation trains no value head)."""
        return [(t, dataclasses.replace(cfg, tasks=[t], task=t, task_block=1, critic_state=False,
                                        task_kwargs={t: cfg.task_kwargs[t]} if t in cfg.task_kwargs else {}))
                for t in cfg.tasks]

    def __init__(self, cfg: ManiSkillMultiTaskConfig, num_envs: int, worker_index: int = 0, render: bool = False):
        gym = import_maniskill()
        self.validate_config(cfg)
        self.cfg = cfg
        self.num_envs = num_envs
        self.worker_index = worker_index
        self.slot_tasks = slot_tasks(cfg, num_envs, worker_index)
        self.instructions = [instruction_for(t) for t in self.slot_tasks]
        self.instruction = self.instructions[0]
        self.ignore_terminations = cfg.ignore_terminations
        self._render = render
        self._render_at_boundaries = cfg.obs_mode == "rgb" and not cfg.render_every_step
        self.envs = []
        for t in self.slot_tasks:
            self.envs.append(make_scene_env(gym, task_config(cfg, t), render))
        e0 = self.envs[0]
        self._camera_slices = _camera_slices(e0, cfg) if cfg.obs_mode == "rgb" and cfg.cameras else None
        if cfg.critic_camera and cfg.critic_camera not in e0.unwrapped.scene.sensors:
            raise EnvError(f"env.critic_camera='{cfg.critic_camera}' is not a camera of ManiSkill task "
                           f"'{self.slot_tasks[0]}'; its cameras are {list(e0.unwrapped.scene.sensors)}")
        self._keep: list[np.ndarray | None] = [None] * num_envs  # per slot: the state dims kept (None: all)
        layouts = self._layouts(gym, render)
        self._keep = [layouts[t]["keep"] for t in self.slot_tasks]
        self.max_episode_steps = int(cfg.max_episode_steps or max(lay["time_limit"] for lay in layouts.values()))
        # the critic's vector: [scene state, zero-padded to the widest task | task one-hot | instruction one-hot]
        self._sim_width = max(lay["sim_dim"] for lay in layouts.values())
        self._critic_words = list(dict.fromkeys(ManiSkillMultiTaskEnv.instructions(cfg)))
        self._critic_dim = self._sim_width + len(cfg.tasks) + len(self._critic_words)
        first = layouts[self.slot_tasks[0]]
        self.spec = EnvSpec(
            state_dim=first["state_dim"],
            action_dim=int(first["low"].shape[0]),
            action_low=first["low"],
            action_high=first["high"],
            image_keys=first["cameras"],
            image_size=(cfg.image_size, cfg.image_size) if cfg.obs_mode == "rgb" else None,
            max_episode_steps=self.max_episode_steps,
            task=MULTITASK if len(cfg.tasks) > 1 else cfg.tasks[0],
            instruction=self.instruction,
            critic_cameras=(cfg.critic_camera,) if cfg.critic_camera else (),
            proprio_dims=first["proprio"],
            critic_state_dim=self._critic_dim if cfg.critic_state else 0,
        )
        self._init_batch()

    def _layouts(self, gym: Any, render: bool) -> dict[str, dict[str, Any]]:
        """Per task of ``env.tasks``: state size, action bounds, cameras, time limit, proprioceptive dims; a task
        this worker holds no slot of is built once for it and closed. Refuses tasks that differ (module doc)."""
        cfg = self.cfg
        held = dict(zip(self.slot_tasks, self.envs, strict=True))
        out: dict[str, dict[str, Any]] = {}
        for t in cfg.tasks:
            env = held.get(t) or make_scene_env(gym, task_config(cfg, t), render)
            try:
                obs, _ = env.reset(seed=0)
                conv = self._convert(obs)
                width = int(conv.state.shape[-1])
                proprio = proprio_dims(env, width)
                keep = np.asarray(proprio) if cfg.state == "proprio" and proprio else None
                space = env.action_space
                out[t] = dict(state_dim=width if keep is None else len(keep), cameras=tuple(conv.images),
                              low=np.asarray(space.low, dtype=np.float32).reshape(-1),
                              high=np.asarray(space.high, dtype=np.float32).reshape(-1),
                              time_limit=_time_limit(env), keep=keep,
                              sim_dim=int(env.unwrapped.get_state().shape[-1]),
                              proprio=() if keep is not None else proprio)
            finally:
                if t not in held:
                    env.close()
        _refuse_mixed(out, cfg)
        return out

    def reset_scene(self, i: int, seed: int | None, state_id: int | None) -> SceneObs:
        return self._kept(i, super().reset_scene(i, seed, state_id))

    def scene_obs(self, i: int, raw: Any) -> SceneObs:
        return self._kept(i, super().scene_obs(i, raw))

    def _kept(self, i: int, obs: SceneObs) -> SceneObs:
        """Scene ``i``'s observation with the state dims its task keeps (``env.state``), and its critic vector
        under ``env.critic_state`` (of the scene as it is now: the moment the observation was made)."""
        keep = self._keep[i]
        state = obs.state if keep is None else obs.state[keep]
        if not self.cfg.critic_state:
            return SceneObs(state=state, images=obs.images) if keep is not None else obs
        return CriticSceneObs(state=state, images=obs.images, critic=self.critic_vector(i))

    def critic_vector(self, i: int) -> np.ndarray:
        """Scene ``i``'s privileged state now, float32 [C] (module doc): its full ManiSkill state, zero-padded,
        then the one-hots of its task and of the instruction it reports."""
        sim = self.envs[i].unwrapped.get_state().reshape(-1).numpy()
        out = np.zeros(self._critic_dim, dtype=np.float32)
        out[:sim.shape[0]] = sim
        out[self._sim_width + self.cfg.tasks.index(self.slot_tasks[i])] = 1.0
        if self.instructions[i] in self._critic_words:
            out[self._sim_width + len(self.cfg.tasks) + self._critic_words.index(self.instructions[i])] = 1.0
        return out

    def _stack(self, per_env: list[SceneObs]) -> dict[str, Any]:
        obs = super()._stack(per_env)
        if self.cfg.critic_state:
            obs["critic_state"] = torch.from_numpy(np.stack([o.critic for o in per_env]))
        return obs

    def chunk_step(self, actions: torch.Tensor | np.ndarray, observer: Any = None) -> Any:
        """``ManiSkillEnv.chunk_step`` plus ``<metric>/<task>`` episode metrics for every task (module doc)."""
        res = super().chunk_step(actions, observer)
        for t in self.cfg.tasks:
            mine = torch.tensor([s == t for s in self.slot_tasks])
            for k in PER_TASK_METRICS:
                v = res.episode[k]
                res.episode[f"{k}/{t}"] = torch.where(mine.to(v.device), v, torch.full_like(v, float("nan")))
        return res


def _refuse_mixed(layouts: dict[str, dict[str, Any]], cfg: ManiSkillMultiTaskConfig) -> None:
    """One line when the tasks differ in state size, action space or cameras."""
    def differ(what: str, key: Any) -> str | None:
        values = {t: key(lay) for t, lay in layouts.items()}
        if len({repr(v) for v in values.values()}) > 1:
            return f"{what} ({', '.join(f'{t}: {v}' for t, v in values.items())})"
        return None

    problems = [p for p in (
        differ("state sizes", lambda lay: lay["state_dim"]),
        differ("action spaces", lambda lay: (len(lay["low"]), lay["low"].round(4).tolist(),
                                             lay["high"].round(4).tolist())),
        differ("cameras", lambda lay: list(lay["cameras"])),
    ) if p]
    if problems:
        fix = ("use env.state=proprio (the robot's own state dims)" if cfg.state == "full" else
               "choose tasks with the same robot, control mode and cameras")
        raise EnvError(f"env.tasks={list(cfg.tasks)} differ in {'; '.join(problems)} under "
                       f"{cfg.control_mode}/{cfg.obs_mode}; one policy needs one layout: {fix}")


__all__ = ["MULTITASK", "PER_TASK_METRICS", "CriticSceneObs", "ManiSkillMultiTaskConfig", "ManiSkillMultiTaskEnv", "slot_tasks",
           "task_config"]
