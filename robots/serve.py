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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        serve_checkpoint(args["checkpoint"], host=args.get("host", "127.0.0.1"), port=int(args.get("port", 8000)))
    except (FileNotFoundError, ValueError) as exc:
        print(f"robots.serve: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
