"""The wheels the ManiSkill call of the GPU plan carries, cut to what state/RGB PushCube and PickCube load.

    python scripts/gpu_maniskill_carry.py --download --out gpu_wheels/ms     # here, with the package registry
    python scripts/gpu_maniskill_carry.py --wheels DIR --out gpu_wheels/ms   # from wheels already downloaded

The GPU image has CUDA torch, numpy, scipy, h5py, lxml, networkx, requests, matplotlib, opencv (headless),
huggingface_hub and pyyaml, but not ManiSkill, SAPIEN, gymnasium and their small needs (``PACKAGES``, pinned
to what CI runs). Whole, they are ~180 MiB; a device call carries 64 MiB with the working tree. Three wheels
are most of it, and most of each is data these runs never open (``DROP``):

* mani-skill: the robots other than the Panda (and the Panda's camera/humanoid add-ons), the ray-tracing
  environment maps, the old ManiSkill2 scene, and the scene data of ReplicaCAD, RoboCasa, AI2-THOR and the kitchen counter (the Python
  modules stay: only their data files go);
* sapien: the CUDA device module of Open Image Denoise (opened only when the ray tracer denoises on a GPU;
  its 16.5 MiB core stays, the renderer library needs it to load), the C++ headers and the stereo-depth
  sensor's light patterns (no task here has a stereo depth camera);
* mujoco (imported by pytorch_kinematics, which ManiSkill's GPU inverse kinematics uses): its experimental
  studio UI, the Filament renderer and the interactive viewer's extension (each imported only on use).
* ray (only when its wheel is among ``--wheels``: the end-to-end carry of ``scripts/gpu/prepare_e2e.sh``): the
  jar of Java workers and the dashboard's built web UI (vlarl starts Python workers only, without a dashboard).

Each slimmed wheel gets a new ``RECORD`` (sha256 of what is left), so pip installs it like any wheel. The
wheels are then packed into batches ``--out``/b1, b2, ... of at most ``--batch-mib`` (default 50: 64 MiB less
the ~9.5 MiB working tree and the Vulkan loaders), each with the ``MANIFEST`` that
``scripts/gpu/run_gpu_tests.sh install`` reads (one device call per batch, back to back: the stash on the
device outlives a call while the machine is warm). Prints each wheel's size, the batches and the total.

``--dry-run DIR`` checks the cut here: this machine's installed mani_skill, sapien and mujoco are copied into DIR
without the dropped files, and state and RGB PushCube and PickCube are made and stepped from that copy.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = (
    "sapien==3.0.3 mani-skill==3.0.1 mujoco==3.17.0 gymnasium==1.4.0 farama-notifications==0.0.6 "
    "transforms3d==0.4.2 trimesh==5.2.0 dacite==1.9.2 defusedxml==0.7.1 pytorch-kinematics==0.7.6 "
    "pytorch-seed==0.2.0 arm-pytorch-utilities==0.5.0 ipython==9.18.1 traitlets==5.16.1 matplotlib-inline==0.2.2 "
    "pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 "
    "pure-eval==0.2.4 wcwidth==0.9.4 pyperclip==1.11.0 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 "
    "importlib-resources==7.1.0"
).split()
KEEP_ROBOT = "mani_skill/assets/robots/panda/"
DROP = {  # wheel name prefix -> (path prefixes dropped, path prefixes kept inside them, suffixes kept)
    "mani_skill-": (("mani_skill/assets/robots/", "mani_skill/assets/environment_maps/",
                     "mani_skill/assets/maniskill2-scene-2.glb",
                     "mani_skill/utils/scene_builder/replicacad/", "mani_skill/utils/scene_builder/robocasa/",
                     "mani_skill/utils/scene_builder/ai2thor/", "mani_skill/utils/scene_builder/kitchen_counter/"),
                    (KEEP_ROBOT,), (".py",)),
    "sapien-": (("sapien/oidn_library/libOpenImageDenoise_device_cuda", "sapien/include/", "sapien/sensor/assets/"),
                (), ()),
    "mujoco-": (("mujoco/experimental/", "mujoco/_render_filament.", "mujoco/_simulate."), (), (".py",)),
    # Ray (scripts/gpu/prepare_e2e.sh): the Java workers' jar (30.7 of its 75.6 MiB) and the dashboard's web UI
    "ray-": (("ray/jars/", "ray/dashboard/client/build/"), (), ()),
}
PANDA_EXTRAS = ("realsense2_description/", "sciurus17_description/")
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            "--abi", "abi3", "--abi", "none"] + [x for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                                         "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                                                 for x in ("--platform", p)]


def dropped(wheel: str, path: str) -> bool:
    """Does ``path`` (inside wheel file ``wheel``) go? See ``DROP``."""
    for prefix, (drop, keep, suffixes) in DROP.items():
        if not wheel.startswith(prefix):
            continue
        if path.startswith(KEEP_ROBOT):
            return any(path.startswith(KEEP_ROBOT + x) for x in PANDA_EXTRAS)
        if any(path.startswith(k) for k in keep) or path.endswith(suffixes or ("\0",)):
            return False
        return any(path.startswith(d) for d in drop)
    return False


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(src: Path, dst: Path) -> tuple[int, int]:
    """Copy wheel ``src`` to ``dst`` without the dropped files and with a new RECORD; (files dropped, bytes)."""
    n = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        record_name = next(i.filename for i in zin.infolist() if i.filename.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if info.filename == record_name or info.is_dir():
                continue
            if dropped(src.name, info.filename):
                n += 1
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            lines.append(_record_line(info.filename, data))
        zout.writestr(record_name, "\n".join([*lines, f"{record_name},,"]) + "\n")
    return n, dst.stat().st_size


def build(wheels: Path, out: Path) -> list[tuple[str, int, int]]:
    """Every wheel of ``wheels`` into ``out`` (slimmed where ``DROP`` says): [(name, files dropped, bytes)]."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for w in sorted(wheels.glob("*.whl")):
        if any(w.name.startswith(p) for p in DROP):
            n, size = slim(w, out / w.name)
        else:
            (out / w.name).write_bytes(w.read_bytes())
            n, size = 0, w.stat().st_size
        rows.append((w.name, n, size))
    return rows


