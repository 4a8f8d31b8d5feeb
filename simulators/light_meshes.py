"""Lighter visual meshes for ManiSkill's CPU renderer: fewer triangles in the robot's links, the same picture.

On a machine without a GPU SAPIEN renders through a software Vulkan driver, where a picture's cost follows the
triangles drawn, not the pixels: PushCube's 64 px base camera took about 130 ms a picture here, of which the
Panda's visual meshes (about 135k triangles over its links) were nearly all; the same scene without the arm took
2 ms. A 64 px camera cannot show that detail, so ``lighten_scene`` swaps each large untextured mesh part for a
quadric-decimated copy keeping ``detail`` of its triangles (``fast_simplification``, the decimator trimesh
uses); at 0.1 a picture took about 24 ms and the images differed from ManiSkill's own by 0.46 of 255 per pixel on
average (docs/vla_pixels.md, "Lighter meshes").

What is left alone: textured parts (their UV layout would not survive decimation: the table, the floor, scanned
objects), parts under ``MIN_TRIANGLES`` (primitives, cubes, goal discs), and anything physical (collision shapes
are separate components; only the render body is replaced). Decimated meshes are cached per process by their
content and detail, so every scene of a worker shares one decimation. ``lighten_env`` applies it to a ManiSkill env
and again after each reconfiguration (a task that rebuilds its scene on reset gets light meshes every time).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: parts with at most this many triangles are kept as they are (boxes, discs, small props)
MIN_TRIANGLES = 500

_decimated: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def check_detail(detail: float) -> None:
    """One line for a share of triangles that is not one (the env's start-up check calls this)."""
    from simulators.base import EnvError

    if not 0.0 < detail <= 1.0:
        raise EnvError(f"env.mesh_detail={detail} is the share of triangles kept in the robot's visual meshes: give "
                       f"a number in (0, 1], e.g. env.mesh_detail=0.1 (1.0 keeps ManiSkill's meshes)")


def _textured(material: Any) -> bool:
    return material is not None and any(
        getattr(material, name, None) is not None
        for name in ("base_color_texture", "diffuse_texture", "normal_texture", "emission_texture",
                     "roughness_texture", "metallic_texture", "transmission_texture"))


def _decimate(vertices: np.ndarray, triangles: np.ndarray, detail: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vertices, triangles, vertex normals) of the part with ``detail`` of its triangles, cached by the part's
    content (its vertices and triangles, before the shape's scale), so a link loaded again is not decimated again."""
    key = (hash(vertices.tobytes()), hash(triangles.tobytes()), len(vertices), len(triangles), detail)
    if key not in _decimated:
        import fast_simplification
        import trimesh

        # glTF parts split their vertices along normal seams; welded first, or the decimator tears the surface apart
        welded = trimesh.Trimesh(vertices, triangles, process=True)
        v, f = fast_simplification.simplify(np.asarray(welded.vertices, np.float32),
                                            np.asarray(welded.faces, np.int64), target_reduction=1.0 - detail)
        normals = trimesh.Trimesh(v, f, process=False).vertex_normals
        _decimated[key] = (np.ascontiguousarray(v, np.float32), np.ascontiguousarray(f, np.uint32),
                           np.ascontiguousarray(normals, np.float32))
    return _decimated[key]


def _light_body(body: Any, detail: float) -> tuple[Any, int, int] | None:
    """A copy of the render body ``body`` with its large untextured mesh parts decimated, with the triangles
    before and after over those parts; None when it has none (the body is then kept)."""
    import sapien

    heavy = [s for s in body.render_shapes if isinstance(s, sapien.render.RenderShapeTriangleMesh)
             and any(len(p.triangles) > MIN_TRIANGLES and not _textured(p.material) for p in s.parts)]
    if not heavy:
        return None
    new = sapien.render.RenderBodyComponent()
    new.name = body.name
    before = after = 0
    for shape in body.render_shapes:
        if not any(shape is h for h in heavy):
            new.attach(shape.clone())
            continue
        for part in shape.parts:
            v = np.asarray(part.vertices, np.float32)
            f = np.asarray(part.triangles, np.uint32)
            if len(f) > MIN_TRIANGLES and not _textured(part.material):
                v, f, normals = _decimate(v, f, detail)
                uv = np.zeros((len(v), 2), np.float32)  # untextured: the UVs are never read
                before += len(part.triangles)
                after += len(f)
            else:
                normals = np.asarray(part.get_vertex_normal(), np.float32)
                uv = np.asarray(part.get_vertex_uv(), np.float32)
                if uv.shape != (len(v), 2):
                    uv = np.zeros((len(v), 2), np.float32)
            mesh = sapien.render.RenderShapeTriangleMesh(v, f, normals, uv, part.material)
            mesh.local_pose = shape.local_pose
            mesh.scale = shape.scale
            mesh.front_face = shape.front_face
            mesh.name = shape.name
            new.attach(mesh)
    new.visibility = body.visibility
    new.shading_mode = body.shading_mode
    if body.is_render_id_disabled:
        new.disable_render_id()
    return new, before, after


def lighten_scene(scene: Any, detail: float) -> tuple[int, int]:
    """Replace, in every sub-scene of the ManiSkill scene ``scene``, each render body holding a large untextured
    mesh part by a copy with ``detail`` of those parts' triangles. Returns the triangles of the replaced parts
    (before, after), summed over the sub-scenes."""
    import sapien

    check_detail(detail)
    before = after = 0
    if detail >= 1.0:
        return before, after
    for sub in scene.sub_scenes:
        for entity in list(sub.entities):
            for comp in list(entity.components):
                if not isinstance(comp, sapien.render.RenderBodyComponent):
                    continue
                light = _light_body(comp, detail)
                if light is None:
                    continue
                new, b, a = light
                entity.remove_component(comp)
                entity.add_component(new)
                before, after = before + b, after + a
    return before, after


def lighten_env(env: Any, detail: float) -> tuple[int, int]:
    """Light meshes in the ManiSkill env ``env`` (any wrappers) now and after every later reconfiguration (its
    ``_after_reconfigure`` runs right after the scene is rebuilt). Returns ``lighten_scene``'s count for now."""
    check_detail(detail)
    if detail >= 1.0:
        return 0, 0
    task = env.unwrapped
    after_reconfigure = task._after_reconfigure

    def relighten(options: dict) -> None:
        lighten_scene(task.scene, detail)
        after_reconfigure(options)

    task._after_reconfigure = relighten
    return lighten_scene(task.scene, detail)
