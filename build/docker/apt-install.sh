#!/bin/sh
# Install Debian/Ubuntu packages without recommends. The Dockerfile mounts
# /var/lib/apt/lists and /var/cache/apt as cache mounts, so neither the package
# lists nor the downloaded .deb files end up in a layer.
set -eu
export DEBIAN_FRONTEND=noninteractive
# Base images made by debootstrap or pulled from a registry may carry
# docker-clean, which empties the cache mount after every install.
rm -f /etc/apt/apt.conf.d/docker-clean
apt-get update -qq
apt-get install -y -qq --no-install-recommends "$@"
