"""Offscreen MuJoCo rendering settings shared by the robosuite-based simulators (robosuite, LIBERO).

Policy cameras do not need shadows, reflections or multisampling, and on a CPU (Mesa EGL/OSMesa)
they dominate the frame time: the default 4096 px shadow map renders every light's depth pass.
``fast_rendering`` turns them off on a live robosuite ``MjSim`` and rebuilds its offscreen context
so the MSAA / shadow buffers are really gone (they are sized when the context is made).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from simulators.base import EnvError

GL_BACKENDS = ("egl", "osmesa", "glfw")


@dataclass
class RenderQuality:
    """What the policy cameras render. All off by default (2-5x faster on CPU)."""

    shadows: bool = False
    reflections: bool = False
    msaa: bool = False


def select_gl_backend(requested: str = "") -> str:
    """Set ``MUJOCO_GL`` before robosuite/mujoco are imported; '' keeps the environment's choice (egl)."""
    gl = requested or os.environ.get("MUJOCO_GL", "") or "egl"
    if gl not in GL_BACKENDS:
        raise EnvError(f"env.mujoco_gl='{gl}' is unknown; use one of {GL_BACKENDS} (osmesa needs libosmesa6)")
    if "robosuite" in sys.modules and os.environ.get("MUJOCO_GL", gl) != gl:
        raise EnvError(
            f"robosuite was already imported with MUJOCO_GL={os.environ.get('MUJOCO_GL')}; "
            f"env.mujoco_gl='{gl}' must be chosen before the first MuJoCo env is made in this process"
        )
    os.environ["MUJOCO_GL"] = gl
    os.environ["PYOPENGL_PLATFORM"] = gl if gl != "glfw" else os.environ.get("PYOPENGL_PLATFORM", "")
    return gl


def apply_render_quality(sim: Any, quality: RenderQuality) -> None:
    """Apply ``quality`` to a robosuite ``MjSim`` and rebuild its offscreen render context."""
    import mujoco
    from robosuite.utils.binding_utils import MjRenderContextOffscreen

    m = sim.model._model
    if not quality.shadows:
        m.vis.quality.shadowsize = 0
        m.light_castshadow[:] = 0
    else:  # robosuite's arenas declare their lights castshadow="false": the switch turns every light's on
        m.light_castshadow[:] = 1
    if not quality.reflections:
        m.mat_reflectance[:] = 0.0
    if not quality.msaa:
        m.vis.quality.offsamples = 0
    old = sim._render_context_offscreen
    if old is not None and not quality.msaa:
        # Free the old context while *it* is current (its __del__ would free whichever is current),
        # then make a new one that is sized without MSAA / shadow buffers.
        device_id, groups = old.device_id, old.vopt.geomgroup.copy()
        release_render_context(sim)
        ctx = MjRenderContextOffscreen(sim, device_id=device_id)
        ctx.vopt.geomgroup[:] = groups
    ctx = sim._render_context_offscreen
    if ctx is not None:
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = int(quality.shadows)
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = int(quality.reflections)


def release_render_context(sim: Any) -> None:
    """Free a robosuite sim's offscreen GL context now, while it is current and the display is alive.

    robosuite frees contexts in ``__del__``, which for envs caught in reference cycles runs at
    interpreter exit after EGL is terminated (noisy EGLError tracebacks) or frees whichever context
    happens to be current (corrupt frames in the others).
    """
    ctx = getattr(sim, "_render_context_offscreen", None)
    if ctx is None:
        return
    ctx.gl_ctx.make_current()
    ctx.con.free()
    ctx.gl_ctx.free()
    sim._render_context_offscreen = None