CHECK = """
import sys, torch
from vlarl import system_env
system_env.apply()  # the Vulkan driver scripts/setup.sh found (CPU machines)
from simulators.maniskill_gpu import ManiSkillGPUConfig, ManiSkillGPUEnv
for task in ("PushCube-v1", "PickCube-v1"):
    for obs in ("state", "rgb"):
        env = ManiSkillGPUEnv(ManiSkillGPUConfig(task=task, obs_mode=obs, sim_backend="cpu",
                                                 control_mode="pd_ee_delta_pos"), num_envs=1)
        env.reset(seed=0)
        r = env.chunk_step(torch.zeros(1, 4, env.spec.action_dim))
        import mani_skill, sapien
        assert mani_skill.__file__.startswith(sys.argv[1]) and sapien.__file__.startswith(sys.argv[1])
        print("ok", task, obs, tuple(r.obs["state"].shape), {k: tuple(v.shape) for k, v in r.obs["images"].items()})
        env.close()
import pytorch_kinematics  # imports mujoco
print("ok pytorch_kinematics + mujoco", pytorch_kinematics.__name__)
"""


def check_installed(site: Path) -> int:
    """Dry run on this machine: copy the installed mani_skill, sapien and mujoco without what ``DROP`` drops
    into ``site``, then make and step state and RGB PushCube and PickCube from that copy (CPU backend) in a
    child process: the cut leaves everything these runs open."""
    import importlib.util
    import shutil

    for pkg, wheel in (("mani_skill", "mani_skill-"), ("sapien", "sapien-"), ("mujoco", "mujoco-")):
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            print(f"gpu_maniskill_carry: {pkg} is not installed here (pip install -e .[maniskill])", file=sys.stderr)
            return 2
        root = Path(next(iter(spec.submodule_search_locations))).parent
        for libs in (pkg, f"{pkg}.libs"):
            for f in (root / libs).rglob("*") if (root / libs).is_dir() else ():
                rel = f.relative_to(root).as_posix()
                if f.is_file() and "__pycache__" not in rel and not dropped(wheel, rel):
                    (site / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, site / rel)
    env = {**__import__("os").environ, "PYTHONPATH": f"{site}:{Path(__file__).resolve().parents[1]}"}
    return subprocess.run([sys.executable, "-c", CHECK, str(site)], env=env, stdin=subprocess.DEVNULL).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", default=None, help="folder of downloaded cp312 wheels")
    ap.add_argument("--download", action="store_true", help="download PACKAGES (cp312 manylinux) first")
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch-mib", type=float, default=50.0)
    ap.add_argument("--dry-run", metavar="DIR", default=None,
                    help="apply the cut to this machine's installed packages in DIR and run the tasks from there")
    args = ap.parse_args(argv)
    if args.dry_run:
        return check_installed(Path(args.dry_run))
    if bool(args.wheels) == args.download or not args.out:
        print("gpu_maniskill_carry: give --out and exactly one of --wheels DIR and --download", file=sys.stderr)
        return 2
    wheels = Path(args.wheels) if args.wheels else Path(args.out).with_name(Path(args.out).name + "_full")
    if args.download:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", str(wheels),
                        *PACKAGES], check=True)
    if not wheels.is_dir() or not list(wheels.glob("*.whl")):
        print(f"gpu_maniskill_carry: no wheels in {wheels}; run with --download", file=sys.stderr)
        return 2
    out = Path(args.out)
    rows = build(wheels, out / ".all")
    for name, n, size in sorted(rows, key=lambda r: -r[2]):
        print(f"{size / 2**20:7.2f} MiB  {name}" + (f"  ({n} files dropped)" if n else ""))
    try:
        batches = pack(out / ".all", out, int(args.batch_mib * 2**20))
    except ValueError as e:
        print(f"gpu_maniskill_carry: {e}", file=sys.stderr)
        return 2
    for i, b in enumerate(batches, 1):
        print(f"batch b{i}: {sum(s for _, s in b) / 2**20:.2f} MiB, {len(b)} wheels")
    print(f"total {sum(r[2] for r in rows) / 2**20:.2f} MiB in {len(rows)} wheels, {len(batches)} batches -> {out}")
    return 0


