"""Replay of chunk transitions for the off-policy algorithms, on torchrl's replay buffers.

A transition is one chunk step of one env (T = chunk, A = action dim, D = state dim):

    state [D], actions [T, A] (env units, as executed), step_rewards [T], step_mask [T] (executed actions),
    terminated [], truncated [], next_state [D] (the final state when the episode ended in this chunk)

and for a pixel critic (``cameras``) also ``images`` and ``next_images``: {camera: uint8 [H, W, 3]}, nested
TensorDicts, as the env gave them (the next ones from the episode's final observation, as ``next_state``), and
``instruction`` [] (int64): the row's words as an id into the replay's ``InstructionIds`` (id 0: the env's own
instruction, also what rows recorded without words read). Why: a policy over several tasks or instructions scores
a replayed chunk under the words it was chosen for, not under the env's first instruction.

``ChunkReplay`` is a ``TensorDictReplayBuffer`` on a ``LazyTensorStorage`` (a ring buffer in memory, uniform
sampling). ``MixedReplay`` keeps online transitions and demonstrations apart and draws a fixed fraction of
every batch from the demonstrations (RLPD's symmetric sampling: 50/50). Both round-trip through
``state_dict`` (storage, write cursor), so a resumed run keeps its data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vlarl.data.trajectory import Trajectory, instructions_at

if TYPE_CHECKING:  # tensordict / torchrl load in ~2 s: only when an off-policy algorithm runs
    from tensordict import TensorDict

TRANSITION_KEYS = ("state", "actions", "step_rewards", "step_mask", "terminated", "truncated", "next_state")
IMAGE_KEYS = ("images", "next_images")  # a pixel critic's transitions add these (see the module doc)


def _torchrl_buffers() -> tuple[Any, Any]:
    """torchrl's storage and buffer classes, imported without its process-wide side effect: importing torchrl
    turns off ``torch.distributions`` argument checks for the whole process (a speed-up of its own), so a
    NaN mean would no longer raise in any policy of a run that built a replay buffer. The setting is put back."""
    validate = torch.distributions.Distribution._validate_args
    try:
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
    return LazyTensorStorage, TensorDictReplayBuffer


class InstructionIds:
    """The instructions of replayed rows as small ints (a TensorDict holds no strings): ``ids(words)`` gives each
    its id, adding new words; ``words(ids)`` gives them back. Id 0 is ``default``, the env's own instruction."""

    def __init__(self, default: str = ""):
        self.vocab: list[str] = [default]
        self._index = {default: 0}

    def ids(self, words: list[str]) -> torch.Tensor:
        for w in words:
            if w not in self._index:
                self._index[w] = len(self.vocab)
                self.vocab.append(w)
        return torch.tensor([self._index[w] for w in words], dtype=torch.int64)

    def words(self, ids: torch.Tensor) -> list[str]:
        return [self.vocab[i] for i in ids.tolist()]

    def state_dict(self) -> list[str]:
        return list(self.vocab)

    def load_state_dict(self, vocab: list[str]) -> None:
        self.vocab = list(vocab)
        self._index = {w: i for i, w in enumerate(self.vocab)}


