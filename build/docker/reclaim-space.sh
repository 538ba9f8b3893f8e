#!/usr/bin/env bash
# make reclaim-space: the first step of CI. The disk is shared, so its free space varies
# from run to run; a run that starts short fails far from the cause (pip, git and the
# doctor's disk row each failed that way once). This step
#  1. prints the free space where the run writes (clone, caches, /tmp, Docker's data root)
#  2. below NEED_GB (default 30) for Docker, removes dangling images and old build cache
#     (engine.sh reclaim_docker; tagged images and recent cache stay)
#  3. warns, naming the folder, when the clone's filesystem is still below 15 GB
# It never fails the run for lack of space: the steps after it say what they lacked.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

cache=${FRONTIER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/frontier-serve}
mkdir -p "$cache"
for where in "$REPO" "$cache" "${TMPDIR:-/tmp}"; do
    log "$(free_gb "$where") GB free for $where"
done
if ensure_engine; then
    rc=0
    reclaim_docker || rc=$?  # a NEED_GB that is no number: named, and the engine still stops
    [[ ${KEEP_ENGINE:-0} == 1 ]] || stop_engine
    [[ $rc == 0 ]] || exit "$rc"
else
    log "no Docker engine here: nothing of Docker's to reclaim"
fi
free=$(free_gb "$REPO")
if [[ $free -lt 15 ]]; then
    log "warning: only $free GB free for $REPO; the tests and image builds need about 15 GB"
fi
