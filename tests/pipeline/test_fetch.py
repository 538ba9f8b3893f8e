"""The fetch step against real package indexes served from this machine."""

from pathlib import Path

import pytest

from pipeline import fetch, pins
from pipeline.errors import PipelineError

from .conftest import _LyingHandler, make_index, pin_for, write_pins

PAYLOAD = b"pinned bytes " * 40_000  # ~520 KB, several chunks


def _setup(tmp_path: Path, served: bytes, pinned: bytes) -> tuple[pins.Pins, Path]:
    index = make_index(tmp_path / "idx", "demo-pkg", {"demo_pkg-1.0.tar.gz": served})
    path = write_pins(
        tmp_path / "pins.toml", {"demo": pin_for("demo", "demo-pkg", "demo_pkg-1.0.tar.gz", pinned)}
    )
    return pins.load(path), index


def test_fetch_through_pip_index_url_and_offline_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_pip: Path
) -> None:
    loaded, index = _setup(tmp_path, PAYLOAD, PAYLOAD)
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    got = fetch.fetch_all(loaded)["demo"]
    assert got == isolated_pip / "demo_pkg-1.0.tar.gz" and got.read_bytes() == PAYLOAD
    # Warm cache: works with the index gone and pip pointed nowhere.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    assert fetch.fetch_all(loaded)["demo"].read_bytes() == PAYLOAD
    assert fetch.verify_all(loaded) == []


def test_fetch_over_http_uses_pip_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_index: tuple[str, Path]
) -> None:
    url, www = http_index
    make_index(www, "demo-pkg", {"demo_pkg-1.0.tar.gz": PAYLOAD})
    path = write_pins(
        tmp_path / "pins.toml",
        {"demo": pin_for("demo", "demo-pkg", "demo_pkg-1.0.tar.gz", PAYLOAD)},
    )
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = {url}/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert fetch.fetch_all(pins.load(path))["demo"].read_bytes() == PAYLOAD


def test_wrong_sha256_names_file_and_both_hashes_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_pip: Path
) -> None:
    loaded, index = _setup(tmp_path, PAYLOAD + b"tampered", PAYLOAD)
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    pinned = loaded.file("demo").sha256
    with pytest.raises(PipelineError) as err:
        fetch.fetch_all(loaded)
    message = str(err.value)
    assert "sha256 mismatch for demo_pkg-1.0.tar.gz" in message
    assert f"expected {pinned}" in message and "actual   " in message
    assert not any(isolated_pip.iterdir())


def test_truncated_download_is_an_error_and_keeps_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    http_index: tuple[str, Path],
    isolated_pip: Path,
) -> None:
    url, www = http_index
    make_index(www, "demo-pkg", {"demo_pkg-1.0.tar.gz": PAYLOAD})
    _LyingHandler.truncate = {"demo_pkg-1.0.tar.gz"}
    path = write_pins(
        tmp_path / "pins.toml",
        {"demo": pin_for("demo", "demo-pkg", "demo_pkg-1.0.tar.gz", PAYLOAD)},
    )
    monkeypatch.setenv("PIP_INDEX_URL", f"{url}/simple")
    with pytest.raises(
        PipelineError, match=r"demo_pkg-1.0.tar.gz: (truncated download|download from .* failed)"
    ):
        fetch.fetch_all(pins.load(path))
    assert not any(isolated_pip.iterdir())


def test_missing_file_lists_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, index = _setup(tmp_path, PAYLOAD, PAYLOAD)
    empty = tmp_path / "empty" / "simple"
    empty.mkdir(parents=True)
    monkeypatch.setenv("PIP_INDEX_URL", empty.as_uri())
    with pytest.raises(
        PipelineError, match="demo_pkg-1.0.tar.gz .* not found through pip's configuration"
    ):
        fetch.fetch_all(loaded)


def test_corrupted_cache_is_detected_by_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_pip: Path
) -> None:
    loaded, index = _setup(tmp_path, PAYLOAD, PAYLOAD)
    monkeypatch.setenv("PIP_INDEX_URL", index.as_uri())
    cached = fetch.fetch_all(loaded)["demo"]
    cached.write_bytes(PAYLOAD[:-1])
    problems = fetch.verify_all(loaded)
    assert len(problems) == 1 and "mismatch demo_pkg-1.0.tar.gz" in problems[0]
    # fetch repairs it from the index
    assert fetch.fetch_all(loaded)["demo"].read_bytes() == PAYLOAD


def test_find_links_folder_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    links = tmp_path / "links"
    links.mkdir()
    (links / "demo_pkg-1.0.tar.gz").write_bytes(PAYLOAD)
    path = write_pins(
        tmp_path / "pins.toml",
        {"demo": pin_for("demo", "demo-pkg", "demo_pkg-1.0.tar.gz", PAYLOAD)},
    )
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert fetch.fetch_all(pins.load(path))["demo"].read_bytes() == PAYLOAD