class ChunkReplay:
    """A ring buffer of chunk transitions with uniform sampling (torchrl ``TensorDictReplayBuffer``)."""

    def __init__(self, capacity: int):
        LazyTensorStorage, TensorDictReplayBuffer = _torchrl_buffers()
        self.capacity = int(capacity)
        self.buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(self.capacity))

    def __len__(self) -> int:
        return len(self.buffer)

    def extend(self, transitions: TensorDict) -> None:
        if transitions.batch_size[0] > 0:
            self.buffer.extend(transitions)

    def sample(self, n: int) -> TensorDict:
        """``n`` transitions drawn uniformly with replacement (torch's global RNG)."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return self.buffer.sample(batch_size=n)

    def state_dict(self) -> dict[str, Any]:
        """The filled rows (in storage order) and the write cursor; not the preallocated capacity."""
        n = len(self)
        rows = self.buffer.storage[:n].clone().to_dict() if n else None  # clone: a view would save the capacity
        return {"rows": rows, "writer": self.buffer._writer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from tensordict import TensorDict

        self.__init__(self.capacity)
        if state["rows"] is not None:
            rows = TensorDict(state["rows"], batch_size=[_rows_of(state["rows"])])
            self.buffer.extend(rows)  # rows land at the indices they had
        self.buffer._writer.load_state_dict(state["writer"])  # the ring continues where it was


def _rows_of(rows: dict[str, Any]) -> int:
    """The leading size of a saved row dict (the first tensor, inside nested image dicts too)."""
    first = next(iter(rows.values()))
    return _rows_of(first) if isinstance(first, dict) else int(first.shape[0])


class MixedReplay:
    """Online transitions plus demonstrations; ``demo_ratio`` of every batch comes from the demonstrations
    (when there are any). Returns one batch, online rows first, with ``is_demo`` [n] marking the rest."""

    def __init__(self, capacity: int, demo_ratio: float, default_instruction: str = ""):
        if not 0.0 <= demo_ratio <= 1.0:
            raise ValueError(f"algorithm.demo_ratio={demo_ratio} must lie in [0, 1]")
        self.online = ChunkReplay(capacity)
        self.demos: ChunkReplay | None = None
        self.demo_ratio = demo_ratio
        self.instructions = InstructionIds(default_instruction)

    def add_demos(self, transitions: TensorDict) -> None:
        self.demos = ChunkReplay(max(1, transitions.batch_size[0]))
        self.demos.extend(transitions)

    def extend_demos(self, transitions: TensorDict) -> None:
        """Add demonstrations to those held, in a ring of the online buffer's capacity (the robot loop's operator
        interventions arrive episode by episode; ``add_demos`` holds one fixed set)."""
        if self.demos is None:
            self.demos = ChunkReplay(self.online.capacity)
        self.demos.extend(transitions)

    def __len__(self) -> int:
        return len(self.online)

    def sample(self, n: int) -> TensorDict:
        n_demo = round(n * self.demo_ratio) if self.demos is not None and len(self.demos) else 0
        if len(self.online) == 0:
            n_demo = n
        parts = []
        if n - n_demo > 0:
            parts.append(self.online.sample(n - n_demo).set("is_demo", torch.zeros(n - n_demo, dtype=torch.bool)))
        if n_demo > 0:
            assert self.demos is not None, "no demonstrations and no online data to sample from"
            parts.append(self.demos.sample(n_demo).set("is_demo", torch.ones(n_demo, dtype=torch.bool)))
        if any("instruction" in p.keys() for p in parts):  # rows recorded without words read the env's (id 0)
            parts = [p if "instruction" in p.keys() else p.set("instruction", torch.zeros(p.batch_size[0],
                                                                                        dtype=torch.int64))
                     for p in parts]
        return torch.cat(parts)

    def state_dict(self) -> dict[str, Any]:
        # demonstrations are read again from algorithm.demos on start-up; only online data is saved
        return {"online": self.online.state_dict(), "instructions": self.instructions.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        online = state["online"]
        if "instructions" in state:
            held = self.instructions.vocab  # the demonstrations' words got their ids when they were added
            if len(held) > 1 and state["instructions"][: len(held)] != held:
                raise ValueError(f"the saved replay's instructions {state['instructions'][:len(held)]} do not start "
                                 f"with the demonstrations' {held}: resume with the algorithm.demos the run began "
                                 f"with")
            self.instructions.load_state_dict(state["instructions"])
        elif online["rows"] is not None:  # saved before rows kept their words: they read the env's (id 0)
            online = {**online, "rows": {**online["rows"], "instruction": torch.zeros(
                _rows_of(online["rows"]), dtype=torch.int64)}}
        self.online.load_state_dict(online)


def trajectory_transitions(traj: Trajectory, cameras: list[str] | tuple[str, ...] = (),
                           instructions: InstructionIds | None = None, critic_state: bool = False) -> TensorDict:
    """Every chunk step of a collected trajectory as transitions [N * B] (time-major).

    Needs the trajectory's ``step_rewards`` [N, B, T], ``step_mask`` [N, B, T] and ``next_state`` [N, B, D]
    (recorded by ``vlarl.data.builder.TrajectoryBuilder``) and ``traj.replay['actions']`` [N, B, T, A]; with
    ``cameras`` also ``traj.obs['images'][k]`` and ``traj.next_images[k]`` [N, B, H, W, 3] of each. With
    ``instructions`` every row's words (``traj.obs['instruction']``: one per row, per env or for all) as their ids
    (a row's next observation is read under the same words: the episode's, where it ended in the chunk). With
    ``critic_state`` also ``critic_state`` and ``next_critic_state`` [C] (asymmetric critics,
    ``algorithm.critic_obs=critic_state``): ``traj.obs['critic_state']`` and ``traj.next_critic_state``.
    """
    missing = [f"obs['images']['{k}']" for k in cameras if k not in traj.obs.get("images", {})]
    missing += ["replay['actions']"] if "actions" not in traj.replay else []
    missing += ["obs['critic_state']"] if critic_state and "critic_state" not in traj.obs else []
    if missing:
        raise ValueError(f"off-policy replay needs the trajectory's {missing}; the collector records them")
    traj.require("step_rewards", "step_mask", "next_state", *(f"next_images.{k}" for k in cameras),
                 *(["next_critic_state"] if critic_state else []), why="off-policy replay")
    from tensordict import TensorDict

    M = traj.num_steps * traj.num_envs
    out = TensorDict({
        "state": traj.flat(traj.obs["state"]).float(),
        "actions": traj.flat(traj.replay["actions"]).float(),
        "step_rewards": traj.flat(traj.step_rewards).float(),
        "step_mask": traj.flat(traj.step_mask).bool(),
        "terminated": traj.flat(traj.dones).bool(),
        "truncated": traj.flat(traj.truncated).bool(),
        "next_state": traj.flat(traj.next_state).float(),
    }, batch_size=[M])
    if cameras:
        out.set("images", TensorDict({k: traj.flat(traj.obs["images"][k]) for k in cameras}, batch_size=[M]))
        out.set("next_images", TensorDict({k: traj.flat(traj.next_images[k]) for k in cameras},
                                          batch_size=[M]))
    if critic_state:
        out.set("critic_state", traj.flat(traj.obs["critic_state"]).float())
        out.set("next_critic_state", traj.flat(traj.next_critic_state).float())
    if instructions is not None:
        words = instructions_at(list(traj.obs.get("instruction") or []), range(M))
        out.set("instruction", instructions.ids(words) if words else torch.zeros(M, dtype=torch.int64))
    return out


def demo_transitions(episodes: list[Any], chunk_size: int, cameras: list[str] | tuple[str, ...] = (),
                     instructions: InstructionIds | None = None, critic_state: bool = False) -> TensorDict:
    """Chunk transitions from demonstrations: one transition starting at every step ``i`` with actions
    ``i .. i+T-1`` (masked past the end), labelled as the env's ``reward_mode=sparse`` with terminations on would:

    - a successful episode (``success`` True, or not recorded: the scripted experts and ``vlarl-collect
      success_only=true`` write successes that end at their success) has reward 1 on its last action and is
      terminated there;
    - a failed one (``success`` False) ran into the time limit: reward 0 everywhere, never terminated, and the
      chunks that reach its end are truncated and bootstrap from ``final_state``, the observation after its last
      action (``read_maniskill_h5`` fills it).

    episodes: objects with ``state [L, D]`` and ``actions [L, A]`` -> transitions [sum L]. With ``cameras`` (a
    pixel actor's) each episode also needs ``images`` {camera: uint8 [L, H, W, 3]} (``CameraEpisode``; a failed
    one ``final_images`` too), and the transitions get ``images`` / ``next_images`` as online ones have them.
    With ``instructions`` every row gets its episode's words as their id (``Episode.instruction``; an episode
    recorded without words reads the env's own, id 0), so a policy over several tasks replays each demonstration
    under the instruction it was shown for. With ``critic_state`` (critics on the scene state) every episode
    needs ``critic_state`` [L + 1, C] (``simulators.critic_state_replay``), and the transitions get
    ``critic_state`` / ``next_critic_state`` as online ones have them.
    """
    rows: dict[str, list[torch.Tensor]] = {k: [] for k in TRANSITION_KEYS}
    privileged: dict[str, list[torch.Tensor]] = {"critic_state": [], "next_critic_state": []}
    pix: dict[str, dict[str, list[torch.Tensor]]] = {key: {c: [] for c in cameras} for key in IMAGE_KEYS}
    T = chunk_size
    words: list[str] = []
    for ep in episodes:
        state = torch.as_tensor(np.asarray(ep.state), dtype=torch.float32)
        actions = torch.as_tensor(np.asarray(ep.actions), dtype=torch.float32)
        L, A = actions.shape
        if L == 0:
            continue
        if instructions is not None:
            words += [getattr(ep, "instruction", "") or instructions.vocab[0]] * L
        failed = _success(ep) is False
        frames = _episode_frames(ep, cameras, L, failed)
        critic = _episode_critic_state(ep, L) if critic_state else None
        rewards = torch.zeros(L + T)
        if failed:
            final = ep.final_state
            if final is None:
                raise ValueError("a failed demonstration needs its final observation (Episode.final_state) to "
                                 "bootstrap from; record it (.h5 obs [L + 1, D]) or leave failed episodes out")
            final = torch.as_tensor(np.asarray(final), dtype=torch.float32)
        else:
            rewards[L - 1] = 1.0
        padded = torch.cat([actions, actions[-1:].expand(T, A)])  # past the end: repeat, masked out
        for i in range(L):
            k = min(T, L - i)
            ends = i + k >= L
            rows["state"].append(state[i])
            rows["actions"].append(padded[i:i + T])
            rows["step_rewards"].append(rewards[i:i + T] * (torch.arange(T) < k))
            rows["step_mask"].append(torch.arange(T) < k)
            rows["terminated"].append(torch.tensor(ends and not failed))
            rows["truncated"].append(torch.tensor(ends and failed))
            # at the end: a failure bootstraps from its final state (a success's is unused: it terminated)
            rows["next_state"].append((final if failed else state[L - 1]) if ends else state[i + k])
            for c, f in frames.items():  # f: [L + 1, H, W, 3], row L the final frame (a success's: its last)
                pix["images"][c].append(f[i])
                pix["next_images"][c].append(f[L if failed else L - 1] if ends else f[i + k])
            if critic is not None:  # [L + 1, C], read as the frames are
                privileged["critic_state"].append(critic[i])
                privileged["next_critic_state"].append(critic[L if failed else L - 1] if ends else critic[i + k])
    if not rows["state"]:
        raise ValueError("the demonstrations hold no steps")
    from tensordict import TensorDict

    n = len(rows["state"])
    out = TensorDict({k: torch.stack(v) for k, v in rows.items()}, batch_size=[n])
    for key, cams in pix.items():
        if cams:
            out.set(key, TensorDict({c: torch.stack(v) for c, v in cams.items()}, batch_size=[n]))
    if critic_state:
        for key, v in privileged.items():
            out.set(key, torch.stack(v))
    if instructions is not None:
        out.set("instruction", instructions.ids(words))
    return out


def _episode_critic_state(ep: Any, L: int) -> torch.Tensor:
    """An episode's critic states [L + 1, C] (before each action and after the last)."""
    cs = getattr(ep, "critic_state", None)
    if cs is None or len(cs) < L + 1:
        raise ValueError("a demonstration holds no critic_state for critics on the scene state; add it with "
                         "scripts/demo_critic_state.py (replays each episode in the multi-task env), or set "
                         "algorithm.critic_obs=policy")
    return torch.as_tensor(np.asarray(cs[:L + 1]), dtype=torch.float32)


