"""What vlarl knows about ManiSkill3 task ids, checked before a simulator is built.

ManiSkill's own failure modes are unfriendly for a training run: an unknown id is a gymnasium
``NameNotFound``, a missing asset opens an interactive ``(y|n)`` download prompt (or, with no
terminal, a bare ``EOFError``), and an unsupported reward or control mode is an ``assert`` deep in the
agent. These checks run at config validation, before a run directory exists, and each failure is
one line naming the problem and the fix. ``docs/maniskill_tasks.md`` (made by
``scripts/audit_maniskill_tasks.py``) lists which tasks work offline on a CPU machine.
"""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

from simulators.base import EnvError

# One language instruction per task, so language-conditioned policies see the same schema everywhere.
# Every task the audit found to build and step offline has one (tests/simulators check this).
INSTRUCTIONS: dict[str, str] = {
    # table-top manipulation (Panda unless noted)
    "PushCube-v1": "push the cube to the red and white goal region",
    # vlarl's language variant (simulators/language_tasks.py): the instruction changes per episode; this is
    # the spec's placeholder, the env reports each episode's own
    "PushCubeToColor-v1": "push the cube to the red goal",
    "PullCube-v1": "pull the cube back to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "PickCubeSO100-v1": "pick up the cube and lift it to the goal position",
    "PickCubeWidowXAI-v1": "pick up the cube and lift it to the goal position",
    "SO100GraspCube-v1": "grasp the cube and lift it",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "StackPyramid-v1": "stack the three cubes into a pyramid",
    "PegInsertionSide-v1": "insert the peg into the hole on the side of the box",
    "PlaceSphere-v1": "place the sphere into the bin",
    "LiftPegUpright-v1": "lift the peg and stand it upright",
    "PokeCube-v1": "use the peg to poke the cube to the goal",
    "PushT-v1": "push the T-shaped block onto the T-shaped target",
    "RollBall-v1": "roll the ball to the goal region",
    "PlugCharger-v1": "plug the charger into the receptacle",
    "PullCubeTool-v1": "use the tool to pull the cube closer",
    "TwoRobotPickCube-v1": "pick up the cube with two robots",
    "TwoRobotStackCube-v1": "use two robots to stack the blue cube on top of the green cube",
    "FMBAssembly1Easy-v1": "insert the part into the assembly board",
    "DrawTriangle-v1": "draw the triangle on the canvas",
    "DrawSVG-v1": "trace the drawing on the canvas",
    "TableTopFreeDraw-v1": "draw freely on the canvas",
    "OpenCabinetDoor-v1": "open the cabinet door",
    "OpenCabinetDrawer-v1": "open the cabinet drawer",
    "TurnFaucet-v1": "turn the faucet handle",
    "PickSingleYCB-v1": "pick up the object and move it to the goal position",
    "PickClutterYCB-v1": "pick up the target object from the clutter",
    "AssemblingKits-v1": "put the object into its slot in the kit",
    "InsertFlower-v1": "insert the flower into the vase",
    # dexterous hands
    "RotateValveLevel0-v1": "rotate the valve",
    "RotateValveLevel1-v1": "rotate the valve",
    "RotateValveLevel2-v1": "rotate the valve",
    "RotateValveLevel3-v1": "rotate the valve",
    "RotateValveLevel4-v1": "rotate the valve",
    "RotateSingleObjectInHandLevel0-v1": "rotate the object in the hand",
    "RotateSingleObjectInHandLevel1-v1": "rotate the object in the hand",
    "RotateSingleObjectInHandLevel2-v1": "rotate the object in the hand",
    "RotateSingleObjectInHandLevel3-v1": "rotate the object in the hand",
    "TriFingerRotateCubeLevel0-v1": "move the cube to the goal pose with the three fingers",
    "TriFingerRotateCubeLevel1-v1": "move the cube to the goal pose with the three fingers",
    "TriFingerRotateCubeLevel2-v1": "move the cube to the goal pose with the three fingers",
    "TriFingerRotateCubeLevel3-v1": "move the cube to the goal pose with the three fingers",
    "TriFingerRotateCubeLevel4-v1": "move the cube to the goal pose with the three fingers",
    # humanoids, quadrupeds and control benchmarks
    "UnitreeG1PlaceAppleInBowl-v1": "place the apple in the bowl",
    "UnitreeG1TransportBox-v1": "carry the box to the other table",
    "UnitreeG1Stand-v1": "stand up and keep balance",
    "UnitreeH1Stand-v1": "stand up and keep balance",
    "UnitreeGo2-Reach-v1": "walk to the goal",
    "AnymalC-Reach-v1": "walk to the goal",
    "AnymalC-Spin-v1": "spin in place",
    "MS-AntRun-v1": "run forward",
    "MS-AntWalk-v1": "walk forward",
    "MS-HumanoidRun-v1": "run forward",
    "MS-HumanoidWalk-v1": "walk forward",
    "MS-HumanoidStand-v1": "stand up",
    "MS-HopperHop-v1": "hop forward",
    "MS-HopperStand-v1": "stand up",
    "MS-CartpoleBalance-v1": "balance the pole upright",
    "MS-CartpoleSwingUp-v1": "swing the pole up and balance it",
    "Empty-v1": "move the arm",
}

