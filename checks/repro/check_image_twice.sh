#!/usr/bin/env bash
# make repro-image: build runtime-cpu twice with --no-cache, each from empty download
# caches, and compare the two images (checks/repro/image_diff.py): image IDs, every
# layer digest and, where a layer differs, the files that differ and how.
#   checks/repro/check_image_twice.sh [--keep]
# Each build gets its own FRONTIER_CACHE (the pinned files and wheels, fetched again
# from the indexes) and starts from an emptied BuildKit cache (`docker builder prune`:
# the layer cache and the apt and pip cache mounts), so the engine's build cache is
# gone afterwards for every image. The base image is an input, the same for both.
# Needs the package indexes and ~25 GB of disk. Exit 0 only for the same image ID.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

keep=0
[[ ${1:-} == --keep ]] && keep=1
root=${REPRO_DIR:-$REPO/.work/repro-image}
base=${DEBIAN_BASE:-frontier-debian:bookworm}
tag=$(PYTHONPATH=build python3 -m pipeline targets shell --target runtime-cpu 2>/dev/null |
    sed -n 's/^tag=//p')
started_engine=0

cleanup() {
    local code=$?
    for x in a b; do
        "$DOCKER" image rm "frontier-serve:repro-$x" >/dev/null 2>&1 || true
    done
    [[ $keep == 1 ]] || rm -rf "$root"/a.tar "$root"/b.tar "$root"/a "$root"/b
    [[ $started_engine == 1 && ${KEEP_ENGINE:-0} != 1 ]] && stop_engine
    exit "$code"
}

# (in a condition: pick_docker's probe of a client with no engine must not end the script)
if ! { pick_docker && engine_up; }; then started_engine=1; fi
ensure_engine || { log "no Docker engine could be reached or started"; exit 1; }
trap cleanup EXIT
build/docker/base-image.sh "$base"
mkdir -p "$root"

for x in a b; do
    log "build $x: empty caches, --no-cache"
    rm -rf "${root:?}/$x" "$root/$x.tar"
    mkdir -p "$root/$x/cache"
    "$DOCKER" builder prune --all --force >/dev/null
    t0=$(date +%s)
    # (its tags are moved to the normalized image, so the repro tag is added after)
    FRONTIER_CACHE="$root/$x/cache" DEBIAN_BASE=$base \
        build/docker/build-image.sh runtime-cpu --no-cache \
        >"$root/$x/build.log" 2>&1 || { tail -30 "$root/$x/build.log" >&2; exit 1; }
    "$DOCKER" tag "$tag" "frontier-serve:repro-$x"
    log "build $x done in $(($(date +%s) - t0)) s: $("$DOCKER" image inspect -f '{{.Id}}' "frontier-serve:repro-$x")"
    "$DOCKER" save -o "$root/$x.tar" "frontier-serve:repro-$x"
done

python3 checks/repro/image_diff.py "$root/a.tar" "$root/b.tar"
