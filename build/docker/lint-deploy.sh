#!/usr/bin/env bash
# make lint-deploy: every deployment file, with the pinned linters (tools.txt).
#   hadolint (each ignored rule must carry a comment saying why), compose v2
#   `config` for every service and profile, the compose-spec schema,
#   kubernetes-validate, LeaderWorkerSets against the vendored LWS CRD schema
#   (check_lws.py), shellcheck on every shell script, ruff on image code.
# Needs no Docker engine.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# shellcheck source=build/docker/engine.sh
source build/docker/engine.sh
ensure_tools
bin=$TOOLS/bin
failed=0
check() {  # check NAME CMD...
    if "${@:2}"; then
        log "ok    $1"
    else
        log "FAIL  $1"
        failed=1
    fi
}

check "hadolint Dockerfile" "$bin/hadolint" --failure-threshold style Dockerfile
# An ignore pragma must follow a comment line that explains it.
# shellcheck disable=SC2329  # called through check
ignores_explained() {
    awk '/^# hadolint ignore=/ { if (prev !~ /^#/ || prev ~ /^# hadolint/) { print FILENAME ":" NR ": " $0 " has no comment above it"; bad = 1 } }
         { prev = $0 } END { exit bad }' Dockerfile
}
check "hadolint ignores carry a reason" ignores_explained

compose_bin=$(compose_binary)
# shellcheck disable=SC2329  # called through check
compose_config() {
    local profile service
    "$compose_bin" -f docker-compose.yml --profile '*' config --quiet || return 1
    for profile in $("$compose_bin" -f docker-compose.yml config --profiles); do
        for service in $("$compose_bin" -f docker-compose.yml ${profile:+--profile "$profile"} config --services); do
            "$compose_bin" -f docker-compose.yml ${profile:+--profile "$profile"} config --quiet "$service" || return 1
            echo "  compose config: ${profile:-default} / $service"
        done
    done
}
check "docker compose config (compose v2, every service and profile)" compose_config
check "compose-spec schema" "$bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml
check "kubernetes-validate" "$bin/kubernetes-validate" --strict deploy/kubernetes/*.yaml
# kubernetes-validate only warns on a LeaderWorkerSet; the vendored LWS CRD's schema checks it.
check "LeaderWorkerSet against the vendored LWS CRD" "$bin/python" build/docker/check_lws.py deploy/kubernetes/*.yaml

shell_scripts() {
    local f
    git ls-files --cached --others --exclude-standard -- '*.sh' .ci/run |
        while IFS= read -r f; do [[ -e $f ]] && echo "$f"; done
}
mapfile -t scripts < <(shell_scripts)
check "shellcheck (${#scripts[@]} scripts)" "$bin/shellcheck" -x "${scripts[@]}"
check "ruff (image code)" "$bin/ruff" check build/pipeline/image.py checks/image

exit "$failed"
