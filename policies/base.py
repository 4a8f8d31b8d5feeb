"""The RL-ready policy interface every policy family implements.

A policy turns the shared observation schema (see ``simulators.base``; policies do not import it)
into a chunk of actions, and can score the same chunk again with gradients, which is all PPO and
GRPO need:

* ``sample(obs)``   -> ``ActionSample``: actions, their log-probabilities, a value (if the policy has a
  value head) and ``replay``: whatever the family needs to score exactly this sample again (token
  ids for autoregressive VLAs; the denoising chain for flow/diffusion policies; the actions here).
* ``evaluate(obs, replay)`` -> ``(logprob, entropy, value)`` with gradients.
* ``act(obs)``      -> deterministic actions for evaluation and deployment.
* ``save_pretrained(dir)`` / ``Policy.from_pretrained(dir)``: weights (safetensors), config, env spec
  and normalization statistics together, so a checkpoint can never meet the wrong stats; a family composed
  with a ``processor`` (``policies.processors``) saves its steps beside them and gets them back on load.
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from policies.processors.base import Processor
from policies.spec import CheckpointError, PolicySpec

__all__ = ["ActionSample", "CheckpointError", "Policy", "PolicySpec", "as_float_tensor", "untied_state_dict"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
NORMALIZATION_NAME = "normalization.json"
CHECKPOINT_FILES = (WEIGHTS_NAME, CONFIG_NAME, NORMALIZATION_NAME)


@dataclass
class ActionSample:
    """One sampled chunk. B = batch, T = chunk length, A = action dim.

    actions: float32 [B, T, A] (in env units, before the env clips them)
    logprob: float32 [B, T, A] per-dimension log-probabilities (granularity reduces them later)
    value:   float32 [B] or None
    replay:  tensors (each with leading dim B) needed by ``evaluate`` to score this sample again
    """

    actions: torch.Tensor
    logprob: torch.Tensor
    value: torch.Tensor | None
    replay: dict[str, torch.Tensor]


def untied_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` as contiguous CPU tensors for safetensors, which refuses tensors that share storage:
    a tensor tied to an earlier one (pi0's lm_head = its token embeddings) is written as a copy, and loading fills
    both names again."""
    state, seen = {}, set()
    for k, v in module.state_dict().items():
        t = v.detach().cpu()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        state[k] = t.clone() if key in seen else t.contiguous()
        seen.add(key)
    return state


