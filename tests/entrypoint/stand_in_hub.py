"""A stand-in Hugging Face hub on 127.0.0.1: what huggingface_hub asks for, nothing more.

It serves one commit of each repo it is given, through the routes huggingface_hub
(1.x and 2.x) uses for `snapshot_download`:
- GET /api/models/{repo}/revision/{rev}: model info with `sha` and `siblings`;
- GET /api/models/{repo}/tree/{rev}?recursive=...: the file list, one page;
- HEAD/GET /{repo}/resolve/{rev}/{file}: the file, with X-Repo-Commit, ETag and
  Content-Length, which `get_hf_file_metadata` reads.
Every request is recorded, so a test can show which files were never asked for. A repo
in `private` answers only requests carrying its token (as `Authorization: Bearer`), and
401 with X-Error-Code RepoNotFound otherwise, like the hub.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from fixtures.loopback import loopback_server

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class StandInHub:
    url: str
    repos: dict[str, dict[str, bytes]]
    private: dict[str, str] = field(default_factory=dict)  # repo -> the token it wants
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)

    def requested_files(self) -> set[str]:
        """Repo files whose content or metadata was asked for (resolve URLs)."""
        return {path.split("/resolve/", 1)[1].split("/", 1)[1]
                for _, path in self.requests if "/resolve/" in path}  # fmt: skip


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


def _handler(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet test output
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, value: object, head: bool = False) -> None:
            self._send(200, json.dumps(value).encode(),
                       {"Content-Type": "application/json"}, head)  # fmt: skip

        def _missing(self, code: str, head: bool) -> None:
            self._send(404, b"{}", {"X-Error-Code": code, "Content-Type": "application/json"},
                       head)  # fmt: skip

        def _route(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            for repo, token in hub.private.items():
                if f"/{repo}/" in path and self.headers.get("Authorization") != f"Bearer {token}":
                    return self._send(401, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                for repo, files in hub.repos.items():
                    if rest.startswith(f"{repo}/revision/"):
                        return self._json({
                            "id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                            "siblings": [{"rfilename": name} for name in files],
                        }, head)  # fmt: skip
                    if rest.startswith(f"{repo}/tree/"):
                        return self._json([
                            {"type": "file", "path": name, "size": len(data),
                             "oid": _blob_id(data)} for name, data in files.items()
                        ], head)  # fmt: skip
                return self._missing("RepoNotFound", head)
            for repo, files in hub.repos.items():
                prefix = f"/{repo}/resolve/"
                if path.startswith(prefix):
                    name = path[len(prefix):].split("/", 1)[1]
                    if name not in files:
                        return self._missing("EntryNotFound", head)
                    data = files[name]
                    return self._send(200, data, {
                        "X-Repo-Commit": COMMIT, "ETag": f'"{_blob_id(data)}"',
                        "Content-Type": "application/octet-stream",
                    }, head)  # fmt: skip
            return self._missing("RepoNotFound", head)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._route(head=False)

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(head=True)

    return Handler


@contextmanager
def running_stand_in_hub(
    repos: dict[str, dict[str, bytes]], private: dict[str, str] | None = None
) -> Iterator[StandInHub]:
    hub = StandInHub("", repos, dict(private or {}))
    with loopback_server(_handler(hub)) as hub.url:
        yield hub