REWARD_MODES = ("sparse", "dense", "normalized_dense", "none")

# Assets some tasks load without declaring them as download ids (ManiSkill 3.0.1 then stops with a
# FileNotFoundError or a prompt deep in the build): scene datasets, PartNet models, a robot set inside
# the task. Keyed by task id prefix; found by scripts/audit_maniskill_tasks.py.
UNDECLARED_ASSETS: dict[str, list[str]] = {
    "ReplicaCADPrepareGroceries": ["ReplicaCAD", "ReplicaCADRearrange"],
    "ReplicaCADSetTable": ["ReplicaCAD", "ReplicaCADRearrange"],
    "ReplicaCADTidyHouse": ["ReplicaCAD", "ReplicaCADRearrange"],
    "ReplicaCAD_": ["ReplicaCAD"],
    "SceneManipulation-": ["ReplicaCAD"],
    "ArchitecTHOR_": ["AI2THOR"],
    "OpenCabinetDoor-": ["partnet_mobility_cabinet"],
    "PickCubeWidowXAI-": ["widowxai"],
}

# Reward modes a task declares but whose code fails in ManiSkill 3.0.1 (found by the audit).
BROKEN_REWARD_MODES: dict[str, dict[str, str]] = {
    "MS-CartpoleBalance-v1": {"sparse": "its sparse reward negates a bool tensor (RuntimeError)"},
    "MS-HumanoidRun-v1": {"dense": "its dense reward is not implemented"},
    "MS-HumanoidStand-v1": {"dense": "its dense reward is not implemented"},
    "MS-HumanoidWalk-v1": {"dense": "its dense reward is not implemented"},
}

# Python packages a task imports when it is built (not dependencies of mani-skill itself).
TASK_PACKAGES: dict[str, str] = {"DrawSVG-v1": "svgpathtools"}


# Tasks whose instruction changes per episode (``InstructedTask``): every instruction they give, for config-time
# checks (does each fit a policy's prompt?) without building the scene; the task module's own list must match.
EPISODE_INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "PushCubeToColor-v1": ("push the cube to the red goal", "push the cube to the blue goal"),
}


def task_instructions(task: str) -> list[str]:
    """Every instruction ``task`` can report in ``obs["instruction"]``."""
    return list(EPISODE_INSTRUCTIONS.get(task, (instruction_for(task),)))


def instruction_for(task: str) -> str:
    """The task's instruction; an unlisted task gets a phrase made from its id ("PushCube-v1" -> "push cube")."""
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    return "".join(" " + c.lower() if c.isupper() else c for c in task.split("-")[0]).strip()


def import_maniskill() -> Any:
    """gymnasium with ManiSkill's tasks registered, or a clear error naming the install command."""
    try:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks)

        import simulators.language_tasks  # noqa: F401  (registers vlarl's task variants with ManiSkill)
    except ImportError as e:  # pragma: no cover - depends on install
        raise EnvError(
            f"ManiSkill3 is not installed ({e}); install it with `pip install -e .[maniskill]` "
            "and run scripts/setup_system.sh for a Vulkan device"
        ) from e
    return gym


def registered_tasks() -> dict[str, Any]:
    """ManiSkill's task registry: id -> its EnvSpec (task class, asset ids, time limit)."""
    import_maniskill()
    from mani_skill.utils.registration import REGISTERED_ENVS

    return REGISTERED_ENVS


def check_task(task: str) -> None:
    """Raise a clear error for a task id ManiSkill does not know, with the closest known ids."""
    known = registered_tasks()
    if task in known:
        return
    # compare case-insensitively ("pickcube" -> PickCube-v1), and without the version suffix
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(task.lower(), list(by_lower), n=3, cutoff=0.6)
    stem = task.lower().split("-v")[0]
    close += [k for k in by_lower if k.split("-v")[0] == stem and k not in close]
    hint = f" Did you mean {[by_lower[c] for c in close[:3]]}?" if close else ""
    raise EnvError(
        f"unknown ManiSkill task env.task='{task}'.{hint} Set env.task to a registered id "
        f"({len(known)} in all; docs/maniskill_tasks.md lists the ones that work offline)"
    )


def task_class(task: str) -> type:
    check_task(task)
    return registered_tasks()[task].cls


def supported_reward_modes(task: str) -> tuple[str, ...]:
    """The reward modes the task implements (ManiSkill's ``SUPPORTED_REWARD_MODES``)."""
    return tuple(getattr(task_class(task), "SUPPORTED_REWARD_MODES", REWARD_MODES))


def check_reward_mode(task: str, reward_mode: str) -> None:
    if reward_mode not in REWARD_MODES:
        raise EnvError(
            f"env.reward_mode='{reward_mode}' is unknown; use one of sparse, dense, normalized_dense"
        )
    broken = BROKEN_REWARD_MODES.get(task, {})
    ok = [m for m in supported_reward_modes(task) if m not in broken]
    if reward_mode not in ok:
        why = f" (declared, but {broken[reward_mode]} in ManiSkill 3.0.1)" if reward_mode in broken else ""
        raise EnvError(
            f"ManiSkill task '{task}' has no working '{reward_mode}' reward{why}; set env.reward_mode to one of "
            f"{[m for m in ok if m != 'none']}"
        )


