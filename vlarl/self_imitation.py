"""Success-filtered self-imitation: RL that improves a policy by imitating its own successful episodes.

One round (the online phase of iRe-VLA, ReST-EM's improve step, rejection-sampling fine-tuning):

1. **collect**: the policy samples episodes (``Policy.sample``: for a flow VLA its chain with the SDE noise, the
   exploration its RL rollouts have) from training seeds; an episode ends at its first success, and only
   successful episodes are kept (``vlarl.collect``: a LeRobot v3.0 dataset per round, frames included);
2. **imitate**: the policy of the previous round is fine-tuned with its own ``sft_loss`` on the demonstrations plus
   every round's kept episodes so far, with its state statistics held fixed (as ``freeze_state_norm`` holds them
   in RL), and saved with the env it was trained for.

With a binary reward this is reward-weighted regression whose weights are the episode's success: the update moves
the policy toward what its own noise found to work, with the variance of supervised learning rather than of a
likelihood-ratio gradient. Why here: PPO and DSRL from a pixel multi-task SFT start stayed within +-4 points in
30-60 minutes of 2 cores (docs/vla_pixels.md), while the same start doubled when it was given more demonstrations.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: where a round's collection attempts start: far below the evaluation seeds (1,000,000+) and the demonstrations'
COLLECT_SEED_BASE = 200_000
#: attempts one seed's rounds may use before the next seed's collection starts
SEED_SPAN = 100_000
#: a round's finished collection: its summary, the policy it sampled and the settings it sampled with
COLLECTED = "collect.json"
COLLECTION_KEYS = ("attempts", "num_envs", "seed", "max_length", "tries_per_seed")


@dataclass
class RoundSettings:
    """What one round does: ``attempts`` sampled episodes (``num_envs`` at a time), then ``epochs`` of
    fine-tuning at ``lr`` with batches of ``batch_size``; ``seed`` picks the collection seeds and the shuffling."""

    attempts: int = 300
    num_envs: int = 6
    epochs: int = 20
    lr: float = 3e-4
    batch_size: int = 32
    seed: int = 0
    # repeat each instruction's kept episodes up to the most frequent instruction's count, so a task the policy
    # rarely solves is imitated as often as one it usually solves (over several tasks the easy ones dominate)
    balance: bool = False
    # give up a sampled episode not solved within this many env steps (0: run it to the env's time limit); a
    # failure costs the time limit's steps, a success usually a fraction of them
    max_length: int = 0
    # sample each collection seed this many times and keep at most one success per seed: the starts the policy
    # solves within that many tries, each once, rather than its first-try successes (mostly the starts it
    # already solves when acting deterministically)
    tries_per_seed: int = 1


def collection_seeds(seed: int, round_index: int, attempts: int) -> tuple[int, int]:
    """[first, last + 1) of the reset seeds round ``round_index`` of run seed ``seed`` collects from: disjoint over
    rounds and run seeds, below the evaluation seeds. One line naming the fix when they would not fit."""
    first = COLLECT_SEED_BASE + seed * SEED_SPAN + round_index * attempts
    if seed < 0 or (round_index + 1) * attempts > SEED_SPAN or first + attempts > 1_000_000:
        raise ValueError(f"seed={seed} with {round_index + 1} rounds of {attempts} attempts leaves the collection "
                         f"seeds [{COLLECT_SEED_BASE}, 1,000,000); use seeds 0-7 and rounds x attempts <= {SEED_SPAN}")
    return first, first + attempts


def balanced(episodes: list[Any]) -> list[Any]:
    """``episodes`` with each instruction's repeated ``round(most / count)`` times (``most``: the count of the most
    frequent instruction), in their order."""
    counts = Counter(e.instruction for e in episodes)
    most = max(counts.values(), default=0)
    return [e for e in episodes for _ in range(max(1, round(most / counts[e.instruction])))]


def collect_successes(policy: Any, env_cfg: Any, out: Path, settings: RoundSettings, round_index: int,
                      log=print) -> dict[str, Any]:
    """Sample ``settings.attempts`` episodes of ``policy`` on ``env_cfg`` and write the successful ones to ``out``
    (LeRobot v3.0, lossless frames). Returns the summary: ``kept``, ``attempts``, ``success_rate``, ``seeds``,
    per-instruction ``kept_by_instruction`` / ``attempts_by_instruction``."""
    import torch

    from vlarl.collect import CollectConfig, collect

    first, end = collection_seeds(settings.seed, round_index, settings.attempts)
    cfg = CollectConfig(checkpoint="", output=str(out), env=env_cfg, episodes=settings.attempts, seed=first,
                        max_attempts=settings.attempts, num_envs=settings.num_envs, success_only=True,
                        max_length=settings.max_length, tries_per_seed=settings.tries_per_seed,
                        deterministic=False, codec="lossless", overwrite=True)  # an unfinished round's is redone
    policy.eval()
    torch.manual_seed(first)  # the sampled chains, so a round is repeatable
    summary = collect(policy, env_cfg, cfg, log=log)
    attempts = summary.pop("per_attempt")
    by = lambda rows: dict(Counter(a["instruction"] for a in rows))  # noqa: E731
    tried = {a["seed"] for a in attempts}
    return {**summary, "seeds": [first, end], "kept_by_instruction": by([a for a in attempts if a["kept"]]),
            "attempts_by_instruction": by(attempts), "seeds_tried": len(tried),
            "seeds_solved": len({a["seed"] for a in attempts if a["success"]})}


def collection_settings(settings: RoundSettings) -> dict[str, int]:
    """The settings that decide what a round's collection samples (the imitation's epochs, rate and balance do not)."""
    return {k: getattr(settings, k) for k in COLLECTION_KEYS}


def finished_collection(round_dir: Path, policy_dir: Path, settings: RoundSettings) -> dict[str, Any] | None:
    """``round_dir/collect.json`` when that round's collection finished from ``policy_dir`` with these collection
    settings and its dataset is there (an imitation that was killed, or is redone with other epochs, reads it
    rather than sampling again); None otherwise (the round samples, over whatever it left)."""
    path = round_dir / COLLECTED
    if not path.is_file() or not (round_dir / "successes").is_dir():
        return None
    done = json.loads(path.read_text())
    same = done.get("from") == str(policy_dir) and done.get("settings") == collection_settings(settings)
    return done if same else None


def run_round(policy_dir: Path, demos: list[Any], round_dir: Path, settings: RoundSettings, round_index: int,
              earlier: list[Path], log=print, epoch_log=None) -> dict[str, Any]:
    """One round from the policy in ``policy_dir``: collect into ``round_dir/successes`` (episodes end at the first
    success: ``ignore_terminations`` off where the env has it), then fine-tune it on ``demos`` (may be empty) plus
    the kept episodes of this and the ``earlier`` rounds' datasets (``sft_loss``, its state statistics kept) into
    ``round_dir/policy`` with the env it was saved with. Writes and returns ``round_dir/round.json``. A round after
    which no episode has been kept saves no policy (``policy`` is None in the record)."""
    from policies.base import Policy
    from robots.recorder import atomic_save
    from vlarl.checkpoint import load_env_config
    from vlarl.data.demonstrations import read_demonstrations
    from vlarl.data.sft import sft_and_save
    from vlarl.evaluation.cli import _env_from_saved

    t0 = time.time()
    saved = load_env_config(policy_dir)
    if saved is None:
        raise ValueError(f"'{policy_dir}' has no env.json; self-imitation collects on the env a policy directory "
                         f"was trained for (vlarl-train checkpoints and vlarl.data.sft.save_policy_dir have one)")
    env_cfg = _env_from_saved(saved)
    collect_env = _env_from_saved({**saved, "ignore_terminations": False})  # a field the env lacks is dropped
    policy = Policy.from_pretrained(policy_dir)
    round_dir.mkdir(parents=True, exist_ok=True)
    dataset = round_dir / "successes"
    done = finished_collection(round_dir, policy_dir, settings)
    if done is not None:
        collected, collect_s = done["collect"], done["collect_s"]
        log(f"round {round_index}: collection finished earlier, read {round_dir / COLLECTED}")
    else:  # a record of another collection goes first: what is sampled now overwrites its dataset
        (round_dir / COLLECTED).unlink(missing_ok=True)
        collected = collect_successes(policy, collect_env, dataset, settings, round_index, log)
        collect_s = time.time() - t0
        done = {"from": str(policy_dir), "settings": collection_settings(settings), "collect": collected,
                "collect_s": collect_s}  # whole or absent: a kill mid-write leaves no record of a finished collection
        atomic_save(lambda tmp: tmp.write_text(json.dumps(done, indent=2)), round_dir / COLLECTED)
    record: dict[str, Any] = {"round": round_index, "from": str(policy_dir), "settings": asdict(settings),
                              "collect": collected, "collect_s": collect_s, "policy": None}
    cameras = list(policy.spec.image_keys)
    own = [e for d in [*earlier, dataset] if d.is_dir() for e in read_demonstrations(d, cameras=cameras)]
    if own:
        imitated = balanced(own) if settings.balance else own
        record["imitate"] = sft_and_save(policy, [*demos, *imitated], env_cfg, round_dir / "policy", settings.epochs,
                                         settings.batch_size, settings.lr, policy.spec.instruction, settings.seed,
                                         epoch_log, fit_normalization=False)
        record.update(policy=str(round_dir / "policy"), own_episodes=len(own), demo_episodes=len(demos),
                      imitated_own_episodes=len(imitated))
    else:
        log(f"round {round_index}: no sampled episode succeeded in {collected['attempts']} attempts and no earlier "
            f"round kept one; nothing to imitate (the policy stays {policy_dir})")
    record["wall_s"] = time.time() - t0
    (round_dir / "round.json").write_text(json.dumps(record, indent=2))
    return record
