#!/usr/bin/env bash
# The README's main command (make smoke): build the CPU image, start the
# `smoke` service (embedded tiny model, 127.0.0.1 only), print its readiness
# status and an example completion, and say how to stop it.
# `smoke.sh smoke-gguf` (make smoke-gguf) does the same with the GGUF image:
# Gemma 3 270M Q4_K_M through the patched plugin's CPU path; `smoke.sh smoke-glm5`
# (make smoke-glm5) with a tiny GLM-5 GGUF (DSA sparse MLA on CPU); `smoke.sh
# smoke-dflash` (make smoke-dflash) with a tiny Qwen3.6-shaped target and DFlash
# drafter, served from profiles/qwen36-dflash.env on the V2 model runner.
# Where no Docker engine can be reached or started, run the same entrypoint,
# model and readiness file directly from the CPU test tier (.venv).
#   SMOKE_PORT / SMOKE_GGUF_PORT / SMOKE_GLM5_PORT / SMOKE_DFLASH_PORT
#                  port on 127.0.0.1 (defaults: build/targets.toml)
#   SMOKE_LOCAL=1  skip Docker and use the CPU test tier
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh
service=${1:-smoke}
# Port, model, prompt and wait of each smoke service: build/targets.toml.
target='' port='' port_env='' model='' prompt='' wait=''
facts=$(PYTHONPATH=build python3 -m pipeline targets shell --service "$service" 2>/dev/null) || facts=
eval "$facts"
if [[ -z ${model:-} ]]; then
    echo "usage: $0 [smoke|smoke-gguf|smoke-glm5|smoke-dflash]  (a service of build/targets.toml with smoke settings)" >&2
    exit 2
fi
port=${!port_env:-$port}
url=http://127.0.0.1:$port
compose() {
    SMOKE_PORT=$port SMOKE_GGUF_PORT=$port SMOKE_GLM5_PORT=$port SMOKE_DFLASH_PORT=$port \
        "$DOCKER" compose --profile "$service" "$@"
}

complete() {
    curl -sS --fail --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$model\", \"prompt\": \"$prompt\", \"max_tokens\": 12, \"temperature\": 0}" |
        python3 -c 'import json, sys; r = json.load(sys.stdin); print("completion:", repr(r["choices"][0]["text"]))'
}

after_completion() {  # after_completion STATUS-COMMAND...: smoke-dflash's acceptance
    [[ $service == smoke-dflash ]] || return 0
    sleep 3  # the watcher reads vLLM's /metrics every few seconds
    echo "--- status after it (speculative decoding):"
    "$@"
}

with_docker() {
    local base=${DEBIAN_BASE:-}
    ensure_compose
    if [[ -z $base ]]; then
        # Use the public slim image when the engine can pull it, else make one.
        if "$DOCKER" image inspect debian:bookworm-slim >/dev/null 2>&1 ||
           "$DOCKER" pull -q debian:bookworm-slim >/dev/null 2>&1; then
            base=debian:bookworm-slim
        else
            base=frontier-debian:bookworm
            DOCKER=$DOCKER build/docker/base-image.sh "$base"
        fi
    fi
    DEBIAN_BASE=$base build/docker/build-image.sh "$target"
    log "starting the $service service on $url (waits until probe passes, up to $wait s)"
    if ! compose up -d --wait --wait-timeout "$wait" "$service"; then
        compose logs --tail=100 "$service"
        exit 1
    fi
    local id
    id=$(compose ps -q "$service")
    echo "--- readiness (probe, then status):"
    "$DOCKER" exec "$id" python -m entrypoint probe
    "$DOCKER" exec "$id" python -m entrypoint status
    echo "--- example completion:"
    complete
    after_completion "$DOCKER" exec "$id" python -m entrypoint status
    echo "--- the smoke stack is running in Docker (container $id)."
    echo "Stop it with:  docker compose --profile $service down"
}

with_venv() {
    if [[ $service == smoke-gguf ]]; then
        log "no Docker engine could be reached or started: serving the GGUF from the CPU test tier"
        make --no-print-directory venv >/dev/null
        exec .venv/bin/python checks/gguf_cpu/smoke_gguf.py
    fi
    log "no Docker engine could be reached or started: running the same entrypoint,"
    log "model and readiness file directly from the CPU test tier (.venv)"
    make --no-print-directory venv >/dev/null
    local dir=$REPO/.work/$service
    mkdir -p "$dir"
    if [[ $service == smoke-dflash ]]; then  # the runtime-cpu-dflash image's pair, compose's settings
        [[ -f $dir/model/reference.json ]] || .venv/bin/python -m fixtures.dflash_served "$dir/model" >/dev/null
        eval "$(.venv/bin/python -m fixtures.dflash_served "$dir/model" --print-env)"
    elif [[ $service == smoke-glm5 ]]; then  # the runtime-cpu-glm5 image's model and settings
        [[ -f $dir/model/reference.json ]] || .venv/bin/python -m fixtures.glm5_served "$dir/model" >/dev/null
        export SERVE_MODEL=$dir/model/tiny-glm5.gguf SERVE_HF_CONFIG_PATH=$dir/model \
            SERVE_TOKENIZER=$dir/model SERVE_QUANTIZATION=gguf SERVE_DTYPE=float32 \
            SERVE_MAX_NUM_BATCHED_TOKENS=32
    else
        [[ -f $dir/model/config.json ]] || .venv/bin/python -m fixtures.tiny_model "$dir/model" >/dev/null
        export SERVE_MODEL=$dir/model
    fi
    export SERVE_SERVED_MODEL_NAME=$model SERVE_HOST=127.0.0.1 SERVE_PORT=$port \
        SERVE_MAX_MODEL_LEN=512 SERVE_MAX_NUM_SEQS=4 SERVE_ENFORCE_EAGER=true SERVE_READY_FILE=$dir/run/ready \
        VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1
    nohup .venv/bin/python -m entrypoint serve >"$dir/serve.log" 2>&1 &
    local pid=$! waited=0
    echo "$pid" >"$dir/serve.pid"
    until .venv/bin/python -m entrypoint probe >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { tail -50 "$dir/serve.log"; exit 1; }
        waited=$((waited + 2))
        [[ $waited -lt $wait ]] || { log "not ready after $wait s"; tail -50 "$dir/serve.log"; exit 1; }
        sleep 2
    done
    echo "--- readiness (probe, then status):"
    .venv/bin/python -m entrypoint probe
    .venv/bin/python -m entrypoint status
    echo "--- example completion:"
    complete
    after_completion .venv/bin/python -m entrypoint status
    echo "--- the smoke stack runs WITHOUT Docker (from .venv), pid $pid, log $dir/serve.log."
    echo "Stop it with:  kill $pid"
}

if [[ ${SMOKE_LOCAL:-0} != 1 ]] && ensure_engine; then
    with_docker
else
    with_venv
fi
