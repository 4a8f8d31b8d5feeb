"""Trace rollout inference and one update of a configured policy under fake tensors, and read their memory.

Why fake tensors: a published-size VLA (pi0: ~3.5 B parameters) cannot be allocated on a 24 GiB CPU machine,
but every tensor's shape, dtype and lifetime can be followed without storage. The policy is built exactly as
a run builds it (``policies.registry.make_policy`` on the meta device, as the config loader does), its
parameters are then given fake storage, and the same calls a run makes (``sample`` under ``no_grad`` on the
rollout side; ``evaluate`` + the clipped PPO loss + backward + gradient clipping + Adam on the actor side) run
under torch's own ``MemTracker``, which follows every storage through the dispatcher and files it as
parameter, buffer, gradient, activation, backward temporary or optimizer state. Sizes are rounded as the CUDA
caching allocator rounds them (512 B blocks), so the numbers are allocator bytes, the quantity
``torch.cuda.max_memory_allocated`` reports.

The trace runs on the fake CPU device: kernels whose saved tensors differ between CPU and CUDA (fused
attention backends) may make the GPU's activations differ slightly; the GPU check (docs/gpu.md) measures it.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from policies.base import ActionSample, PolicySpec

_TOTAL = "Total"  # MemTracker's key of the all-categories sum in a snapshot


class _NoHook:
    """Stands in for a gradient-hook handle of a frozen parameter (nothing to remove)."""

    def remove(self) -> None:
        return None


class FrozenAwareMemTracker(MemTracker):
    """torch's ``MemTracker`` that also accepts frozen parameters.

    ``MemTracker`` registers a gradient hook on every parameter of every module it sees, and
    ``Tensor.register_hook`` refuses a tensor that does not require gradients (a frozen VLM, LoRA's base
    weights). A frozen parameter never gets a gradient, so it is marked as hooked with a no-op handle.
    """

    def _track_module_params_and_buffers(self, module: torch.nn.Module,
                                         install_grad_hooks: bool = True) -> tuple[int, int]:
        for p in module.parameters():
            if not p.requires_grad and self._param_to_grad_hook_handles.get(p, None) is None:
                self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _update_peak_stats(self, peak_state: Any) -> None:
        """The device-wide peak only: the per-module peaks (unused here) cost a pass over every module per op,
        which made one published pi0 rollout trace take over 10 minutes."""
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL]:
                self._peak_mem[dev] = snap[_TOTAL]
                self._peak_mem_snap[dev] = dict(snap)


@dataclass
class PhaseMemory:
    """Bytes on the device during one phase, at the phase's peak, by component (they sum to ``peak``).

    ``activations`` holds what the forward saved plus backward temporaries (activation gradients) at the peak;
    ``inputs`` the observation / replay tensors the phase reads; ``start`` what was resident when the phase
    began (parameters, buffers, optimizer state, inputs), so ``peak - start`` is what the phase adds.
    """

    parameters: int
    buffers: int
    gradients: int
    optimizer: int
    activations: int
    inputs: int
    peak: int
    start: int

    @property
    def growth(self) -> int:
        return self.peak - self.start


@dataclass
class PolicyTrace:
    """One traced configuration: rollout inference of ``rollout_batch`` rows, one update of ``micro_batch`` rows."""

    rollout: PhaseMemory
    update: PhaseMemory
    rollout_batch: int
    micro_batch: int
    num_parameters: int
    trainable_parameters: int


def _phase(tracker: MemTracker) -> PhaseMemory:
    snaps = tracker.get_tracker_snapshot("peak")
    if not snaps:
        return PhaseMemory(0, 0, 0, 0, 0, 0, 0, 0)
    (snap,) = snaps.values()  # one device: everything is traced on the fake CPU device
    keys = {k.name if hasattr(k, "name") else str(k): v for k, v in snap.items()}
    return PhaseMemory(parameters=keys.get("PARAM", 0), buffers=keys.get("BUFFER", 0), gradients=keys.get("GRAD", 0),
                       optimizer=keys.get("OPT", 0), activations=keys.get("ACT", 0) + keys.get("TEMP", 0),
                       inputs=keys.get("OTH", 0), peak=snap[_TOTAL], start=0)


def _start_total(tracker: MemTracker) -> int:
    snaps = tracker.get_tracker_snapshot("current")
    return sum(s[_TOTAL] for s in snaps.values())


def probe_obs(spec: PolicySpec, batch: int) -> dict[str, Any]:
    """An observation batch of the shared schema: state float32 [B, S], images uint8 [B, H, W, 3] per camera."""
    h, w = spec.image_size or (64, 64)
    return {"state": torch.zeros(batch, spec.state_dim),
            "images": {k: torch.zeros(batch, h, w, 3, dtype=torch.uint8) for k in spec.image_keys},
            "instruction": [spec.instruction or "probe"] * batch}


class RolloutStep(torch.nn.Module):
    """Rollout inference as one root module call (``MemTracker`` attributes module calls to one root call)."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: dict[str, Any]) -> Any:
        with torch.no_grad():
            return self.policy.sample(obs)


