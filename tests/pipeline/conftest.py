"""Fixtures for the build-pipeline tests: private caches, pins files and
package indexes served from the test's own folders (file:// or 127.0.0.1)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.loopback import loopback_server
from pipeline import paths, pins

# Captured before any fixture points FRONTIER_CACHE at a temp folder: real
# upstream files come from the user's normal cache, not a 500 MB download.
REAL_CACHE = paths.cache_dir()


@pytest.fixture(autouse=True)
def isolated_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private cache and a pip configuration with no files, no find-links."""
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("FRONTIER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "pins"


# One well-formed entry: a pins file with none is refused (it would verify as all-green).
SOME_PIN = {"project": "some", "version": "1", "filename": "some-1.whl", "sha256": "0" * 64}


def write_pins(
    path: Path, files: dict[str, dict[str, str]], git: dict[str, str] | None = None
) -> Path:
    lines = []
    for key, entry in files.items():
        lines.append(f"[files.{key}]")
        lines += [f'{field} = "{value}"' for field, value in entry.items()]
    if git is not None:
        lines.append("[vllm-git]")
        lines += [f'{field} = "{value}"' for field, value in git.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_index(root: Path, project: str, files: dict[str, bytes]) -> Path:
    """A PEP 503 simple index holding files for one project."""
    page = root / "simple" / project
    page.mkdir(parents=True, exist_ok=True)
    anchors = []
    for name, data in files.items():
        (page / name).write_bytes(data)
        anchors.append(f'<a href="{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>')
    (page / "index.html").write_text("<html><body>" + "\n".join(anchors) + "</body></html>")
    return root / "simple"


def pin_for(key: str, project: str, name: str, data: bytes) -> dict[str, str]:
    return {
        "project": project,
        "version": "1.0",
        "filename": name,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


class _LyingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves an index; for files it announces more bytes than it sends."""

    truncate: set[str] = set()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        name = self.path.rsplit("/", 1)[-1]
        if name in self.truncate:
            data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()
    try:
        with loopback_server(functools.partial(_LyingHandler, directory=str(www))) as url:
            yield url, www
    finally:
        _LyingHandler.truncate = set()


@pytest.fixture(scope="session")
def real_pins() -> pins.Pins:
    return pins.load()


@pytest.fixture(scope="session")
def real_file(real_pins: pins.Pins):  # noqa: ANN201
    """Path of a real pinned upstream file in the shared cache (fetched once)."""

    def get(key: str) -> Path:
        path = REAL_CACHE / real_pins.file(key).filename
        if not path.is_file():
            pytest.fail(f"{path} missing: run `make fetch` before the tests")
        return path

    return get
