#!/usr/bin/env bash
# Build one image target with the pipeline-staged context:
#   build/docker/build-image.sh [runtime-cpu|runtime-cpu-gguf|runtime] [extra docker build args...]
# Environment:
#   DEBIAN_BASE / CUDA_BASE   base images (defaults: the Dockerfile's)
#   FRONTIER_CA               CA bundle passed as the optional build secret `ca`
#                             (default: pip's configured `cert`, when there is one)
#   SOURCE_DATE_EPOCH         reproducible timestamp (default: last commit time)
#   VLLM_SOURCE               sdist (default) or git (runtime only)
# Tags frontier-serve:cpu / :cpu-gguf / :cuda and <version>-cpu / <version>-cpu-gguf / <version>.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

target=${1:-runtime-cpu}
shift || true
context=$target
case $target in
    runtime-cpu) tag=frontier-serve:cpu suffix=-cpu ;;
    runtime-cpu-gguf) tag=frontier-serve:cpu-gguf suffix=-cpu-gguf ;;
    runtime) tag=frontier-serve:cuda suffix= ;;
    # The pipeline-test stage (make check-image); it reads nothing from the context.
    builder-check) tag=frontier-serve:builder-check suffix=-builder-check context=runtime-cpu ;;
    *) echo "usage: $0 [runtime-cpu|runtime-cpu-gguf|runtime|builder-check] [docker build args...]" >&2; exit 2 ;;
esac

pick_docker
[[ -n $DOCKER ]] || { log "no Docker client that can build with BuildKit"; exit 1; }

log "staging the build context for $context (python3 -m pipeline image context)"
PYTHONPATH=build python3 -m pipeline image context --target "$context" >/dev/null

args=()
version=
while IFS= read -r line; do
    [[ -n $line ]] || continue
    args+=(--build-arg "$line")
    [[ $line == VLLM_VERSION=* ]] && version=${line#VLLM_VERSION=}
done <".work/context/$context.args"

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
args+=(--build-arg "SOURCE_DATE_EPOCH=$epoch"
       --build-arg "IMAGE_CREATED=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)")
[[ -n ${DEBIAN_BASE:-} ]] && args+=(--build-arg "DEBIAN_BASE=$DEBIAN_BASE")
[[ -n ${CUDA_BASE:-} ]] && args+=(--build-arg "CUDA_BASE=$CUDA_BASE")
[[ -n ${VLLM_SOURCE:-} ]] && args+=(--build-arg "VLLM_SOURCE=$VLLM_SOURCE")

# pip's own CA bundle (files and PIP_CERT), read as the pipeline's fetch step does.
ca=${FRONTIER_CA:-$(PYTHONPATH=build python3 -c \
    'from pipeline import pipconfig; print(pipconfig.read().cert or "")' 2>/dev/null || true)}
if [[ -n $ca && -s $ca ]]; then
    log "passing $ca as the build secret 'ca' (not stored in the image)"
    args+=(--secret "id=ca,src=$ca")
fi

log "building $target as $tag ($version$suffix) with $DOCKER"
DOCKER_BUILDKIT=1 "$DOCKER" build --network=host --target "$target" \
    --tag "$tag" --tag "frontier-serve:$version$suffix" "${args[@]}" "$@" .
log "built $tag"
