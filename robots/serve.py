"""Serve a saved policy: ``python -m robots.serve checkpoint=<policy dir> [host=127.0.0.1] [port=8000]``.

Clients: ``robots.policy_client.PolicyClient`` or openpi's ``WebsocketClientPolicy``; ``GET /healthz``
answers 200 while the server is up.
"""

from __future__ import annotations

import logging
import sys

from robots.policy_server import serve_checkpoint


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv) if "=" in a)
    unknown = sorted(set(args) - {"checkpoint", "host", "port"})
    if "checkpoint" not in args or unknown:
        print(f"usage: python -m robots.serve checkpoint=<policy dir> [host=127.0.0.1] [port=8000]"
              f"{f' (unknown keys {unknown})' if unknown else ''}", file=sys.stderr)
        return 2
    port = args.get("port", "8000")
    if not port.isdigit() or int(port) > 65535:
        print(f"robots.serve: error: port='{port}' must be an integer in [0, 65535] (0 = any free port)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        serve_checkpoint(args["checkpoint"], host=args.get("host", "127.0.0.1"), port=int(port))
    except (OSError, ValueError) as exc:  # a bad checkpoint (named file), a bad port, a port in use
        msg = str(exc).strip().splitlines()
        print(f"robots.serve: error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
