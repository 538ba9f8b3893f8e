"""Our index and download requests outlast a brief network fault, and only that."""

import http.server
import json
import urllib.error
from collections.abc import Iterator

import pytest

from fixtures.loopback import loopback_server
from pipeline import lock_wheels, net, pipconfig


class _FlakyIndex(http.server.BaseHTTPRequestHandler):
    """Answers `fail` times with `status`, then with a PEP 691 project page."""

    status = 503
    fail = 2
    seen = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        cls = type(self)
        cls.seen += 1
        if cls.seen <= cls.fail:
            self.send_error(cls.status)
            return
        wheel = {"filename": "demo_pkg-1.0-py3-none-any.whl", "hashes": {"sha256": "ab"}}
        body = json.dumps({"files": [wheel]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", lock_wheels.JSON_ACCEPT)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    _FlakyIndex.seen = 0
    with loopback_server(_FlakyIndex) as url:
        yield url


def test_lock_wheels_outlasts_two_503s_and_says_so(
    flaky: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(net, "DELAYS", (0.01, 0.01, 0.01))
    monkeypatch.setattr(_FlakyIndex, "status", 503)
    config = pipconfig.PipConfig(index_urls=[f"{flaky}/simple"])
    files = lock_wheels.index_files("demo-pkg", config)
    assert files == [("demo_pkg-1.0-py3-none-any.whl", "ab", "", False)]
    assert _FlakyIndex.seen == 3
    err = capsys.readouterr().err
    assert err.count("network: ") == 2 and "try 3 of 4" in err


def test_a_404_is_not_tried_again(flaky: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_FlakyIndex, "status", 404)
    sleeps: list[float] = []
    with pytest.raises(urllib.error.HTTPError):
        net.urlopen(f"{flaky}/simple/demo-pkg/", context=None, timeout=5, sleep=sleeps.append)
    assert sleeps == [] and _FlakyIndex.seen == 1


def test_a_name_that_does_not_resolve_is_tried_each_delay_then_raised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sleeps: list[float] = []
    # .invalid never resolves (RFC 2606): the fault CI met, a failed name lookup.
    with pytest.raises(urllib.error.URLError):
        net.urlopen("http://pypi.invalid/simple/", context=None, timeout=5,
                    delays=(1, 2), sleep=sleeps.append)  # fmt: skip
    assert sleeps == [1, 2]
    assert capsys.readouterr().err.count("network: http://pypi.invalid/simple/") == 2


def test_what_is_transient() -> None:
    assert net.transient(urllib.error.URLError(ConnectionRefusedError()))
    assert net.transient(urllib.error.URLError(TimeoutError()))
    assert not net.transient(urllib.error.URLError("unknown url type"))
    assert not net.transient(urllib.error.URLError(FileNotFoundError()))
    assert not net.transient(urllib.error.HTTPError("u", 403, "forbidden", {}, None))  # type: ignore[arg-type]
    assert net.transient(urllib.error.HTTPError("u", 429, "slow down", {}, None))  # type: ignore[arg-type]