def _success(ep: Any) -> bool | None:
    """An episode's success flag: ``Episode.success``, or a LeRobot episode's ``meta["success"]`` (None: not
    recorded)."""
    if hasattr(ep, "success"):
        return ep.success
    flag = getattr(ep, "meta", {}).get("success")
    return None if flag is None else bool(flag)


def _episode_frames(ep: Any, cameras: list[str] | tuple[str, ...], L: int, failed: bool) -> dict[str, torch.Tensor]:
    """{camera: uint8 [L + 1, H, W, 3]}: an episode's frames with the one after its last action appended (a
    success's last frame repeated when the file has none: its next observation is never read)."""
    out = {}
    for c in cameras:
        images = getattr(ep, "images", None) or {}
        if c not in images:
            raise ValueError(f"a demonstration has no frames of camera '{c}' (it has {sorted(images)}), which the "
                             f"pixel actor reads; make demonstrations with images (algorithm.demos=auto with an "
                             f"RGB env, or vlarl-demos env=<that env>)")
        f = torch.as_tensor(np.asarray(images[c]), dtype=torch.uint8)[:L]
        last = (getattr(ep, "final_images", None) or {}).get(c)
        if last is None and failed:
            raise ValueError(f"a failed demonstration needs camera '{c}''s frame after its last action to "
                             f"bootstrap from; record it (.h5 images [L + 1, H, W, 3]) or leave failed episodes out")
        tail = torch.as_tensor(np.asarray(last), dtype=torch.uint8)[None] if last is not None else f[-1:]
        out[c] = torch.cat([f, tail])
    return out
