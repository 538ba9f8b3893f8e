#!/usr/bin/env bash
# `make test`: the CPU suite as pytest processes, at most TEST_JOBS (default 2) at once.
#
# usage: [TEST_JOBS=N] build/run-test-shards.sh PYTHON NAME='PYTEST ARGS [; PYTEST ARGS ...]' ...
#
# Most of the suite's time is real vLLM servers starting (imports, then an engine
# process that imports again), which keeps about one core busy; two shards at a time
# keep both cores of a CI machine busy. Shards start in the order given, the next one
# as soon as one ends, so list the longest first. A shard runs its pytest invocations
# (split on ';') one after another, each with its own --basetemp, into one log. The
# script waits for every shard, prints each one's summary lines as it ends and the
# whole log of one that failed, then the slowest tests of each, and exits non-zero
# when any shard did.
set -uo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 PYTHON NAME='PYTEST ARGS' ..." >&2; exit 2; }
py=$1
shift
jobs=${TEST_JOBS:-2}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run-test-shards: error: TEST_JOBS='$jobs' is not a positive integer" >&2; exit 2; }
for spec in "$@"; do
    name=${spec%%=*}
    [[ $name != "$spec" && -n $name ]] || { echo "run-test-shards: error: '$spec' is not NAME=ARGS" >&2; exit 2; }
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/test-shards.XXXXXX")
started=$(date +%s)
declare -A shard_of=() began=()
pending=("$@")

start_next() {
    local spec=${pending[0]}
    pending=("${pending[@]:1}")
    local name=${spec%%=*} args=${spec#*=}
    (
        IFS=';' read -ra runs <<<"$args"
        code=0
        for i in "${!runs[@]}"; do
            # shellcheck disable=SC2086  # a run is a list of paths and options, split on purpose
            "$py" -m pytest -p no:cacheprovider --basetemp="$dir/$name.$i.tmp" \
                --durations=8 --durations-min=15 ${runs[$i]} || code=$?
        done
        exit "$code"
    ) >"$dir/$name.log" 2>&1 &
    shard_of[$!]=$name
    began[$name]=$(date +%s)
    echo "[test] shard $name (at $(($(date +%s) - started)) s): pytest $args (log $dir/$name.log)"
}

while [[ ${#pending[@]} -gt 0 && ${#shard_of[@]} -lt $jobs ]]; do start_next; done

failed=()
summaries=()
while [[ ${#shard_of[@]} -gt 0 ]]; do
    pid=''
    wait -n -p pid
    code=$?
    [[ -n $pid ]] || break
    name=${shard_of[$pid]}
    unset "shard_of[$pid]"
    last=$(grep -E '(passed|failed|errors?|deselected|no tests ran).* in [0-9.]+s( \([0-9:]+\))?( =+)?$' \
        "$dir/$name.log" | sed -E 's/^=+ | =+$//g' | paste -sd '|' - | sed 's/|/; /g')
    summary="shard $name: exit $code after $(($(date +%s) - ${began[$name]})) s: ${last:-no pytest summary}"
    summaries+=("$summary")
    echo "[test] $summary"
    if [[ $code != 0 ]]; then
        failed+=("$name")
        echo "[test] ---- the log of shard $name ----"
        cat "$dir/$name.log"
        echo "[test] ---- end of the log of shard $name ----"
    fi
    [[ ${#pending[@]} -eq 0 ]] || start_next
done

# The slowest tests of each shard (pytest's --durations), where the suite's time goes.
for log in "$dir"/*.log; do
    sed -n '/slowest .*durations/,/^=/{/^[0-9.]*s /p}' "$log" | sed "s|^|[test] slow, $(basename "$log" .log): |"
done
# Last, where the end of the output is what gets read: every shard's line.
printf '[test] %s\n' "${summaries[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "[test] FAILED shards: ${failed[*]} (logs in $dir) after $(($(date +%s) - started)) s"
    exit 1
fi
echo "[test] all ${#summaries[@]} shards passed in $(($(date +%s) - started)) s"
rm -rf "$dir"
