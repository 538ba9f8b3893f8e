#!/bin/sh
# Run one image step (a RUN's command) so that its layer does not depend on when it ran:
#   sh /in/reproducible.sh COMMAND [ARGS...]
# - SOURCE_DATE_EPOCH is set for the command: pip's compileall then writes checked-hash
#   .pyc files (the source's hash, not its install time), and useradd dates
#   /etc/shadow by it;
# - apt's and dpkg's logs and ldconfig's aux cache, which hold the time, are emptied;
# - every path the step wrote gets SOURCE_DATE_EPOCH as its time. The engine CI starts
#   (Debian's docker.io 20.10, BuildKit 0.8) cannot clamp layer times itself.
# The time is fixed (1980-01-01, zip's minimum, as for our wheels), not the commit's:
# a build argument that changed with every commit would rebuild every layer.
# Not reached from here: the directories BuildKit makes for the step's mounts (made
# before and after the command runs) and the history times in the image's config.
# `make repro-image` builds twice and compares (checks/repro/check_image_twice.sh).
set -eu
export SOURCE_DATE_EPOCH=315532800
since=$(($(date +%s) - 1))
"$@"
# Emptied, not removed: removing a file of a lower layer leaves a whiteout, whose time
# the engine sets.
for log in /var/log/apt/history.log /var/log/apt/term.log /var/log/apt/eipp.log.xz \
    /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache; do
    if [ -f "$log" ]; then : >"$log"; fi
done
# Everything but the step's mounts (build context, caches, secrets) and kernel trees.
mounts=$(awk '$5 != "/" { print $5 }' /proc/self/mountinfo | sort -u)
set --
while IFS= read -r mount; do
    if [ -n "$mount" ]; then set -- "$@" -path "$mount" -prune -o; fi
done <<MOUNTS
$mounts
MOUNTS
find / "$@" -newermt "@$since" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
