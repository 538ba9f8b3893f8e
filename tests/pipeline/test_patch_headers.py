"""Every patch carries a DEP-3 header a tool can read, and every files/ path is
brought by exactly one patch (its Added-Files field)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import series
from pipeline.paths import PATCHES

REQUIRED = ("Description", "Origin", "Last-Update")
UPSTREAMS = sorted(p.name for p in PATCHES.iterdir() if (p / "series").is_file())


def dep3(patch: Path) -> dict[str, str]:
    """The header fields (continuation lines joined), up to the first diff line."""
    fields: dict[str, str] = {}
    name = None
    for line in patch.read_text().splitlines():
        if line.startswith(("--- ", "diff ", "Index: ")):
            break
        if line.startswith(" ") and name:
            fields[name] += "\n" + line[1:]
        elif match := re.match(r"^([A-Za-z][A-Za-z-]*): ?(.*)$", line):
            name = match.group(1)
            fields[name] = match.group(2)
        elif line.strip():
            raise AssertionError(f"{patch.name}: header line {line!r} is no DEP-3 field")
    return fields


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_headers_have_the_dep3_fields(upstream: str) -> None:
    for patch in series.load(upstream).patches:
        fields = dep3(patch)
        missing = [name for name in REQUIRED if not fields.get(name)]
        assert not missing, f"{patch.name} lacks {missing}"
        assert fields.get("Bug") or fields.get("Forwarded"), f"{patch.name}: no Bug or Forwarded"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", fields["Last-Update"]), patch.name
        assert "FACTS.md" not in patch.read_text(), f"{patch.name} cites a file not in the repo"


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_every_added_file_is_claimed_by_exactly_one_patch(upstream: str) -> None:
    loaded = series.load(upstream)
    claims: dict[str, list[str]] = {}
    for patch in loaded.patches:
        for rel in dep3(patch).get("Added-Files", "").split():
            claims.setdefault(rel, []).append(patch.name)
    present = {f"files/{rel.as_posix()}" for rel in loaded.files}
    assert present, upstream
    for rel in sorted(present | set(claims)):
        assert rel in present, f"{claims[rel]} claim {rel}, which is not in files/"
        assert len(claims.get(rel, [])) == 1, f"{rel} is claimed by {claims.get(rel, [])}"


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_patches_are_numbered_without_gaps(upstream: str) -> None:
    numbers = [int(patch.name.split("-", 1)[0]) for patch in series.load(upstream).patches]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
