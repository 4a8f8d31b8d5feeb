"""Actor (trainer) worker: owns the trainable policy and its optimizer (a Ray actor in training).

``version`` counts updates; ``sync_weights`` hands rollout workers the trainable parameters and the
buffers (e.g. observation normalizer) tagged with that version; frozen parameters never travel.
With ``placement.weight_sync=collective`` the same tensors go out by ``broadcast_weights`` over a
torch.distributed group instead (``vlarl.scheduler.collective``; the actor is rank 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from policies.base import PolicySpec
from policies.registry import make_policy
from vlarl.algorithms.off_policy import behaviour_version_of
from vlarl.algorithms.optim_state import load_keeping_config
from vlarl.algorithms.registry import algorithm_spec
from vlarl.data.trajectory import Trajectory
from vlarl.scheduler import collective
from vlarl.scheduler.placement import WorkerPlacement, bind
from vlarl.scheduler.timeline import Spans
from vlarl.scheduler.transport import from_wire

TRAINER_STATE = "trainer_state.pt"
ALGORITHM_STATE = "algorithm_state.pt"  # AlgorithmSpec.make_state's state (replay buffer, Q nets), if any


def param_groups(policy: Any, alg_cfg: Any) -> list[dict[str, Any]]:
    """One Adam group, or two when ``algorithm.critic_lr`` > 0: the value head's own weights at critic_lr
    (``lr_scale`` keeps that ratio under lr annealing) and everything else at ``algorithm.lr``."""
    critic_lr = float(getattr(alg_cfg, "critic_lr", 0.0) or 0.0)
    params = dict(policy.named_parameters())
    if critic_lr <= 0:
        return [{"params": list(params.values())}]
    head = set(policy.value_head_parameters())
    if not head:
        raise ValueError(f"algorithm.critic_lr={critic_lr} but policy '{policy.name}' has no value-head parameters "
                         f"(names starting with {policy.value_head_prefixes}); set algorithm.critic_lr=0")
    return [{"params": [p for n, p in params.items() if n not in head]},
            {"params": [params[n] for n in sorted(head)], "lr": critic_lr, "lr_scale": critic_lr / alg_cfg.lr}]


class ActorWorker:
    def __init__(self, policy_cfg: Any, alg_cfg: Any, spec: PolicySpec, seed: int, device: str = "cpu",
                 torch_threads: int = 1, placement: WorkerPlacement | None = None):
        torch.set_num_threads(torch_threads)
        device = bind(placement) or device
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.alg = alg_cfg
        self.policy = make_policy(policy_cfg, spec).to(self.device)
        alg_spec = algorithm_spec(alg_cfg.name)
        # KL penalty target: a frozen copy of the starting weights (same seed, so also on resume)
        self.reference = None
        if alg_spec.uses_reference(alg_cfg):
            self.reference = make_policy(policy_cfg, spec).to(self.device).eval().requires_grad_(False)
            self.reference.load_state_dict(self.policy.state_dict())
        self.update_fn = alg_spec.update
        # what the algorithm keeps across updates (replay buffer, Q nets); saved with the checkpoint
        self.alg_state = alg_spec.make_state(self.policy, alg_cfg, spec) if alg_spec.make_state else None
        self.state_kwargs = {"state": self.alg_state} if self.alg_state is not None else {}
        # foreach: one kernel per step for all tensors (the CUDA default; on CPU the same numbers, faster)
        self.optimizer = torch.optim.Adam(param_groups(self.policy, alg_cfg), lr=alg_cfg.lr, eps=1e-5, foreach=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0
        self.spans = Spans("actor")

    def chunk_size(self) -> int:
        """The policy's resolved chunk (a checkpoint's own when the config says 0): what an episode horizon in
        chunk steps is computed from."""
        return int(self.policy.chunk_size)

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    def weight_keys(self) -> list[str]:
        """Names of the synced tensors: parameters with ``requires_grad`` plus buffers."""
        keep = {n for n, p in self.policy.named_parameters() if p.requires_grad}
        keep |= {n for n, _ in self.policy.named_buffers()}
        return sorted(k for k in self.policy.state_dict() if k in keep)

    def sync_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, tensors) for rollout workers: parameters with ``requires_grad`` plus buffers."""
        with self.spans("sync"):
            keep = set(self.weight_keys())
            return self.version, {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items() if k in keep}

    def weight_group_address(self) -> tuple[str, int]:
        return collective.node_address()

    def join_weight_group(self, address: tuple[str, int], world_size: int) -> str:
        """Rank 0 of the weight group (``placement.weight_sync=collective``); returns the backend."""
        self._weight_group = collective.join(address, 0, world_size, self.device)
        return self._weight_group.backend

    def broadcast_weights(self) -> int:
        """Send the version and the synced tensors to every rollout worker of the group; returns the version."""
        with self.spans("sync"):
            state = self.policy.state_dict()
            collective.send(self._weight_group, {k: state[k] for k in self.weight_keys()}, self.version)
        return self.version

    def set_lr(self, lr: float) -> None:
        """Set the policy lr (annealing); the value head's group keeps its ratio to it."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)

    def train(self, traj: Trajectory) -> dict[str, float]:
        """PPO on one rollout; then fold its observations into the normalizer (so the update used
        exactly the statistics the rollout was sampled with). ``traj`` usually arrives by reference from
        the rollout or reward worker, in wire form (numpy mapped from the object store; read, never written)."""
        traj = from_wire(traj)
        with self.spans("train"):
            self.policy.train()
            metrics = self.update_fn(self.policy, self.optimizer, traj, self.alg, self.generator,
                                     reference=self.reference, version=self.version, **self.state_kwargs)
            metrics.update(self._lag(traj))
            if traj.num_envs > 0:
                self.policy.update_normalization(traj.flat_obs())
            self.version += 1
        return metrics

    def _lag(self, traj: Trajectory) -> dict[str, float]:
        """The oldest policy version that sampled ``traj`` and how many updates it lags the weights being trained
        (0 in lock-step; 1 with ``placement.async_rollout``, whose batch was collected during the last update)."""
        v = behaviour_version_of(traj, self.version)
        if v.numel() == 0:
            return {}
        oldest = float(v.min())
        return {"behaviour_version": oldest, "policy_lag": self.version - oldest}

    def pop_spans(self):
        return self.spans.pop()

    def load_initial_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Start from saved weights (``init_from``): the policy and, with a KL penalty, its reference."""
        from vlarl.init_from import load_into_worker

        load_into_worker(self, state)

    def save_reference(self, directory: str) -> bool:
        """Write the frozen KL reference beside a checkpoint (``vlarl.checkpoint.save_reference``)."""
        from vlarl.checkpoint import save_reference

        return save_reference(self, directory)

    def load_reference(self, directory: str) -> bool:
        """Restore the KL reference saved with a checkpoint (``vlarl.checkpoint.load_reference``)."""
        from vlarl.checkpoint import load_reference

        return load_reference(self, directory)

    def save(self, directory: str, extra: dict[str, Any]) -> None:
        """Write the policy (self-describing) and the trainer state into ``directory``."""
        d = Path(directory)
        self.policy.save_pretrained(d)
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
             "torch_rng": torch.get_rng_state(), "policy_version": self.version, **extra},
            d / TRAINER_STATE,
        )
        if self.alg_state is not None:
            torch.save(self.alg_state.state_dict(), d / ALGORITHM_STATE)

    def load(self, directory: str) -> dict[str, Any]:
        """Restore the policy, optimizer, RNGs, version and algorithm state (a replay buffer) saved by ``save``;
        returns the run's fields saved beside them (iteration, env_steps, wall_s) and ``policy_version``."""
        from safetensors.torch import load_file

        d = Path(directory)
        self.policy.load_state_dict(load_file(str(d / "model.safetensors"), device=str(self.device)))
        state = torch.load(d / TRAINER_STATE, weights_only=False)
        load_keeping_config(self.optimizer, state.pop("optimizer"))  # the new lr of a resume with algorithm.lr=...
        self.generator.set_state(state.pop("generator"))
        torch.set_rng_state(state.pop("torch_rng"))
        self.version = int(state.pop("policy_version", state.get("iteration", 0)))
        if self.alg_state is not None and (d / ALGORITHM_STATE).is_file():
            self.alg_state.load_state_dict(torch.load(d / ALGORITHM_STATE, weights_only=False))
        return {**state, "policy_version": self.version}
