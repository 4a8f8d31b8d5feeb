"""Weight sync over a torch.distributed group (Gloo on CPUs, NCCL on GPUs) instead of the object store.

``placement.weight_sync=collective``: the actor (rank 0) and the rollout workers (ranks 1..R) join one
process group at start-up; each sync the actor broadcasts the policy version and then the synced tensors
(trainable parameters and buffers, the same set as ``ActorWorker.sync_weights``), packed into one flat
buffer per dtype, and every rollout worker unpacks them straight into its own parameters. Nothing passes
through the driver or the object store; on GPUs NCCL moves the buffers device to device.

The group is a standalone ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` over its own ``TCPStore``, not
torch.distributed's default group, so it never mixes with collectives the algorithms run on the default
group (e.g. global advantage normalization across data-parallel actor ranks).

NCCL needs one rank per GPU: two ranks on one device (the collocated mode puts the actor and the rollout
worker on the same GPU) make communicator set-up fail ("Duplicate GPU detected") or hang. So every rank
writes the identity of its device (the GPU's UUID) into the store at join, all ranks read all of them, and
all pick the same backend: NCCL only when every rank holds a CUDA device and no two hold the same one,
else Gloo (which also broadcasts CUDA tensors, staged through the host).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

WEIGHT_SYNC = ("object_store", "collective")


def node_address() -> tuple[str, int]:
    """(IP of this node, a free TCP port on it): the group's rendezvous, called inside the rank-0 worker."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return ip, int(s.getsockname()[1])


def device_identity(device: torch.device) -> str:
    """What tells two ranks' devices apart across processes: the GPU's UUID (physical, whatever
    ``CUDA_VISIBLE_DEVICES`` renumbered), else host + index; ``"cpu"`` for a CPU device."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return f"gpu-{uuid}" if uuid is not None else f"{socket.gethostname()}/cuda:{device.index or 0}"


def pick_backend(identities: list[str]) -> str:
    """``nccl`` when every rank holds its own GPU, else ``gloo`` (a CPU rank, or two ranks on one GPU)."""
    if any(i == "cpu" for i in identities) or len(set(identities)) < len(identities):
        return "gloo"
    return "nccl"


class WeightGroup:
    """This process's membership of the weight group (rank 0 sends)."""

    def __init__(self, address: tuple[str, int], rank: int, world_size: int, device: torch.device):
        timeout = timedelta(minutes=5)
        self.device = torch.device(device)
        self.store = dist.TCPStore(address[0], address[1], world_size, rank == 0, timeout=timeout)
        self.store.set(f"device/{rank}", device_identity(self.device))
        self.identities = [self.store.get(f"device/{r}").decode() for r in range(world_size)]  # waits for all
        self.backend = pick_backend(self.identities)
        if self.backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size)
        else:
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()


def join(address: tuple[str, int], rank: int, world_size: int, device: torch.device) -> WeightGroup:
    """Join the weight group (blocks until all ranks have joined)."""
    return WeightGroup(address, rank, world_size, device)


def _groups(tensors: dict[str, torch.Tensor]) -> dict[torch.dtype, list[str]]:
    out: dict[torch.dtype, list[str]] = {}
    for k in sorted(tensors):
        out.setdefault(tensors[k].dtype, []).append(k)
    return out


def send(group: WeightGroup, tensors: dict[str, torch.Tensor], version: int) -> None:
    """Rank 0: broadcast ``version`` then ``tensors`` (one flat buffer per dtype, keys in sorted order)."""
    group.broadcast(torch.tensor([version], dtype=torch.int64, device=group.device))
    for _, keys in sorted(_groups(tensors).items(), key=lambda kv: str(kv[0])):
        group.broadcast(torch.cat([tensors[k].detach().reshape(-1).to(group.device) for k in keys]))


def receive(group: WeightGroup, into: dict[str, torch.Tensor]) -> int:
    """Ranks > 0: receive the version and the tensors, copied in place into ``into`` (same keys, shapes and
    dtypes as the sender's); returns the version."""
    v = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(v)
    with torch.no_grad():
        for dtype, keys in sorted(_groups(into).items(), key=lambda kv: str(kv[0])):
            flat = torch.empty(sum(into[k].numel() for k in keys), dtype=dtype, device=group.device)
            group.broadcast(flat)
            for k, part in zip(keys, flat.split([into[k].numel() for k in keys]), strict=True):
                into[k].copy_(part.view_as(into[k]))
    return int(v.item())


__all__ = ["WEIGHT_SYNC", "WeightGroup", "device_identity", "join", "node_address", "pick_backend", "receive", "send"]