def _read_saved(d: Path) -> tuple[str, dict[str, Any], PolicySpec]:
    """(policy name, saved config dict, spec) of a ``save_pretrained`` directory, older layouts upgraded; a
    missing file or a foreign config is a ``CheckpointError`` naming the fix."""
    from policies.registry import policy_class, upgrade_saved

    if not d.is_dir():
        raise CheckpointError(f"policy checkpoint '{d}' does not exist or is not a directory")
    missing = [f for f in CHECKPOINT_FILES if not (d / f).is_file()]
    if missing:
        raise CheckpointError(
            f"policy checkpoint '{d}' is missing {missing}; point at a directory written by "
            f"save_pretrained (e.g. <run_dir>/checkpoints/latest)"
        )
    try:
        name, saved = upgrade_saved(json.loads((d / CONFIG_NAME).read_text()))
        policy_class(name)
        return name, saved, _dataclass_from_dict(PolicySpec, saved["spec"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint file '{d / CONFIG_NAME}' is not a policy config ({e}); "
                              f"re-save the policy with save_pretrained") from None


class Policy(nn.Module, abc.ABC):
    """Base class; subclasses set ``name`` and ``config_class`` and register with ``register_policy``."""

    name: str = "base"
    config_class: type = object

    def __init__(self, config: Any, spec: PolicySpec):
        super().__init__()
        self.config = config
        self.spec = spec
        #: the env <-> network conventions (``policies.processors``) of a family composed with one: saved as
        #: ``processor.json`` + ``processor.safetensors`` and loaded back by ``from_pretrained``; its statistics
        #: are buffers of the policy too (``processor.steps.<i>.*``), so rollout workers get them with the weights
        self.processor: Processor | None = None

    @property
    def chunk_size(self) -> int:
        return int(getattr(self.config, "chunk_size", 1))

    @abc.abstractmethod
    def sample(self, obs: dict[str, Any]) -> ActionSample:
        """Draw a stochastic chunk for rollouts (no gradients)."""

    @abc.abstractmethod
    def evaluate(self, obs: dict[str, Any], replay: dict[str, torch.Tensor]):
        """Score ``replay`` under the current weights.

        Returns ``(logprob [B, T, A], entropy [B, T, A], value [B] or None)`` with gradients; with a binned
        value head (``value_support`` set) the value is its logits ``[B, K]``.
        """

    @abc.abstractmethod
    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        """Deterministic chunk ``[B, T, A]`` for evaluation and deployment."""

    def value(self, obs: dict[str, Any]) -> torch.Tensor | None:
        """Value estimate ``[B]`` (for bootstrapping a truncated episode), or None without a value head."""
        return None

    #: the bins of a binned value head (``policies.value_head.HLGaussSupport``): ``evaluate`` then returns the
    #: value as logits over them and ``sample`` / ``value`` their expectation; None = a scalar value head
    value_support: Any = None

    #: parameter-name prefixes of the value head's own weights (``algorithm.critic_lr`` applies to them)
    value_head_prefixes: tuple[str, ...] = ("critic.", "value_head.")

    def value_head_parameters(self) -> list[str]:
        """Names of the trainable parameters that belong to the value head only (not the shared trunk)."""
        return [n for n, p in self.named_parameters() if p.requires_grad and n.startswith(self.value_head_prefixes)]

    def normalization_stats(self) -> dict[str, list[float]]:
        """Statistics the policy normalizes with (saved beside the weights for humans and tools)."""
        return {}

    def update_normalization(self, obs: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Fold a batch of observations into running normalization statistics (if any)."""

    # -- persistence ----------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write weights + config + spec + normalization stats into ``directory``."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_file(untied_state_dict(self), str(d / WEIGHTS_NAME), metadata={"policy": self.name})
        meta = {"policy": self.name, "config": self._saved_config(), "spec": asdict(self.spec)}
        (d / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
        (d / NORMALIZATION_NAME).write_text(json.dumps(self.normalization_stats(), indent=2))
        if self.processor is not None:
            self.processor.save(d)
        return d

    def _saved_config(self) -> dict[str, Any]:
        """The config as ``config.json`` records it (a policy that keeps a copy of another beside its weights
        points the path at that copy)."""
        return asdict(self.config)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str = "cpu", **overrides: Any) -> Policy:
        """Load any registered policy from a directory written by ``save_pretrained``.

        The class comes from the registry by the saved ``policy`` name (a checkpoint of an older layout is
        converted first, ``policies.registry.upgrade_saved``); ``overrides`` replace fields of the saved config
        (e.g. ``likelihood="flow_noise"``, ``freeze_state_norm=True``) before the policy is built. The family
        gets the directory explicitly (``_restore``), so one that saves more than weights (tokenizers, network
        configs) rebuilds itself from its own files."""
        from safetensors.torch import load_file

        from policies.registry import policy_class

        d = Path(directory)
        name, saved, spec = _read_saved(d)
        klass = policy_class(name)
        if cls is not Policy and not issubclass(klass, cls):
            raise CheckpointError(f"'{d}' holds a '{name}' policy, not a {cls.__name__}")
        known = {f.name for f in fields(klass.config_class)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"from_pretrained overrides {unknown} are not fields of {klass.config_class.__name__}; "
                             f"known: {sorted(known)}")
        config = _dataclass_from_dict(klass.config_class, {**saved["config"], **overrides})
        policy = klass._restore(config, spec, d)
        if Processor.exists(d):  # the saved steps replace the ones the family built (same layout, saved stats)
            processor = Processor.load(d)
            processor.check(spec)
            policy.processor = processor
        try:
            state = load_file(str(d / WEIGHTS_NAME), device=map_location)
        except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
            raise CheckpointError(f"checkpoint file '{d / WEIGHTS_NAME}' cannot be read ({e}); restore it or "
                                  f"use another checkpoint") from None
        policy.load_state_dict(state)
        return policy

    @staticmethod
    def saved_spec(directory: str | os.PathLike) -> PolicySpec:
        """The spec a checkpoint directory was saved with (its cameras, its instruction), read from its config
        without building the policy or reading its weights."""
        return _read_saved(Path(directory))[2]

    @classmethod
    def _restore(cls, config: Any, spec: PolicySpec, directory: Path) -> Policy:
        """Build the policy a checkpoint directory holds, before its weights load. Families whose checkpoints
        carry more than weights (processor files, a frozen base) take ``directory`` here, as an argument."""
        return cls(config, spec)


def _dataclass_from_dict(klass: type, data: dict[str, Any]):
    names = {f.name for f in fields(klass)}
    return klass(**{k: v for k, v in data.items() if k in names})


def as_float_tensor(x: Any, device: torch.device | str = "cpu") -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    return torch.as_tensor(x, dtype=torch.float32, device=device)
