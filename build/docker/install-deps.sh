#!/bin/sh
# The dependency layer: a venv holding exactly one hash-locked closure, installed
# before any patch is applied, so a patch change never reinstalls torch.
#   install-deps.sh VENV DEPS_DIR
# DEPS_DIR holds the target's locks, one per Python (locks/<lock>-py<X.Y>-<platform>.txt,
# staged by `python3 -m pipeline image context`), and LOCKS.sha256. The pinned
# wheels a lock names (torch+cpu, which no index serves, among them) lie in PINS
# (default /cache/pins) with a SHA256SUMS made from build/pins.toml.
set -eu
venv=$1
deps=$2
pins=${PINS:-/cache/pins}

echo "install-deps: checking the pinned files against build/pins.toml"
(cd "$pins" && sha256sum --check --strict SHA256SUMS)
(cd "$deps" && sha256sum --check --strict LOCKS.sha256)
python3 -m venv "$venv"
version=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock=
for candidate in "$deps"/*-py"$version"-*.txt; do
    [ -f "$candidate" ] && lock=$candidate
done
if [ -z "$lock" ]; then
    have=$(for file in "$deps"/*.txt; do printf '%s ' "${file##*/}"; done)
    echo "install-deps: error: no lock for Python $version in $deps (have: $have);" \
        "add $version to the lock's pythons in build/targets.toml and run make lock" >&2
    exit 1
fi
echo "install-deps: installing $(basename "$lock") (every file checked against its sha256)"
if ! "$venv/bin/python" -m pip install --quiet --progress-bar off --no-input \
        --disable-pip-version-check --require-hashes --no-deps \
        --find-links "$pins" --requirement "$lock"; then
    echo "install-deps: error: pip refused $(basename "$lock"); its message above says why (a hash mismatch names the package)" >&2
    exit 1
fi
cp "$lock" "$venv/frontier-serve.lock"
"$venv/bin/python" -m pip check || echo "install-deps: pip check reports the above (packages the lock excludes)"
find "$venv" -name __pycache__ -path '*/pip/*' -prune -exec rm -rf {} +
