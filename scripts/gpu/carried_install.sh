# Sourced by the device calls that carry their wheels in batches, one per call (maniskill_call.sh, e2e_call.sh),
# after they set DRY (an array: (--dry-run) or empty) and cd to the repository root:
#   gpu_carried_install <label> <stash folder under /tmp> <wheel dir> <what to carry next>
# stashes and installs this call's batch with run_gpu_tests.sh (dry run: into temp folders), and ends the call
# with exit 3 and one line naming the next carry while a wheel is still missing.
gpu_carried_install() {
  local label="$1" stash="$2" wheels="$3" next="$4" rc
  if [ "${#DRY[@]}" = 1 ]; then
    OUT="${OUT:-$(mktemp -d)}"; export VLARL_STASH="${VLARL_STASH:-$(mktemp -d)/stash}"
    export VLARL_SITE="${VLARL_SITE:-$(mktemp -d)/site}"
  else
    export VLARL_STASH="${VLARL_STASH:-/tmp/$stash}" VLARL_SITE="${VLARL_SITE:-/tmp/vlarl_site}"
  fi
  export OUT VLARL_WHEEL_DIR="${VLARL_WHEEL_DIR:-$wheels}" VLARL_SKIP_SELF=1
  bash scripts/gpu/run_gpu_tests.sh "${DRY[@]}" install
  rc=$?
  if [ "$rc" != 0 ]; then
    [ "$rc" = 3 ] && echo "[$label] batch stashed; next call, at once: carry $next"
    exit "$rc"
  fi
}
