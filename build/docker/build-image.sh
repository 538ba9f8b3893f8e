#!/usr/bin/env bash
# Build one image target with the pipeline-staged context:
#   build/docker/build-image.sh [runtime-cpu|runtime-cpu-gguf|runtime] [extra docker build args...]
# Environment:
#   DEBIAN_BASE / CUDA_BASE   base images (defaults: the Dockerfile's)
#   FRONTIER_CA               CA bundle passed as the optional build secret `ca`
#                             (default: pip's configured `cert`, when there is one)
#   SOURCE_DATE_EPOCH         reproducible timestamp (default: last commit time)
#   VLLM_SOURCE               sdist (default) or git (runtime only)
#   NORMALIZE_IMAGE=0         keep the engine's build times (targets.toml's `normalize`)
# Tags and labels come from build/targets.toml and the staged context (one --label each).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

target=${1:-runtime-cpu}
shift || true
tags=
base_arg=DEBIAN_BASE
if [[ $target == builder-check ]]; then
    # The pipeline-test stage (make check-image); it reads nothing from the context.
    context=runtime-cpu tags=frontier-serve:builder-check
else
    context=$target
    facts=$(PYTHONPATH=build python3 -m pipeline targets shell --target "$target") || {
        echo "usage: $0 TARGET [docker build args...]  (a target of build/targets.toml, or builder-check)" >&2
        exit 2
    }
    eval "$facts"  # sets tags (space-separated) and base_arg, among others
fi
read -r -a tag_list <<<"$tags"

pick_docker
[[ -n $DOCKER ]] || { log "no Docker client that can build with BuildKit"; exit 1; }

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
log "staging the build context for $context (python3 -m pipeline image context)"
PYTHONPATH=build python3 -m pipeline image context --target "$context" --source-date-epoch "$epoch" >/dev/null

args=()
while IFS= read -r line; do
    [[ -n $line ]] && args+=(--build-arg "$line")
done <".work/context/$context.args"
if [[ $target != builder-check ]]; then
    while IFS= read -r line; do
        [[ -n $line ]] && args+=(--label "$line")
    done <".work/context/$context.labels"
fi
for tag in "${tag_list[@]}"; do
    args+=(--tag "$tag")
done
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

log "building $target as ${tag_list[*]} with $DOCKER"
DOCKER_BUILDKIT=1 "$DOCKER" build --network=host --target "$target" "${args[@]}" "$@" .
log "built ${tag_list[0]}"
if [[ $target != builder-check ]]; then
    # The apt packages that went in (apt-install.sh's list), by sha256 in a label. A
    # label can only be given at build time, so the same build runs again, all cached.
    # (Without --no-cache: the first build has just filled the cache this one must hit.)
    apt_sum=$(apt_list_sha256 "${tag_list[0]}")
    log "label io.frontier-serve.apt-packages.sha256=$apt_sum"
    again=()
    for arg in "$@"; do [[ $arg == --no-cache ]] || again+=("$arg"); done
    DOCKER_BUILDKIT=1 "$DOCKER" build --quiet --network=host --target "$target" "${args[@]}" \
        --label "io.frontier-serve.apt-packages.sha256=$apt_sum" "${again[@]}" . >/dev/null
fi
# The base that went in, by digest: a tag can move; pin CUDA_BASE=name@sha256:... to keep it.
base=${!base_arg:-$(sed -n "s/^ARG $base_arg=//p" Dockerfile | head -1)}
digest=$("$DOCKER" image inspect -f '{{join .RepoDigests " "}}' "$base" 2>/dev/null || true)
if [[ -n $digest ]]; then
    log "base $base_arg=$base is $digest"
else
    log "base $base_arg=$base is image $("$DOCKER" image inspect -f '{{.Id}}' "$base" 2>/dev/null ||
        echo '(not in the engine)') (built here or loaded: no registry digest)"
fi

# Build times clamped to SOURCE_DATE_EPOCH past the base's layers (targets.toml's
# `normalize`; NORMALIZE_IMAGE=0 skips it), so that two builds of the same inputs give
# the same image ID: this engine's BuildKit cannot do it itself. A build that the layer
# cache answered gives the same raw image again, whose normalized ID is remembered.
normalize_image() (  # a subshell: its EXIT trap removes the archives
    raw=$("$DOCKER" image inspect -f '{{.Id}}' "${tag_list[0]}")
    known=
    [[ -f $norm_map ]] && known=$(awk -v raw="$raw" -v epoch="$epoch" \
        '$1 == raw && $2 == epoch { id = $3 } END { print id }' "$norm_map")
    if [[ -n $known ]] && "$DOCKER" image inspect "$known" >/dev/null 2>&1; then
        for tag in "${tag_list[@]}"; do "$DOCKER" tag "$known" "$tag"; done
        log "normalized: $known (as before, for the same build)"
        exit 0
    fi
    base_layers=$("$DOCKER" image inspect -f '{{len .RootFS.Layers}}' "$base")
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/normalize-image.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    log "normalizing $raw: times after $epoch clamped past the base's $base_layers layers"
    "$DOCKER" save -o "$tmp/raw.tar" "${tag_list[@]}"
    id=$(python3 build/docker/normalize_image.py "$tmp/raw.tar" "$tmp/image.tar" \
        --epoch "$epoch" --keep-layers "$base_layers")
    rm -f "$tmp/raw.tar"
    "$DOCKER" load -q -i "$tmp/image.tar" >/dev/null
    [[ $("$DOCKER" image inspect -f '{{.Id}}' "${tag_list[0]}") == "$id" ]] ||
        { log "normalize: ${tag_list[0]} is not $id after the load"; exit 1; }
    mkdir -p "$(dirname "$norm_map")"
    echo "$raw $epoch $id" >>"$norm_map"
    log "normalized: $id"
)
norm_map=${FRONTIER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/frontier-serve}/docker/normalized-images
if [[ ${normalize:-0} == 1 && ${NORMALIZE_IMAGE:-1} != 0 ]]; then
    normalize_image
fi
