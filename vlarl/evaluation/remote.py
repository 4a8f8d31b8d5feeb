"""Evaluate a policy that runs behind a policy server (``vlarl-eval checkpoint=ws://host:port``).

``RemotePolicy`` speaks the openpi-style websocket + msgpack-numpy protocol of ``robots.policy_server``
through ``robots.policy_client``: one batched request per chunk step (``state [B, D]``, images
``[B, H, W, 3]``, one prompt per env) -> ``actions [B, T, A]``. The server's metadata (dims, cameras,
chunk size) stands in for the checkpoint's ``PolicySpec``, so the same compatibility checks run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch

from policies.base import CheckpointError


@dataclass
class RemoteSpec:
    state_dim: int
    action_dim: int
    image_keys: list[str] = field(default_factory=list)
    task: str = ""
    instruction: str = ""


def is_server_address(checkpoint: str) -> bool:
    return checkpoint.startswith(("ws://", "wss://"))


class RemotePolicy:
    """A policy reached over the network; only the deterministic ``act`` path exists remotely."""

    def __init__(self, address: str, connect_timeout: float = 10.0):
        url = urlparse(address)
        if not url.hostname or not url.port:
            raise CheckpointError(f"checkpoint='{address}' is not a server address; use ws://<host>:<port>")
        from robots.policy_client import PolicyClient

        try:
            self.client = PolicyClient(url.hostname, url.port, connect_timeout=connect_timeout)
        except ConnectionError as e:
            raise CheckpointError(str(e)) from e
        meta = self.client.metadata
        self.address = address
        self.name = f"remote:{meta.get('policy', '?')}"
        self.chunk_size = int(meta["chunk_size"])
        self.spec = RemoteSpec(int(meta["state_dim"]), int(meta["action_dim"]), list(meta.get("image_keys", [])),
                               instruction=str(meta.get("instruction", "")))

    def eval(self) -> RemotePolicy:
        return self

    def act(self, obs: dict[str, Any]) -> torch.Tensor:
        state = np.asarray(torch.as_tensor(obs["state"], dtype=torch.float32).cpu(), dtype=np.float32)
        images = {k: np.asarray(torch.as_tensor(v).cpu(), dtype=np.uint8) for k, v in obs.get("images", {}).items()
                  if k in self.spec.image_keys}
        from robots.policy_client import PolicyServerError

        try:
            reply = self.client.infer({"state": state, "images": images, "prompt": list(obs.get("instruction", []))})
        except PolicyServerError as e:  # the server's own one-line answer (its first line if it sent more)
            first = (str(e).strip().splitlines() or ["no message"])[0].rstrip(":")
            raise CheckpointError(f"policy server {self.address} could not act: {first}") from e
        return self.check_actions(reply.get("actions"), state.shape[0])

    def check_actions(self, actions: Any, batch: int) -> torch.Tensor:
        """The server's reply as ``[B, T, A]``, or one line naming what is wrong with it."""
        want = (batch, self.chunk_size, self.spec.action_dim)
        try:
            a = np.array(actions, dtype=np.float32)
        except (TypeError, ValueError):
            a = None
        if a is None or a.size != int(np.prod(want)):
            got = "no actions" if a is None else f"actions of shape {a.shape}"
            raise CheckpointError(f"policy server {self.address} replied with {got}, expected {batch} x "
                                  f"chunk {self.chunk_size} x action_dim {self.spec.action_dim} as its metadata "
                                  "says; restart the server with the checkpoint it should serve")
        if not np.isfinite(a).all():
            raise CheckpointError(f"policy server {self.address} replied with non-finite actions (NaN/inf); "
                                  "check the served checkpoint's weights and normalization statistics")
        return torch.from_numpy(a.reshape(want))

    def sample(self, obs: dict[str, Any]) -> Any:
        raise CheckpointError("a policy server serves only deterministic actions; evaluate it with deterministic=true")

    def close(self) -> None:
        self.client.close()
