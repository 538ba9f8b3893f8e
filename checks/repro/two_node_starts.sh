#!/usr/bin/env bash
# N consecutive starts of a two-node compose stack, to count how often one fails:
#     checks/repro/two_node_starts.sh [N] [SERVICE]     (defaults: 10 smoke-gguf-2node)
# Each start: `compose up --wait` of the leader and its worker on fresh ports, one greedy
# completion, both nodes' state and `status --json`, the logs, `down`. The image must be
# built (build/docker/build-image.sh runtime-cpu-gguf) and a Docker engine reachable
# (`KEEP_ENGINE=1 make e2e` leaves one running). Writes under ${OUT:-.work/two-node-starts}.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO" || exit 2
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh
pick_docker >/dev/null 2>&1 || true
DOCKER=${DOCKER:-docker}
runs=${1:-10}
service=${2:-smoke-gguf-2node}
out=${OUT:-.work/two-node-starts}
mkdir -p "$out"
model='' prompt='' wait=''  # set by `pipeline targets shell` (build/targets.toml)
eval "$(PYTHONPATH=build python3 -m pipeline targets shell --service "$service" 2>/dev/null)"
passed=0
for i in $(seq 1 "$runs"); do
    port=$(free_port)
    store=$(free_port)
    c() {
        SMOKE_2NODE_PORT=$port SMOKE_2NODE_STORE_PORT=$store SMOKE_GGUF_2NODE_PORT=$port \
            SMOKE_GGUF_2NODE_STORE_PORT=$store "$DOCKER" compose -p two-node-starts \
            -f docker-compose.yml --profile "$service" "$@"
    }
    began=$(date +%s)
    result=FAIL
    if c up -d --wait --wait-timeout "$wait" >"$out/up-$i.log" 2>&1 &&
        curl -sS --fail --max-time 120 "http://127.0.0.1:$port/v1/completions" \
            -H 'Content-Type: application/json' \
            -d "{\"model\": \"$model\", \"prompt\": \"$prompt\", \"max_tokens\": 8, \"temperature\": 0}" \
            >"$out/reply-$i.json" 2>&1; then
        result=pass
        passed=$((passed + 1))
    fi
    for node in "$service" "$service-worker"; do
        id=$(c ps -aq "$node")
        "$DOCKER" inspect -f '{{.State.Status}} exit={{.State.ExitCode}}' "$id" >"$out/state-$i-$node.txt" 2>&1
        "$DOCKER" exec "$id" python -m entrypoint status --json >"$out/status-$i-$node.json" 2>&1 || true
    done
    c logs --no-color -t >"$out/logs-$i.txt" 2>&1
    c down --volumes --timeout 20 >/dev/null 2>&1
    log "start $i of $runs: $result in $(($(date +%s) - began)) s ($passed passed so far)"
done
[[ $passed == "$runs" ]]
