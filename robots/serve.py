"""Serve a saved policy: ``python -m robots.serve checkpoint=<policy dir> [host=127.0.0.1] [port=8000]
[max_clients=64] [max_batch=64] [max_message_mb=<derived>]``.

Clients: ``robots.policy_client.PolicyClient`` or openpi's ``WebsocketClientPolicy``; ``GET /healthz``
answers 200 while the server is up, ``GET /metrics`` gives the counters and latency percentiles.
The shared secret is read from the environment, ``VLARL_POLICY_API_KEY=<key>``, never from the command
line (where every user of the machine could read it in the process list).
"""

from __future__ import annotations

import logging
import os
import sys

from robots.policy_client import API_KEY_ENV
from robots.policy_server import serve_checkpoint

USAGE = ("usage: python -m robots.serve checkpoint=<policy dir> [host=127.0.0.1] [port=8000] [max_clients=64] "
         f"[max_batch=64] [max_message_mb=<derived from the policy>]  (API key: {API_KEY_ENV}=<key>)")
INT_KEYS = {"port": (0, 65535, "0 = any free port"), "max_clients": (1, 100_000, "connections served at once"),
            "max_batch": (1, 100_000, "observations per request")}


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv) if "=" in a)
    unknown = sorted(set(args) - {"checkpoint", "host", *INT_KEYS, "max_message_mb"})
    if "checkpoint" not in args or unknown:
        print(f"{USAGE}{f' (unknown keys {unknown})' if unknown else ''}", file=sys.stderr)
        return 2
    limits: dict = {}
    for key, (low, high, what) in INT_KEYS.items():
        value = args.get(key, {"port": "8000", "max_clients": "64", "max_batch": "64"}[key])
        if not value.isdigit() or not low <= int(value) <= high:
            print(f"robots.serve: error: {key}='{value}' must be an integer in [{low}, {high}] ({what})", file=sys.stderr)
            return 2
        limits[key] = int(value)
    port = limits.pop("port")
    if "max_message_mb" in args:
        try:
            mb = float(args["max_message_mb"])
        except ValueError:
            mb = -1.0
        if not 0 < mb <= 4096:
            print(f"robots.serve: error: max_message_mb='{args['max_message_mb']}' must be a number in (0, 4096] "
                  "(largest request in MiB; leave it out to derive it from the policy)", file=sys.stderr)
            return 2
        limits["max_message_bytes"] = int(mb * 2**20)
    limits["api_key"] = os.environ.get(API_KEY_ENV) or None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host = args.get("host", "127.0.0.1")
    if limits["api_key"] is None and host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("robots.serve").warning(
            "serving on %s without an API key: anyone who reaches this port can drive the policy; set %s=<key>",
            host, API_KEY_ENV)
    try:
        serve_checkpoint(args["checkpoint"], host=host, port=port, **limits)
    except (OSError, ValueError) as exc:  # a bad checkpoint (named file), a bad port, a port in use, a bad key
        msg = str(exc).strip().splitlines()
        print(f"robots.serve: error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
