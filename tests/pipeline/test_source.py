"""The source step: the sdist by default, or a pinned git commit. The git path
is tested offline against a file:// repository made from the real sdist."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline import pins, source
from pipeline.errors import PipelineError

from .conftest import SOME_PIN, write_pins

GIT_ENV = ["-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_ENV, *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def sdist_repo(tmp_path_factory: pytest.TempPathFactory, real_file) -> tuple[Path, str, str]:  # noqa: ANN001
    """A git repository holding the pinned vLLM sdist, tagged v0.32.0, plus a
    PR-style branch one commit ahead."""
    repo = source.unpack_sdist(
        real_file("vllm-sdist"), tmp_path_factory.mktemp("upstream") / "vllm"
    )
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "vLLM 0.32.0 from the sdist")
    _git(repo, "tag", "v0.32.0")
    tagged = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "pr-branch")
    (repo / "PR_NOTE.md").write_text("a change under review\n")
    _git(repo, "add", "PR_NOTE.md")
    _git(repo, "commit", "-q", "-m", "PR change")
    _git(repo, "update-ref", "refs/pull/1/head", "HEAD")
    pr = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    return repo, tagged, pr


def _git_pins(tmp_path: Path, repo: Path, ref: str, commit: str) -> pins.Pins:
    git = {"url": repo.as_uri(), "ref": ref, "commit": commit}
    return pins.load(write_pins(tmp_path / "pins.toml", {"some": SOME_PIN}, git))


def test_sdist_tree_has_pinned_version(tmp_path: Path, real_file, real_pins) -> None:  # noqa: ANN001
    tree = source.unpack_sdist(real_file("vllm-sdist"), tmp_path / "vllm")
    assert source.source_version(tree) == real_pins.file("vllm-sdist").version
    assert (tree / "vllm" / "platforms" / "cuda.py").is_file()


def test_git_tag_checks_out_the_pinned_commit(tmp_path: Path, sdist_repo) -> None:  # noqa: ANN001
    repo, tagged, _ = sdist_repo
    tree = source.clone_git(
        _git_pins(tmp_path, repo, "refs/tags/v0.32.0", tagged), tmp_path / "tree"
    )
    assert _git(tree, "rev-parse", "HEAD") == tagged
    assert source.source_version(tree) == "0.32.0"


def test_git_pull_ref_checks_out_the_pinned_commit(tmp_path: Path, sdist_repo) -> None:  # noqa: ANN001
    repo, _, pr = sdist_repo
    tree = source.clone_git(_git_pins(tmp_path, repo, "refs/pull/1/head", pr), tmp_path / "tree")
    assert (tree / "PR_NOTE.md").is_file()
    assert source.source_version(tree) == "0.32.0"  # based on the release, so its binaries fit


def test_git_ref_at_another_commit_is_refused(tmp_path: Path, sdist_repo) -> None:  # noqa: ANN001
    repo, tagged, pr = sdist_repo
    with pytest.raises(
        PipelineError, match=f"refs/pull/1/head is at commit {pr}, but .* pins {tagged}"
    ):
        source.clone_git(_git_pins(tmp_path, repo, "refs/pull/1/head", tagged), tmp_path / "tree")
    assert not (tmp_path / "tree").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tree")], "staging left behind"


def test_git_ref_that_does_not_exist_is_refused(tmp_path: Path, sdist_repo) -> None:  # noqa: ANN001
    repo, tagged, _ = sdist_repo
    with pytest.raises(PipelineError, match="git fetch .* failed"):
        source.clone_git(_git_pins(tmp_path, repo, "refs/pull/999/head", tagged), tmp_path / "tree")
    assert not (tmp_path / "tree").exists()


def test_git_pin_without_commit_is_refused_before_cloning(tmp_path: Path, sdist_repo) -> None:  # noqa: ANN001
    repo, _, _ = sdist_repo
    with pytest.raises(PipelineError, match="commit must be the full 40-hex SHA"):
        source.clone_git(_git_pins(tmp_path, repo, "refs/tags/v0.32.0", ""), tmp_path / "tree")


def _tarball(path: Path, *members: tuple[str, str, str]) -> Path:
    """A .tar.gz with members (name, kind, link target or content)."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = extra.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "sym": tarfile.SYMTYPE,
                "hard": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            info.linkname = extra
            tar.addfile(info)
    return path


@pytest.fixture(params=["with data_filter", "python 3.11.2 without data_filter"])
def tarfile_like(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each unpack test as on Python >= 3.11.4 and as on the builder's 3.11.2,
    where TarFile.extractall() takes no `filter` argument."""
    import tarfile

    if request.param.startswith("python 3.11.2"):
        original = tarfile.TarFile.extractall

        def old_extractall(self, path=".", members=None, *, numeric_owner=False):  # noqa: ANN001, ANN202
            return original(self, path, members, numeric_owner=numeric_owner)

        monkeypatch.delattr(tarfile, "data_filter", raising=False)
        monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)
    return request.param


def test_sdist_unpacks_without_tarfile_filter(tmp_path: Path, tarfile_like: str) -> None:
    archive = _tarball(
        tmp_path / "pkg-1.0.tar.gz",
        ("pkg-1.0", "dir", ""),
        ("pkg-1.0/PKG-INFO", "file", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n"),
        ("pkg-1.0/src/a.py", "file", "x = 1\n"),
        ("pkg-1.0/link.py", "sym", "src/a.py"),
    )
    tree = source.unpack_sdist(archive, tmp_path / "tree")
    assert source.sdist_version(tree) == "1.0"
    assert (tree / "link.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("/etc/evil", "file", "x"), "absolute"),
        (("pkg-1.0/../../evil", "file", "x"), "'..'"),
        (("pkg-1.0/out", "sym", "/etc/passwd"), "leaves the tree"),
        (("pkg-1.0/out", "sym", "../../etc/passwd"), "leaves the tree"),
        (("pkg-1.0/hard", "hard", "../outside"), "leaves the tree"),
        (("pkg-1.0/dev", "chr", ""), "device"),
        (("pkg-1.0/fifo", "fifo", ""), "fifo"),
    ],
)
def test_unsafe_sdist_members_are_refused(
    tmp_path: Path, tarfile_like: str, member: tuple[str, str, str], why: str
) -> None:
    archive = _tarball(
        tmp_path / "pkg-1.0.tar.gz",
        ("pkg-1.0/PKG-INFO", "file", "Version: 1.0\n"),
        member,
    )
    with pytest.raises(PipelineError, match=why):
        source.unpack_sdist(archive, tmp_path / "tree")
    assert not (tmp_path / "tree").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tree")]