def default_robot(task: str) -> str | tuple | None:
    """The robot a task builds when ``robot_uids`` is not given (its ``__init__`` default)."""
    cls = task_class(task)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        p = inspect.signature(init).parameters.get("robot_uids")
        if p is not None and p.default is not inspect.Parameter.empty:
            return p.default
    return None


def _asset_paths(asset_id: str) -> list[tuple[str, Path]]:
    """(data source id, where it lives) for an asset id that may be a group of sources."""
    from mani_skill.utils import assets

    if asset_id in assets.DATA_GROUPS:
        ids = assets.expand_data_group_into_individual_data_source_ids(asset_id)
    else:
        ids = [asset_id]
    out = []
    for i in sorted(ids):
        src = assets.DATA_SOURCES[i]
        out.append((i, Path(src.output_dir) / src.target_path))
    return out


def missing_assets(task: str, robot_uids: str = "") -> list[tuple[str, Path]]:
    """Assets the task (and its robot) need that are not on disk: [(download id, expected path)].

    The download id is what ``python -m mani_skill.utils.download_asset`` takes: the task's or
    robot's declared asset id (a single source such as ``ycb``, or a group such as
    ``partnet_mobility_cabinet``), so one command fetches everything that id stands for."""
    import_maniskill()
    from mani_skill.agents.registration import REGISTERED_AGENTS
    from mani_skill.utils import assets

    spec = registered_tasks()[task]
    needed = list(spec.asset_download_ids or [])
    for prefix, ids in UNDECLARED_ASSETS.items():
        if task.startswith(prefix):
            needed += [a for a in ids if a not in needed]
    robots = robot_uids or default_robot(task)
    for uid in robots if isinstance(robots, (tuple, list)) else [robots]:
        if isinstance(uid, str) and uid in REGISTERED_AGENTS:
            needed += [a for a in REGISTERED_AGENTS[uid].asset_download_ids if a not in needed]
    missing = []
    for asset_id in needed:
        absent = [p for i, p in _asset_paths(asset_id) if not assets.is_data_source_downloaded(i)]
        if absent:
            missing.append((asset_id, absent[0] if len(absent) == 1 else absent[0].parent))
    return missing


def asset_for_path(path: str | Path) -> str | None:
    """The download id whose files would live at ``path`` (a file ManiSkill failed to open), if any."""
    from mani_skill.utils import assets

    path = Path(path)
    best, best_len = None, -1
    for i, src in assets.DATA_SOURCES.items():
        root = Path(src.output_dir) / src.target_path
        if (root == path or root in path.parents or path in root.parents) and len(str(root)) > best_len:
            best, best_len = i, len(str(root))
    return best


def asset_dir() -> Path:
    """Where ManiSkill keeps downloaded assets (``$MS_ASSET_DIR/data``, default ``~/.maniskill/data``)."""
    import mani_skill

    return Path(mani_skill.ASSET_DIR)


def missing_asset_message(task: str, missing: list[tuple[str, Path]]) -> str:
    ids = [a for a, _ in missing]
    cmds = " && ".join(f"python -m mani_skill.utils.download_asset {a}" for a in ids)
    where = ", ".join(str(p) for _, p in missing)
    return (
        f"ManiSkill task '{task}' needs asset(s) {ids}, which are not on this machine (expected at {where}). "
        f"Fetch them with `{cmds}` (they go to {asset_dir()}; on a machine without network run it on one "
        f"with network and copy that folder here, or point MS_ASSET_DIR at a copy), or pick a task that works "
        f"offline (docs/maniskill_tasks.md)"
    )


def check_assets(task: str, robot_uids: str = "") -> None:
    missing = missing_assets(task, robot_uids)
    if missing:
        raise EnvError(missing_asset_message(task, missing))


def check_packages(task: str) -> None:
    import importlib.util

    pkg = TASK_PACKAGES.get(task)
    if pkg and importlib.util.find_spec(pkg) is None:
        raise EnvError(
            f"ManiSkill task '{task}' needs the Python package {pkg}; install it with `pip install {pkg}`"
        )


def check_task_config(cfg: Any) -> None:
    """All start-up checks on a ManiSkill config's task: id, reward mode, assets, extra packages."""
    check_task(cfg.task)
    check_reward_mode(cfg.task, cfg.reward_mode)
    check_assets(cfg.task, cfg.robot_uids)
    check_packages(cfg.task)


def assets_named_in(printed: str) -> list[str]:
    """Download ids in what ManiSkill printed before its download prompt (a robot or task asset)."""
    import re

    from mani_skill.utils import assets

    ids = re.findall(r"Robot (\S+) has assets available for download", printed)
    for group in re.findall(r"requires asset\(s\) (.+?) which could not be found", printed):
        ids += [a.strip(" []'") for a in group.split(",")]
    return [i for i in dict.fromkeys(ids) if i in assets.DATA_SOURCES or i in assets.DATA_GROUPS]
