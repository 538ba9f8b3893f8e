#!/usr/bin/env bash
# make bench-build: build timings of the CPU image, in a scratch copy of the
# working tree (the patch edit below never touches your checkout).
#   1. cold build of runtime-cpu: BuildKit cache pruned (pip and apt cache
#      mounts included), so every layer is built and every dependency fetched
#   2. rebuild after changing one patch file only (goal: <= 60 s; torch is not
#      reinstalled because cpu-deps depends on no patch)
#   3. runtime image sizes
#   4. `docker compose --profile smoke up` until compose reports healthy
# BENCH_COLD=0 skips the prune (a warm "cold" build).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=build/docker/engine.sh
source "$REPO/build/docker/engine.sh"
BASE=${DEBIAN_BASE:-frontier-debian:bookworm}

ensure_engine || { log "no Docker engine could be reached or started"; exit 1; }
ensure_compose
"$REPO/build/docker/base-image.sh" "$BASE" >/dev/null

scratch=$(mktemp -d /tmp/frontier-bench.XXXXXX)
project=frontier-bench
port=$(free_port)
cleanup() {
    (cd "$scratch" && SMOKE_PORT=$port "$DOCKER" compose -p "$project" --profile smoke down --timeout 20 >/dev/null 2>&1) || true
    rm -rf "$scratch"
}
trap cleanup EXIT
log "copying the working tree to $scratch"
(cd "$REPO" && git ls-files --cached --others --exclude-standard -z |
    while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
    xargs -0 cp --parents -t "$scratch")

build() { (cd "$scratch" && DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu --quiet >/dev/null); }
seconds() { local t0=$SECONDS; "$@"; echo $((SECONDS - t0)); }

if [[ ${BENCH_COLD:-1} == 1 ]]; then
    log "pruning the BuildKit cache for a cold build"
    "$DOCKER" builder prune --all --force >/dev/null
fi
"$DOCKER" image rm frontier-serve:cpu >/dev/null 2>&1 || true
log "cold build"
cold=$(seconds build)

patch=$(grep -v '^#' "$scratch/patches/vllm/series" | grep -m1 .)
log "changing one patch file: patches/vllm/$patch (header line added)"
sed -i "1a Bench: rebuild timing, $(date -u +%s)" "$scratch/patches/vllm/$patch"
rebuild=$(seconds build)

size_cpu=$("$DOCKER" image inspect -f '{{.Size}}' frontier-serve:cpu)
log "compose up (smoke) until healthy"
up() { (cd "$scratch" && SMOKE_PORT=$port "$DOCKER" compose -p "$project" --profile smoke up -d --wait --wait-timeout 600 >/dev/null); }
healthy=$(seconds up)

printf '\n%-58s %s\n' "measure" "value"
printf '%-58s %s\n' "cold build of runtime-cpu (wall)" "${cold} s"
printf '%-58s %s\n' "rebuild after changing one patch (goal <= 60 s)" "${rebuild} s"
printf '%-58s %s\n' "image size frontier-serve:cpu" "$((size_cpu / 1000000)) MB"
printf '%-58s %s\n' "image size frontier-serve:cuda" "not buildable here (no CUDA base image)"
printf '%-58s %s\n' "compose up -> healthy (smoke, tiny model)" "${healthy} s"
printf '%-58s %s\n' "context staging (pipeline image context), in each build" "included above"
