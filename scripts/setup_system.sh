#!/usr/bin/env bash
# System-level rendering support for the simulators.
#
# * SAPIEN (ManiSkill3) needs a Vulkan device even for state observations. Debian 12's stock
#   lavapipe (Mesa 22.3) is rejected by SAPIEN; Mesa 25's lavapipe from the bookworm-backports
#   suite works. We download it with `apt-get download` into a private folder (no change to the
#   system's apt sources) and point VK_ICD_FILENAMES at its ICD json through an env file.
# * MuJoCo renders offscreen with EGL (Mesa) or OSMesa.
#
# Only does work where no working Vulkan device is found: a GPU machine or a newer
# distribution needs nothing. The apt mirror is read from the system's own apt sources.
#
# Output: $VLARL_SYSTEM_DIR/env.sh (default .vlarl-system/env.sh) to be sourced before running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SYS_DIR="${VLARL_SYSTEM_DIR:-$ROOT/.vlarl-system}"
mkdir -p "$SYS_DIR"
ENV_FILE="$SYS_DIR/env.sh"
: > "$ENV_FILE"

log() { echo "[setup_system] $*" >&2; }

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }

# --- base packages: Vulkan loader, EGL/OSMesa for MuJoCo, ffmpeg-free video via imageio-ffmpeg ---
NEED=()
for p in libvulkan1 libegl1 libegl-mesa0 libgl1-mesa-dri libgl1 libosmesa6 libglvnd0; do
  have_pkg "$p" || NEED+=("$p")
done
if [ "${#NEED[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    log "installing ${NEED[*]}"
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${NEED[@]}" >/dev/null
  else
    log "WARNING: cannot install ${NEED[*]} (no apt-get); rendering may fail"
  fi
fi

# --- does a working Vulkan device exist already? (checked the way SAPIEN uses it) ---
vulkan_ok() {
  local py="${VLARL_PYTHON:-python3}"
  "$py" - <<'EOF' >/dev/null 2>&1
import sys
try:
    import sapien
except Exception:
    sys.exit(2)
try:
    sapien.render.RenderSystem()
except Exception:
    sys.exit(1)
EOF
}

# no mesa folder (a machine with its own Vulkan device) is no ICD, not an error under pipefail
find_lvp_icd() { find "$SYS_DIR/mesa" -name 'lvp_icd*.json' 2>/dev/null | head -n1 || true; }

if [ -z "$(find_lvp_icd)" ]; then
  if vulkan_ok; then
    log "a working Vulkan device exists; nothing to do for SAPIEN"
  else
    . /etc/os-release
    if [ "${ID:-}" != "debian" ]; then
      log "no working Vulkan device and this is not Debian (${ID:-unknown}); install a Vulkan driver (e.g. mesa-vulkan-drivers >= 24) yourself"
    else
      CODENAME="${VERSION_CODENAME:-bookworm}"
      # Mirror URI taken from the system's own apt configuration (deb822 or one-line format).
      MIRROR="$(grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)"
      if [ -z "$MIRROR" ]; then
        MIRROR="$(grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v security | awk '{for(i=2;i<=NF;i++) if ($i ~ /^(https?|file):/) {print $i; exit}}' | head -n1 || true)"
      fi
      if [ -z "$MIRROR" ]; then
        log "ERROR: could not find a Debian mirror in /etc/apt sources"; exit 1
      fi
      APT_DIR="$SYS_DIR/apt"
      mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$SYS_DIR/debs" "$SYS_DIR/mesa"
      echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR ${CODENAME}-backports main" > "$APT_DIR/sources.list"
      echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR ${CODENAME} main" >> "$APT_DIR/sources.list"
      APT_OPTS=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o "Dir::Etc::sourceparts=-"
                -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
                -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
      log "fetching Mesa lavapipe from ${CODENAME}-backports into $SYS_DIR (system apt sources untouched)"
      apt-get "${APT_OPTS[@]}" update -qq
      (cd "$SYS_DIR/debs" && apt-get "${APT_OPTS[@]}" download -qq "mesa-vulkan-drivers/${CODENAME}-backports")
      # pull in the LLVM the driver links against, whatever its version is
      LLVM_DEP="$(dpkg-deb -f "$SYS_DIR"/debs/mesa-vulkan-drivers_*.deb Depends | tr ',' '\n' | grep -o 'libllvm[0-9]*' | head -n1 || true)"
      if [ -n "$LLVM_DEP" ] && ! ls "$SYS_DIR"/debs/${LLVM_DEP}_*.deb >/dev/null 2>&1; then
        (cd "$SYS_DIR/debs" && apt-get "${APT_OPTS[@]}" download -qq "$LLVM_DEP")
      fi
      for deb in "$SYS_DIR"/debs/*.deb; do dpkg -x "$deb" "$SYS_DIR/mesa"; done
    fi
  fi
fi

ICD="$(find_lvp_icd)"
if [ -n "$ICD" ]; then
  # Make the private ICD use its own library path, and its own libLLVM/libdrm.
  LIBDIR="$(dirname "$(find "$SYS_DIR/mesa" -name 'libvulkan_lvp.so' | head -n1)")"
  PRIV_LD="$(find "$SYS_DIR/mesa" -name 'libLLVM*.so*' -printf '%h\n' | head -n1)"
  PRIV_LD="${PRIV_LD:-$LIBDIR}"
  FIXED_ICD="$SYS_DIR/lvp_icd.json"
  sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$LIBDIR/libvulkan_lvp.so\"#" "$ICD" > "$FIXED_ICD"
  {
    echo "export VK_ICD_FILENAMES=\"$FIXED_ICD\""
    echo "export LD_LIBRARY_PATH=\"$PRIV_LD\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  } >> "$ENV_FILE"
  log "Vulkan: lavapipe at $FIXED_ICD"
fi
echo 'export MUJOCO_GL="${MUJOCO_GL:-egl}"' >> "$ENV_FILE"
echo 'export PYOPENGL_PLATFORM="${PYOPENGL_PLATFORM:-egl}"' >> "$ENV_FILE"
log "wrote $ENV_FILE"
