#!/bin/sh
# The dependency layer: a venv with the pinned base wheels and everything they
# require, installed before any patch is applied, so a patch change never
# reinstalls torch.
#   install-deps.sh VENV DEPS_DIR
# DEPS_DIR holds requirements.txt and remove.txt, written by
# `python3 -m pipeline image context`; the pinned wheels it names lie in
# /cache/pins with a SHA256SUMS made from build/pins.toml.
set -eu
venv=$1
deps=$2
pins=/cache/pins

echo "install-deps: checking the pinned files against build/pins.toml"
(cd "$pins" && sha256sum --check --strict SHA256SUMS)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --progress-bar off --no-input \
    --disable-pip-version-check --requirement "$deps/requirements.txt"
if [ -s "$deps/remove.txt" ]; then
    # shellcheck disable=SC2046  # one package name per line, no spaces
    "$venv/bin/python" -m pip uninstall --yes --quiet $(cat "$deps/remove.txt")
fi
"$venv/bin/python" -m pip check || echo "install-deps: pip check reports the above (expected for removed packages)"
find "$venv" -name __pycache__ -path '*/pip/*' -prune -exec rm -rf {} +
