"""The patch step on small trees made here, and on the real pinned sources."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline import patcher, series
from pipeline.errors import PipelineError
from pipeline.trees import patched_trees

ORIGINAL = "".join(f"line {n}\n" for n in range(1, 31))


def _diff(tmp: Path, rel: str, before: str, after: str, header: str = "Why: test\n") -> str:
    a, b = tmp / "_a" / rel, tmp / "_b" / rel
    for path, text in ((a, before), (b, after)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    out = subprocess.run(
        ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}", str(a), str(b)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return header + "\n" + out


def _series(
    tmp: Path,
    patches: dict[str, str],
    files: dict[str, str] | None = None,
    order: list[str] | None = None,
) -> series.Series:
    root = tmp / "patches" / "demo"
    root.mkdir(parents=True, exist_ok=True)
    for name, text in patches.items():
        (root / name).write_text(text)
    for rel, text in (files or {}).items():
        (root / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "files" / rel).write_text(text)
    (root / "series").write_text("# demo series\n" + "\n".join(order or list(patches)) + "\n")
    return series.load("demo", root)


def _tree(tmp: Path) -> Path:
    tree = tmp / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text(ORIGINAL)
    (tree / "pkg" / "other.py").write_text(ORIGINAL)
    return tree


def _two_patches(tmp: Path) -> dict[str, str]:
    first = ORIGINAL.replace("line 5\n", "line five\n")
    second = first.replace("line 20\n", "line twenty\n")
    return {
        "0001-five.patch": _diff(tmp, "pkg/mod.py", ORIGINAL, first),
        "0002-twenty.patch": _diff(tmp, "pkg/mod.py", first, second),
    }


def test_series_applies_in_order_adds_files_and_is_reproducible(tmp_path: Path) -> None:
    demo = _series(tmp_path, _two_patches(tmp_path), {"pkg/new.py": "x = 1\n"})
    digests = []
    for name in ("one", "two"):
        tree = _tree(tmp_path / name)
        assert patcher.apply_series(demo, tree) == "applied"
        text = (tree / "pkg" / "mod.py").read_text()
        assert "line five\n" in text and "line twenty\n" in text
        assert (tree / "pkg" / "new.py").read_text() == "x = 1\n"
        digests.append(patcher.tree_digest(tree))
    assert digests[0] == digests[1]


def test_patched_tree_is_reported_not_patched_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = _series(tmp_path, _two_patches(tmp_path))
    tree = _tree(tmp_path)
    patcher.apply_series(demo, tree)
    before = patcher.tree_digest(tree)
    assert patcher.apply_series(demo, tree) == "already"
    assert "already patched with this series" in capsys.readouterr().out
    assert patcher.tree_digest(tree) == before


def test_hand_patched_tree_without_stamp_is_refused(tmp_path: Path) -> None:
    demo = _series(tmp_path, _two_patches(tmp_path))
    tree = _tree(tmp_path)
    patcher.apply_series(demo, tree)
    patcher.stamp_path(tree, "demo").unlink()
    with pytest.raises(PipelineError, match="0001-five.patch: already applied to pkg/mod.py"):
        patcher.apply_series(demo, tree)


def test_patch_listed_twice_is_refused(tmp_path: Path) -> None:
    patches = _two_patches(tmp_path)
    with pytest.raises(PipelineError, match=r"series:3: patch 0001-five.patch is listed twice"):
        _series(tmp_path, patches, order=["0001-five.patch", "0001-five.patch"])


def test_stale_patch_names_patch_file_and_hunk_and_leaves_tree_untouched(tmp_path: Path) -> None:
    patches = _two_patches(tmp_path)
    drifted = ORIGINAL.replace("line 5\n", "line five\n").replace("line 19\n", "line 19 changed\n")
    demo = _series(tmp_path, patches)
    tree = _tree(tmp_path)
    # upstream drifted under the second patch's context only
    (tree / "pkg" / "mod.py").write_text(ORIGINAL.replace("line 19\n", "line 19 changed\n"))
    before = patcher.tree_digest(tree)
    with pytest.raises(
        PipelineError, match=r"0002-twenty.patch: hunk #1 of pkg/mod.py does not apply"
    ):
        patcher.apply_series(demo, tree)
    assert patcher.tree_digest(tree) == before, "first patch must not be left half-applied"
    assert drifted != ORIGINAL


def test_offset_hunk_is_refused_as_stale(tmp_path: Path) -> None:
    demo = _series(tmp_path, _two_patches(tmp_path))
    tree = _tree(tmp_path)
    (tree / "pkg" / "mod.py").write_text("extra\n" * 3 + ORIGINAL)
    with pytest.raises(PipelineError, match=r"applies only at line .*offset.*refresh the patch"):
        patcher.apply_series(demo, tree)


def test_new_file_that_exists_upstream_is_refused(tmp_path: Path) -> None:
    demo = _series(tmp_path, _two_patches(tmp_path), {"pkg/other.py": "ours\n"})
    tree = _tree(tmp_path)
    before = patcher.tree_digest(tree)
    with pytest.raises(PipelineError, match=r"would overwrite upstream: pkg/other.py"):
        patcher.apply_series(demo, tree)
    assert patcher.tree_digest(tree) == before


def test_missing_patch_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"series:2: patch 0009-gone.patch does not exist"):
        _series(tmp_path, {}, order=["0009-gone.patch"])


def test_real_series_patch_fresh_pinned_sources_reproducibly(
    tmp_path: Path, real_pins, real_file
) -> None:  # noqa: ANN001
    real_file("vllm-sdist"), real_file("gguf-plugin-wheel")
    import os

    os.environ["FRONTIER_CACHE"] = str(Path(real_file("vllm-sdist")).parent.parent)
    first = patched_trees(real_pins, tmp_path / "a", "sdist", ["vllm", "vllm-gguf-plugin"])
    second = patched_trees(real_pins, tmp_path / "b", "sdist", ["vllm", "vllm-gguf-plugin"])
    assert first == second
    for rel in series.load("vllm").files:
        assert (tmp_path / "a" / "vllm" / rel).is_file()


def test_check_tree_refuses_an_empty_expectation(tmp_path: Path) -> None:
    """A plain `docker build` without the staged context's build arguments must fail,
    not build an image whose tree labels are empty."""
    from pipeline import image

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("x = 1\n")
    with pytest.raises(PipelineError, match="no expected tree digest .*build-image.sh"):
        image.check_tree(tree, "", "vllm")
    digest = patcher.tree_digest(tree)
    assert image.check_tree(tree, digest, "vllm") == digest
    with pytest.raises(PipelineError, match="differs from the label"):
        image.check_tree(tree, "0" * 64, "vllm")


def test_report_goes_on_after_a_failure_and_names_each_patch(tmp_path: Path) -> None:
    """The next-vLLM report: offset -> refresh (applied), drift -> FAILS, rest tried."""
    first = ORIGINAL.replace("line 5\n", "line five\n")
    third = ORIGINAL.replace("line 28\n", "line twenty-eight\n")
    patches = {
        "0001-five.patch": _diff(tmp_path, "pkg/mod.py", ORIGINAL, first),
        "0002-other.patch": _diff(
            tmp_path, "pkg/other.py", ORIGINAL, ORIGINAL.replace("line 9\n", "nine\n")
        ),
        "0003-late.patch": _diff(tmp_path, "pkg/other.py", ORIGINAL, third),
    }
    demo = _series(tmp_path, patches, {"pkg/new.py": "ours\n", "pkg/mod.py": "clash\n"})
    tree = _tree(tmp_path)
    (tree / "pkg" / "mod.py").write_text("extra\n" + ORIGINAL)  # 0001 moves by one line
    (tree / "pkg" / "other.py").write_text(ORIGINAL.replace("line 10\n", "line 10 changed\n"))
    rows = {item: (status, detail) for item, status, detail in patcher.report_series(demo, tree)}
    assert rows["files/pkg/new.py"][0] == "applies"
    assert rows["files/pkg/mod.py"] == ("FAILS", "upstream now has this file")
    assert rows["0001-five.patch"][0] == "refresh" and "offset 1 line" in rows["0001-five.patch"][1]
    assert rows["0002-other.patch"] == (
        "FAILS",
        "hunk #1 of pkg/other.py does not apply (at line 6)",
    )
    assert rows["0003-late.patch"] == ("applies", "")  # tried although 0002 failed
    assert "line five" in (tree / "pkg" / "mod.py").read_text()
