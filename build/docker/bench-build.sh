#!/usr/bin/env bash
# make bench-build: build timings of the CPU and CUDA images, in a scratch copy
# of the working tree (the patch edit below never touches your checkout).
#   1. cold build of runtime-cpu: BuildKit cache pruned (pip and apt cache
#      mounts included), so every layer is built and every dependency fetched
#   2. rebuild after changing one patch file only (goal: <= 60 s; torch is not
#      reinstalled because cpu-deps depends on no patch)
#   3. runtime image sizes
#   4. `docker compose --profile smoke up` until compose reports healthy
#   5. the CUDA image (runtime): cold build (its own stages never built
#      before; the builder stages it shares with runtime-cpu are warm), a cached
#      rebuild, a rebuild after the patch change, and each layer's size against
#      the installed closure of the pinned vLLM wheel
# BENCH_COLD=0 skips the prune (a warm "cold" build); BENCH_CUDA=0 skips step 5.
# CUDA_BASE: as for make image; without it, the Debian base (as check-image).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=build/docker/engine.sh
source "$REPO/build/docker/engine.sh"
BASE=${DEBIAN_BASE:-frontier-debian:bookworm}
tag_of() { PYTHONPATH=$REPO/build python3 -m pipeline targets shell --target "$1" | sed -n 's/^tag=//p'; }
cpu_tag=$(tag_of runtime-cpu)
cuda_tag=$(tag_of runtime)

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
build_cuda() { (cd "$scratch" && DEBIAN_BASE=$BASE CUDA_BASE=${CUDA_BASE:-$BASE} build/docker/build-image.sh runtime --quiet >/dev/null); }
seconds() { local t0=$SECONDS; "$@"; echo $((SECONDS - t0)); }

if [[ ${BENCH_COLD:-1} == 1 ]]; then
    log "pruning the BuildKit cache for a cold build"
    "$DOCKER" builder prune --all --force >/dev/null
fi
"$DOCKER" image rm "$cpu_tag" >/dev/null 2>&1 || true
log "cold build"
cold=$(seconds build)
if [[ ${BENCH_CUDA:-1} == 1 ]]; then
    "$DOCKER" image rm "$cuda_tag" >/dev/null 2>&1 || true
    log "cold build of runtime (CUDA, base ${CUDA_BASE:-$BASE})"
    cold_cuda=$(seconds build_cuda)
    log "cached rebuild of runtime"
    cached_cuda=$(seconds build_cuda)
fi

patch=$(grep -v '^#' "$scratch/patches/vllm/series" | grep -m1 .)
log "changing one patch file: patches/vllm/$patch (header line added)"
sed -i "1a Bench: rebuild timing, $(date -u +%s)" "$scratch/patches/vllm/$patch"
rebuild=$(seconds build)
[[ ${BENCH_CUDA:-1} == 1 ]] && rebuild_cuda=$(seconds build_cuda)

size_cpu=$("$DOCKER" image inspect -f '{{.Size}}' "$cpu_tag")
log "compose up (smoke) until healthy"
up() { (cd "$scratch" && SMOKE_PORT=$port "$DOCKER" compose -p "$project" --profile smoke up -d --wait --wait-timeout 600 >/dev/null); }
healthy=$(seconds up)

printf '\n%-58s %s\n' "measure" "value"
[[ ${BENCH_COLD:-1} == 1 ]] || printf '%-58s %s\n' "BENCH_COLD=0: the build cache was kept" "the cold rows are warm"
printf '%-58s %s\n' "cold build of runtime-cpu (wall)" "${cold} s"
printf '%-58s %s\n' "rebuild after changing one patch (goal <= 60 s)" "${rebuild} s"
printf '%-58s %s\n' "image size $cpu_tag" "$((size_cpu / 1000000)) MB"
printf '%-58s %s\n' "compose up -> healthy (smoke, tiny model)" "${healthy} s"
printf '%-58s %s\n' "context staging (pipeline image context), in each build" "included above"

[[ ${BENCH_CUDA:-1} == 1 ]] || exit 0
printf '%-58s %s\n' "cold build of runtime (CUDA; shared builder stages warm)" "${cold_cuda} s"
printf '%-58s %s\n' "cached rebuild of runtime, nothing changed" "${cached_cuda} s"
printf '%-58s %s\n' "rebuild of runtime after changing one patch" "${rebuild_cuda} s"
printf '%-58s %s\n' "image size $cuda_tag" \
    "$(($("$DOCKER" image inspect -f '{{.Size}}' "$cuda_tag") / 1000000)) MB"
# The reference: what `pip install` of the pinned vLLM wheel would put in a venv
# (its dependencies, measured in the image, plus the wheel's own files).
wheel=$(cd "$REPO" && PYTHONPATH=build python3 -c 'from pipeline import fetch, pins; print(fetch.cached_path(pins.load().file("vllm-cuda-wheel")))')
vllm_bytes=$(python3 -c 'import sys, zipfile; print(sum(i.file_size for i in zipfile.ZipFile(sys.argv[1]).infolist()))' "$wheel")
# shellcheck disable=SC2016  # the command line is expanded by sh inside the container
deps_bytes=$("$DOCKER" run --rm --entrypoint sh "$cuda_tag" -c \
    'du -sb --exclude=vllm --exclude="vllm-*.dist-info" --exclude=vllm_gguf_plugin --exclude=entrypoint "$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")" | cut -f1')
printf '%-58s %s\n' "reference: vLLM wheel's installed closure (deps + vllm/)" \
    "$(((deps_bytes + vllm_bytes) / 1000000)) MB (vllm/ $((vllm_bytes / 1000000)) MB)"
printf '\n%-10s %s\n' "layer MB" "created by ($cuda_tag, newest first)"
"$DOCKER" history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$cuda_tag" |
    python3 -c '
import re, sys
units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
for line in sys.stdin:
    size, _, by = line.rstrip("\n").partition("\t")
    m = re.match(r"([0-9.]+)([kKMG]?B)", size)
    mb = float(m.group(1)) * units[m.group(2)] / 1e6 if m else 0.0
    if mb >= 1:
        by = " ".join(by.split())[:110]
        print(f"{mb:10.0f} {by}")
'
