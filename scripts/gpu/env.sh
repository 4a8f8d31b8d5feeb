# Source on the GPU machine (device tool `run`) before any vlarl command there:
#   source scripts/gpu/env.sh
# vlarl from this checkout, the carried wheels from the target folder run_gpu_tests.sh installs into, the
# Hugging Face libraries offline, and the Vulkan/EGL loaders carried in .gl/ (scripts/gpu/prepare_gl.sh) when
# the image lacks them, pointed at NVIDIA's driver (what SAPIEN renders and simulates with).
_VLARL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VLARL_SITE="${VLARL_SITE:-/tmp/vlarl_site}"
export PYTHONPATH="$_VLARL_ROOT:$VLARL_SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$VLARL_SITE/bin:$PATH"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -d "$_VLARL_ROOT/.gl" ] && [ "${VLARL_DRY_RUN:-0}" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1; then
  for _f in "$_VLARL_ROOT"/.gl/*.deb; do dpkg -x "$_f" /; done
  ldconfig
fi
# SAPIEN's GPU PhysX library (physx_cuda) is downloaded on first use, which the GPU machine cannot do: carry
# gpu_wheels/physx/<physx version>/libPhysXGpu_64.so (copied from ~/.sapien/physx/ of a machine that ran
# physx_cuda once) and it is put where SAPIEN looks.
if [ -d "$_VLARL_ROOT/gpu_wheels/physx" ] && [ "${VLARL_DRY_RUN:-0}" = 0 ]; then
  mkdir -p "$HOME/.sapien" && cp -r "$_VLARL_ROOT/gpu_wheels/physx" "$HOME/.sapien/"
fi
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
