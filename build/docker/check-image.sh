#!/usr/bin/env bash
# make check-image: build the CUDA image (target runtime) and check it, no GPU needed.
#  1. reach a Docker engine (as make e2e does)
#  2. the pipeline's tests under the builder image's own Python (stage builder-check)
#  3. build runtime: CUDA_BASE as given, else nvidia/cuda when the engine has it,
#     else a Debian base made here (the stand-in base CI uses; users keep nvidia/cuda)
#  4. the image's labels equal `make patch-check`'s digests and the pinned wheel's hash
#  5. checks/image/check_cuda_image.py inside the image as uid 10001
# Any failing step fails the run.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

IMAGE=$(PYTHONPATH=build python3 -m pipeline targets shell --target runtime | sed -n "s/^tag=//p")
started=$(date +%s)
step() { log "== $* (t=$(($(date +%s) - started)) s)"; }
finish() {
    local code=$?
    [[ $code == 0 ]] || engine_log_tail
    [[ ${KEEP_ENGINE:-0} == 1 ]] || stop_engine
    log "check-image finished with exit $code after $(($(date +%s) - started)) s"
}
trap finish EXIT

step "Docker engine"
ensure_engine || { log "no Docker engine could be reached or started"; exit 1; }
# The CUDA dependency layer needs about 20 GB while it is built and exported.
reclaim_docker
debian=${DEBIAN_BASE:-frontier-debian:bookworm}
build/docker/base-image.sh "$debian"
if [[ -z ${CUDA_BASE:-} ]]; then
    default=$(sed -n 's/^ARG CUDA_BASE=//p' Dockerfile)
    if "$DOCKER" image inspect "$default" >/dev/null 2>&1; then
        CUDA_BASE=$default
    else
        CUDA_BASE=$debian
        log "no $default in this engine: building on the stand-in base $CUDA_BASE (Debian)"
    fi
fi
export DEBIAN_BASE=$debian CUDA_BASE

step "pipeline tests under the builder image's Python (builder-check)"
build/docker/build-image.sh builder-check --quiet >/dev/null
cache=${FRONTIER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/frontier-serve}
"$DOCKER" run --rm --network=none -v "$REPO:/src:ro" -v "$cache/pins:/real-cache/pins:ro" \
    -e FRONTIER_CACHE=/real-cache -e PYTHONPATH=/src/build:/src -w /src frontier-serve:builder-check \
    sh -c 'python3 --version && python3 -m pytest -q -p no:cacheprovider tests/pipeline \
        --ignore tests/pipeline/test_weight_rename.py -k "not git"'

step "patch-check digests"
PYTHONPATH=build python3 -m pipeline patch-check >/dev/null

step "build runtime on $CUDA_BASE"
# Without normalize_image.py's save, rewrite and load (minutes for this image): what is
# checked here is the image's content, which it does not change; e2e normalizes runtime-cpu.
NORMALIZE_IMAGE=0 build/docker/build-image.sh runtime

step "labels match patch-check and the pins"
for pair in vllm:io.frontier-serve.tree.vllm vllm-gguf-plugin:io.frontier-serve.tree.vllm-gguf-plugin; do
    want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
        .work/trees/digests.json "${pair%%:*}")
    got=$("$DOCKER" image inspect -f "{{index .Config.Labels \"${pair#*:}\"}}" "$IMAGE")
    [[ $want == "$got" ]] || { log "label ${pair#*:}='$got', make patch-check says '$want'"; exit 1; }
    log "label ${pair#*:}=$got (= make patch-check)"
done
labels_match .work/context/runtime.labels "$IMAGE"
apt_list_matches "$IMAGE"
installed_matches_lock "$IMAGE"
user=$("$DOCKER" image inspect -f '{{.Config.User}}' "$IMAGE")
[[ $user == 10001:10001 ]] || { log "image user is '$user', expected 10001:10001"; exit 1; }
log "every staged label is the image's; the venv holds its lock; user $user"

step "checks inside the image (uid 10001, no GPU, no network)"
"$DOCKER" run --rm --network=none -v "$REPO:/checks:ro" --entrypoint python "$IMAGE" \
    /checks/checks/image/check_cuda_image.py
"$DOCKER" image ls "$IMAGE" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
step "check-image passed"
