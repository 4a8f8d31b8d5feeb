#!/usr/bin/env bash
# Download the Vulkan/EGL loader packages (amd64 .debs, ~1 MiB) into .gl/ (git-ignored), for a GPU image that
# lacks them (the device tool's README); scripts/gpu/env.sh unpacks them there only if libvulkan is missing.
# Carry ".gl" in every device call that simulates or renders. Uses this machine's own apt sources.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$ROOT/.gl" /tmp/amd64/partial
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
apt-get "${o[@]}" update -qq
cd "$ROOT/.gl" && apt-get "${o[@]}" download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
ls -l "$ROOT/.gl"