class UpdateLoss(torch.nn.Module):
    """The loss of ``vlarl.algorithms.update.clipped_update`` for one minibatch: re-score the sampled chunk,
    chunk-level clipped surrogate (token-mean), entropy term, value loss; with the same library functions."""

    def __init__(self, policy: torch.nn.Module, clip: float = 0.2, vf_coef: float = 0.5) -> None:
        super().__init__()
        self.policy, self.clip, self.vf_coef = policy, clip, vf_coef

    def forward(self, obs: dict[str, Any], replay: dict[str, torch.Tensor], old_logprob: torch.Tensor) -> torch.Tensor:
        from vlarl.algorithms.aggregation import aggregate_loss
        from vlarl.algorithms.granularity import level_mask, reduce_logprob
        from vlarl.algorithms.losses import ppo_policy_loss_elementwise, value_loss_elementwise

        logprob, entropy, value = self.policy.evaluate(obs, replay)
        B, T, A = logprob.shape
        step_mask = torch.ones(B, T, dtype=torch.bool)
        lp = reduce_logprob(logprob, "chunk", step_mask)
        adv = torch.ones_like(lp)
        pg, _ = ppo_policy_loss_elementwise(lp, reduce_logprob(old_logprob, "chunk", step_mask), adv,
                                            self.clip, self.clip)
        loss = aggregate_loss(pg, level_mask(step_mask, "chunk", A), "token-mean")
        loss = loss - 0.0 * aggregate_loss(entropy, level_mask(step_mask, "token", A), "token-mean")
        if value is not None and value.ndim == 1:
            v = value_loss_elementwise(value, value.detach(), torch.zeros_like(value))
            loss = loss + self.vf_coef * v.mean()
        return loss


def update_step(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, obs: dict[str, Any], sample: Any,
                max_grad_norm: float) -> None:
    """One optimizer step as the actor takes it: loss, backward, gradient clipping, Adam, gradients freed."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    loss = UpdateLoss(policy)(obs, sample.replay, sample.logprob)
    loss.backward()
    if params:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_optimizer(policy: torch.nn.Module) -> torch.optim.Optimizer:
    """The actor worker's Adam (foreach) over the trainable parameters. Its state appears at the first step, and
    only for parameters that got a gradient (a trainable weight the loss never reaches, like pi0's unused expert
    ``lm_head``, has none), so callers take one real warm-up ``update_step`` before measuring."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=1e-4, eps=1e-5, foreach=True)


def trace_policy(policy_cfg: Any, spec: PolicySpec, rollout_batch: int, micro_batch: int,
                 max_grad_norm: float = 0.5) -> PolicyTrace:
    """Trace rollout inference ([rollout_batch] rows) and one steady-state update ([micro_batch] rows).

    The update is the second of two: the first, untracked, creates Adam's state (for the parameters that get a
    gradient), so the traced one starts with parameters, buffers, optimizer state and its minibatch resident, as
    every update of a run after the first.
    """
    from policies.registry import make_policy

    with torch.device("meta"):
        policy = make_policy(copy.deepcopy(policy_cfg), spec)
    n_params = sum(p.numel() for p in policy.parameters())
    n_train = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)  # value checks need values; fake has none
    try:
        with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True):
            warnings.simplefilter("ignore")  # MemTracker warns on every module freed before its backward hook
            rollout, update = _trace(policy, spec, rollout_batch, micro_batch, max_grad_norm)
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
    return PolicyTrace(rollout=rollout, update=update, rollout_batch=rollout_batch, micro_batch=micro_batch,
                       num_parameters=n_params, trainable_parameters=n_train)


def _trace(policy: torch.nn.Module, spec: PolicySpec, rollout_batch: int, micro_batch: int,
           max_grad_norm: float) -> tuple[PhaseMemory, PhaseMemory]:
    """Both phases of ``trace_policy``; runs inside its ``FakeTensorMode``."""
    _to_fake_storage(policy)
    obs = probe_obs(spec, rollout_batch)
    tracker = FrozenAwareMemTracker()
    tracker.track_external(policy, *_tensors(obs))
    start = _start_total(tracker)
    with tracker:
        sample = RolloutStep(policy)(obs)
    rollout = _phase(tracker)
    rollout.start = start
    # the update re-scores rows of that rollout: its replay, repeated or cut to micro_batch rows (a second
    # sample() would cost as much to trace as the rollout did)
    rows = torch.arange(micro_batch) % rollout_batch
    sample = ActionSample(sample.actions[rows], sample.logprob[rows], None,
                          {k: v[rows] for k, v in sample.replay.items()})
    obs = probe_obs(spec, micro_batch)
    opt = make_optimizer(policy)
    update_step(policy, opt, obs, sample, max_grad_norm)  # untracked: creates Adam's state, as a run's first update
    tracker = FrozenAwareMemTracker()
    tracker.track_external(policy, opt, *_tensors(obs), *sample.replay.values(), sample.logprob)
    start = _start_total(tracker)
    with tracker:
        update_step(policy, opt, obs, sample, max_grad_norm)
    update = _phase(tracker)
    update.start = start
    return rollout, update


def _to_fake_storage(policy: torch.nn.Module) -> None:
    """Give the meta-device parameters fake CPU storage, keeping tied weights tied.

    ``Module.to_empty`` replaces each module's parameters one by one, so a parameter two modules share (pi0's
    ``lm_head`` = its token embeddings: 527 M weights) would become two; the run builds one, so the ties are
    restored afterwards."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in policy.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((module, name))
    policy.to_empty(device="cpu")
    for shared in owners.values():
        first_module, first_name = shared[0]
        for module, name in shared[1:]:
            module._parameters[name] = first_module._parameters[first_name]


def _tensors(obs: dict[str, Any]) -> list[torch.Tensor]:
    return [obs["state"], *obs["images"].values()]


__all__ = ["FrozenAwareMemTracker", "PhaseMemory", "PolicyTrace", "RolloutStep", "UpdateLoss", "make_optimizer",
           "probe_obs", "trace_policy", "update_step"]
