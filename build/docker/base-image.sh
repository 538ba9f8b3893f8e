#!/usr/bin/env bash
# Make a minimal Debian base image locally, for engines that cannot pull one.
#   build/docker/base-image.sh [NAME] [SUITE]   (defaults: frontier-debian:bookworm, bookworm)
# The result is a plain rootfs from debootstrap (no python); the Dockerfile
# installs what it needs. Skips the work when the image already exists.
set -euo pipefail

name=${1:-frontier-debian:bookworm}
suite=${2:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

docker=${DOCKER:-docker}
if "$docker" image inspect "$name" >/dev/null 2>&1; then
    echo "base image $name already exists"
    exit 0
fi
# The rootfs tarball is kept beside the pinned downloads, so later runs (and CI
# on a warm cache) skip debootstrap. Delete it to refresh the base.
cache=${FRONTIER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/frontier-serve}/docker
tarball=$cache/$suite-minbase.tar
import_base() {
    "$docker" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$name"
}
if [[ -s $tarball ]]; then
    import_base <"$tarball"
    echo "base image $name imported from $tarball"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }

root=$(mktemp -d /tmp/frontier-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap --variant=minbase $suite into $root (from $mirror)"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    exit 1
}
rm -f "$root.log"
# Empty the apt lists and caches: the image build refreshes them itself.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
mkdir -p "$cache"
tar --numeric-owner -C "$root" -cf "$tarball.part" .
mv "$tarball.part" "$tarball"
import_base <"$tarball"
echo "base image $name created (rootfs kept in $tarball)"
