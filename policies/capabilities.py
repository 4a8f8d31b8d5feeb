"""What only some policies can do, declared as ``typing.Protocol``s and checked when a run's config loads.

Every policy can ``sample`` / ``evaluate`` / ``act`` (``policies.base.Policy``). Some can do more, and an
algorithm or tool that relies on more says so by naming a ``Capability`` here instead of probing the policy
with ``getattr`` at run time:

* ``REPARAMETERIZED`` (SAC, RLPD, DSRL's noise actor, offline IQL): ``rsample(obs) -> (actions [B, T, A],
  logprob [B, T, A])`` with gradients through the sample, tanh-squashed into the action box (``squash``);
* ``NOISE_STEERING`` (DSRL): ``decode(obs, noise [B, T, M]) -> actions [B, T, A]`` through a frozen base, and
  ``noise_spec`` (the box the noise lives in, a ``PolicySpec``);
* ``CRITIC_IMAGE_ENCODER`` (pixel SAC): ``critic_encoder() -> nn.Module`` mapping ``obs -> features [B, F]``
  for off-policy critics, optionally ``critic_image_keys`` (which cameras it reads; default all);
* ``SFT``: ``sft_loss(obs, actions [B, T, A]) -> scalar`` (behaviour cloning, ``vlarl.data.sft``);
* ``BinnedValueConfig`` (PPO's ``value_loss=hl_gauss``): a policy *config* that can ask for a binned value head;
* ``LoRAAdapted`` (export's merge): a policy *config* whose family fine-tunes through LoRA adapters;
* ``INSTRUCTION_TOKENS`` (export of a VLM policy): the instruction is tokenized once, outside the traced
  graph, and the policy can be told to use those tokens (``instruction_tokens`` / ``fixed_instruction``).

The checks are structural (``runtime_checkable`` Protocols): a policy class has a capability by having the
methods, not by inheriting from a marker. ``Capability.families()`` lists the registered policy families whose
class (or a class their construction returns, i.e. a subclass) has the methods, so a refusal can name them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class ReparameterizedSampling(Protocol):
    """SAC's actor: a sample with gradients, squashed into the action box when ``squash`` is true."""

    squash: bool

    def rsample(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions [B, T, A] in env units, log-prob [B, T, A]) with gradients through the sample."""
        ...


@runtime_checkable
class NoiseSteering(Protocol):
    """DSRL's policy: a noise actor whose chosen initial noise a frozen base decodes into actions."""

    noise_spec: Any  # a PolicySpec: the noise box [-bound, bound]^(T x M) the noise actor acts in

    def decode(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """noise [B, T, M] -> the frozen base's deterministic action chunk [B, T, A]."""
        ...


@runtime_checkable
class CriticImageEncoder(Protocol):
    """A policy that gives off-policy critics an image encoder of their own (trained by the critic loss)."""

    def critic_encoder(self) -> nn.Module:
        """A fresh module ``obs -> features [B, F]`` with ``image_keys`` and ``out_dim`` attributes."""
        ...


@runtime_checkable
class SelectsCriticCameras(Protocol):
    """A ``CriticImageEncoder`` whose critics read only some cameras (OpenVLA-OFT's first ``num_images``)."""

    @property
    def critic_image_keys(self) -> list[str]: ...


@runtime_checkable
class SupportsSFT(Protocol):
    """Behaviour cloning on demonstration chunks."""

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Scalar loss of imitating ``actions`` [B, T, A] (env units) from ``obs``."""
        ...


@runtime_checkable
class InstructionTokens(Protocol):
    """A VLM policy that tokenizes its instruction in Python: export tokenizes once and traces the rest."""

    def instruction_tokens(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [batch, L], attention mask [batch, L]) of the instructions."""
        ...

    def fixed_instruction(self, ids: torch.Tensor, mask: torch.Tensor) -> contextlib.AbstractContextManager[None]:
        """Within the context, every forward uses ``ids`` / ``mask`` (expanded to the batch) as its text."""
        ...


@runtime_checkable
class BinnedValueConfig(Protocol):
    """A policy config that can ask for a binned (HL-Gauss) value head: ``value_bins`` K >= 2 bins over
    ``[value_min, value_max]`` (``policies.value_head``); the families that only build a scalar head lack it."""

    value_bins: int
    value_min: float
    value_max: float
    value_sigma_ratio: float


@runtime_checkable
class LoRAAdapted(Protocol):
    """A policy config whose family can fine-tune through LoRA adapters (``lora``: a dataclass with ``rank``;
    the VLM families); export merges them and records ``rank=0``."""

    lora: Any


class FixedInstructionTokens:
    """Mixin giving ``InstructionTokens`` to a policy whose tokenizer is its ``_text(instructions, batch)``
    method (``policies.vlm.policy_base.VLAPolicy`` and every VLM family under it, OpenVLA's and the exact flow
    model's overrides included): the one place outside those classes that knows that method's name."""

    def instruction_tokens(self, instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._text(instructions, batch)  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def fixed_instruction(self, ids: torch.Tensor, mask: torch.Tensor) -> Iterator[None]:
        def fixed(_instructions: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
            return ids.expand(batch, -1), mask.expand(batch, -1)

        self._text = fixed  # an instance attribute shadows the class's tokenizer for this context only
        try:
            yield
        finally:
            del self._text


@dataclass(frozen=True)
class Capability:
    """One capability: its Protocol, what it means in words, and (for a capability a config switches on)
    the instance-level condition and the override that turns it on.

    ``name``: the capability's short name in messages; ``protocol``: the structural check; ``meaning``: the
    methods, for a reader of the refusal; ``enabled(policy)``: true when a built policy has it switched on
    (default: always); ``switch``: the override that switches it on (e.g. ``policy.squash=true``), or ""."""

    name: str
    protocol: type
    meaning: str
    enabled: Callable[[Any], bool] | None = None
    switch: str = ""

    def held_by(self, policy: Any) -> bool:
        """True when the built ``policy`` has the methods and the capability is switched on."""
        return isinstance(policy, self.protocol) and (self.enabled is None or bool(self.enabled(policy)))

    def families(self) -> list[str]:
        """Registered policy families whose class, or a subclass their construction may return, has the methods."""
        from policies.registry import available_policies, policy_class

        return [name for name in available_policies() if _any_class_has(policy_class(name), self.protocol)]

    def refusal(self, policy: Any, needed_by: str) -> str | None:
        """One line naming the missing capability and the families that have it, or None when ``policy`` has it."""
        if self.held_by(policy):
            return None
        name = policy.name  # the registered family (``register_policy`` sets it on the class)
        if isinstance(policy, self.protocol) and self.switch:
            return f"{needed_by} needs {self.name} ({self.meaning}), which policy={name} has switched off: set {self.switch}"
        switch = f" with {self.switch}" if self.switch else ""
        return (f"{needed_by} needs {self.name} ({self.meaning}), which policy={name} does not have; policies that "
                f"have it: {', '.join(f'policy={f}' for f in self.families()) or 'none registered'}{switch}")


def _any_class_has(cls: type, protocol: type) -> bool:
    """The class or one of its subclasses has every method of ``protocol`` (data members are instance state)."""
    methods = [m for m in _protocol_members(protocol) if callable(getattr(protocol, m, None))
               or isinstance(getattr(protocol, m, None), property)]
    stack = [cls]
    while stack:
        c = stack.pop()
        if all(hasattr(c, m) for m in methods):
            return True
        stack.extend(c.__subclasses__())
    return False


def _protocol_members(protocol: type) -> list[str]:
    return sorted(n for n in vars(protocol) if not n.startswith("_")) + [
        n for n in getattr(protocol, "__annotations__", {}) if not n.startswith("_")]


REPARAMETERIZED = Capability("reparameterized sampling", ReparameterizedSampling,
                             "rsample(obs) with a tanh-squashed chunk", enabled=lambda p: p.squash,
                             switch="policy.squash=true")
NOISE_STEERING = Capability("noise steering", NoiseSteering, "decode(obs, noise) through a frozen base, noise_spec")
CRITIC_IMAGE_ENCODER = Capability("a critic image encoder", CriticImageEncoder, "critic_encoder() -> obs features")
SFT = Capability("supervised fine-tuning", SupportsSFT, "sft_loss(obs, actions)")
INSTRUCTION_TOKENS = Capability("instruction tokens", InstructionTokens,
                                "instruction_tokens(instructions, batch), fixed_instruction(ids, mask)")

CAPABILITIES: tuple[Capability, ...] = (REPARAMETERIZED, NOISE_STEERING, CRITIC_IMAGE_ENCODER, SFT,
                                        INSTRUCTION_TOKENS)


def critic_cameras(policy: Any) -> list[str]:
    """The cameras off-policy critics read: a ``CriticImageEncoder``'s ``critic_image_keys`` where it selects
    them, else all of ``policy.spec.image_keys``; none for a policy without a critic encoder (the critics then
    read the raw state)."""
    if not isinstance(policy, CriticImageEncoder):
        return []
    if isinstance(policy, SelectsCriticCameras):
        return list(policy.critic_image_keys)
    return list(policy.spec.image_keys)


__all__ = ["BinnedValueConfig", "CAPABILITIES", "CRITIC_IMAGE_ENCODER", "INSTRUCTION_TOKENS", "NOISE_STEERING", "REPARAMETERIZED", "SFT",
           "Capability", "CriticImageEncoder", "FixedInstructionTokens", "InstructionTokens", "LoRAAdapted", "NoiseSteering",
           "ReparameterizedSampling", "SelectsCriticCameras", "SupportsSFT", "critic_cameras"]
