#!/usr/bin/env bash
# `make test`: the CPU suite as pytest processes that run at once, one per shard.
#
# usage: build/run-test-shards.sh PYTHON NAME='PYTEST ARGS [; PYTEST ARGS ...]' ...
#
# Most of the suite's time is real vLLM servers starting (imports, then an engine
# process that imports again), which keeps about one core busy; two shards keep both
# cores of a CI machine busy. A shard runs its pytest invocations (split on ';') one
# after another, each with its own --basetemp, into one log. The script waits for every
# shard, prints each one's summary lines as it ends and the whole log of one that
# failed, and exits non-zero when any shard did.
set -uo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 PYTHON NAME='PYTEST ARGS' ..." >&2; exit 2; }
py=$1
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/test-shards.XXXXXX")
started=$(date +%s)
declare -A shard_of=() began=()

for spec in "$@"; do
    name=${spec%%=*}
    args=${spec#*=}
    [[ $name != "$spec" && -n $name ]] || { echo "run-test-shards: error: '$spec' is not NAME=ARGS" >&2; exit 2; }
    (
        IFS=';' read -ra runs <<<"$args"
        code=0
        for i in "${!runs[@]}"; do
            # shellcheck disable=SC2086  # a run is a list of paths and options, split on purpose
            "$py" -m pytest -p no:cacheprovider --basetemp="$dir/$name.$i.tmp" ${runs[$i]} || code=$?
        done
        exit "$code"
    ) >"$dir/$name.log" 2>&1 &
    shard_of[$!]=$name
    began[$name]=$(date +%s)
    echo "[test] shard $name: pytest $args (log $dir/$name.log)"
done

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
done

# Last, where the end of the output is what gets read: every shard's line.
printf '[test] %s\n' "${summaries[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "[test] FAILED shards: ${failed[*]} (logs in $dir) after $(($(date +%s) - started)) s"
    exit 1
fi
echo "[test] all ${#summaries[@]} shards passed in $(($(date +%s) - started)) s"
rm -rf "$dir"