def pack(src: Path, out: Path, cap: int) -> list[list[tuple[str, int]]]:
    """Wheels of ``src`` into ``out``/b1.. of at most ``cap`` bytes (first fit, largest first), each with the
    MANIFEST of all of them ("name 1 sha256" lines: run_gpu_tests.sh's format, no wheel cut in parts)."""
    import shutil

    files = sorted(((f.stat().st_size, f.name) for f in src.glob("*.whl")), reverse=True)
    if files and files[0][0] > cap:
        raise ValueError(f"{files[0][1]} ({files[0][0] / 2**20:.1f} MiB) is larger than a batch (--batch-mib)")
    batches: list[list[tuple[str, int]]] = []
    for size, name in files:
        for b in batches:
            if sum(s for _, s in b) + size <= cap:
                b.append((name, size))
                break
        else:
            batches.append([(name, size)])
    manifest = "".join(f"{n} 1 {hashlib.sha256((src / n).read_bytes()).hexdigest()}\n" for _, n in sorted(files,
                                                                                                         key=lambda x: x[1]))
    for d in out.glob("b[0-9]*"):
        shutil.rmtree(d)
    for i, b in enumerate(batches, 1):
        d = out / f"b{i}"
        d.mkdir(parents=True)
        (d / "MANIFEST").write_text(manifest)
        for name, _ in b:
            shutil.copy2(src / name, d / name)
    shutil.rmtree(src)
    return batches


if __name__ == "__main__":
    sys.exit(main())
