"""Bad input by class: every case exits 2 with `frontier-serve: error:` naming the
input, before anything starts, and never with a traceback."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import gguf
import pytest

from entrypoint.argv.vllm_options import DICT_OR_STR, JSON, OptionTable, json_shapes, kind_of
from entrypoint.errors import ConfigError
from entrypoint.start import gguf_config, preflight
from entrypoint.watch import probe
from entrypoint.watch.statusfile import process_start, read_json, write_ready
from tests.entrypoint.recording import Recorder, invoke


def refused(env: dict[str, str], *args: str, command: str = "render") -> str:
    result = invoke(env, command, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "frontier-serve: error:" in result.output
    return result.output


# Class 1: ranges and meaning, from vLLM's config bounds and our table.
@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("SERVE_PORT", "70000", "--port must be >= 1 and <= 65535"),
        ("SERVE_PORT", "-1", "--port must be >= 1"),
        ("SERVE_PORT", "0", "random port the watcher cannot find"),
        ("SERVE_TENSOR_PARALLEL_SIZE", "0", "--tensor-parallel-size must be >= 1"),
        ("SERVE_TENSOR_PARALLEL_SIZE", "-1", "--tensor-parallel-size must be >= 1"),
        ("SERVE_TENSOR_PARALLEL_SIZE", str(10**20), "<= 4096"),
        ("SERVE_PIPELINE_PARALLEL_SIZE", "0", "--pipeline-parallel-size must be >= 1"),
        ("SERVE_GPU_MEMORY_UTILIZATION", "1.5", "--gpu-memory-utilization must be > 0 and <= 1"),
        ("SERVE_GPU_MEMORY_UTILIZATION", "0", "--gpu-memory-utilization must be > 0"),
        ("SERVE_GPU_MEMORY_UTILIZATION", "nan", "must be a finite number"),
        ("SERVE_GPU_MEMORY_UTILIZATION", "inf", "must be a finite number"),
        ("SERVE_MAX_NUM_SEQS", "0", "--max-num-seqs must be >= 1"),
        ("SERVE_MAX_NUM_BATCHED_TOKENS", "0", "--max-num-batched-tokens must be >= 1"),
        ("SERVE_BLOCK_SIZE", "0", "--block-size must be > 0"),
        ("SERVE_MAX_MODEL_LEN", "0", "--max-model-len must be >= -1 and not 0"),
        ("SERVE_MAX_MODEL_LEN", "-2", "--max-model-len must be >= -1 and not 0"),
    ],
)
def test_out_of_range_values_are_refused(
    vllm_table, base_env: dict[str, str], name: str, value: str, words: str
) -> None:
    output = refused({**base_env, name: value})
    assert f"{name}" in output and words in output


@pytest.mark.parametrize(
    ("name", "value"),
    [("SERVE_PORT", "65535"), ("SERVE_GPU_MEMORY_UTILIZATION", "1"),
     ("SERVE_TENSOR_PARALLEL_SIZE", "8"), ("SERVE_MAX_NUM_SEQS", "1"),
     ("SERVE_MAX_MODEL_LEN", "-1"), ("SERVE_MAX_MODEL_LEN", "1"), ("SERVE_MAX_MODEL_LEN", "32k")],
)  # fmt: skip
def test_values_at_the_edge_of_the_range_pass(
    vllm_table, base_env: dict[str, str], name: str, value: str
) -> None:
    result = invoke({**base_env, name: value}, "render")
    assert result.exit_code == 0, result.output


def test_vllm_declared_bounds_are_found_through_the_option_groups(vllm_table) -> None:
    """If vLLM renames its groups, the lookup must not silently find nothing."""
    from entrypoint.argv.option_checks import vllm_bounds
    from entrypoint.argv.vllm_options import vllm_parser

    bounds = vllm_bounds(vllm_parser())
    assert len(bounds) >= 30
    assert bounds["gpu_memory_utilization"].words() == "> 0 and <= 1"
    assert bounds["tensor_parallel_size"].words() == ">= 1"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"SERVE_HEALTH_INTERVAL": "inf"}, "SERVE_HEALTH_INTERVAL='inf': must be a number from"),
        ({"SERVE_HEALTH_INTERVAL": "nan"}, "SERVE_HEALTH_INTERVAL='nan': must be a number from"),
        ({"SERVE_HEALTH_INTERVAL": "0"}, "SERVE_HEALTH_INTERVAL='0': must be a number from 0.1"),
        ({"SERVE_HEALTH_TIMEOUT": "-inf"}, "SERVE_HEALTH_TIMEOUT='-inf'"),
        ({"SERVE_STALE_AFTER": "inf"}, "SERVE_STALE_AFTER='inf': must be a number from 1"),
        ({"SERVE_STALE_AFTER": "5"}, "SERVE_STALE_AFTER=5: must exceed SERVE_HEALTH_INTERVAL"),
        ({"SERVE_HEALTH_FAILURES": "0"}, "SERVE_HEALTH_FAILURES='0': must be from 1 to 1000"),
        ({"SERVE_HEALTH_FAILURES": "2.5"}, "SERVE_HEALTH_FAILURES='2.5': expected a whole number"),
    ],
)
def test_our_timing_settings_must_be_finite_and_consistent(
    vllm_table, base_env: dict[str, str], recorder: Recorder, extra: dict[str, str], words: str
) -> None:
    output = refused({**base_env, **extra}, command="serve")
    assert words in output
    assert recorder.exec_argv is None and recorder.popen_args is None


def test_ready_and_status_file_must_be_two_files(
    vllm_table, base_env: dict[str, str], recorder: Recorder
) -> None:
    env = {**base_env, "SERVE_STATUS_FILE": base_env["SERVE_READY_FILE"]}
    assert "SERVE_READY_FILE and SERVE_STATUS_FILE both name" in refused(env, command="serve")
    assert recorder.exec_argv is None


# Class 2: JSON of the wrong shape.
@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("SERVE_SPECULATIVE_CONFIG", '[{"method": "mtp"}]', "must be a JSON object, got a"),
        ("SERVE_COMPILATION_CONFIG", "3", "must be a JSON object, got JSON int"),
        ("SERVE_LIMIT_MM_PER_PROMPT", "[1]", "must be a JSON object"),
        ("SERVE_KV_TRANSFER_CONFIG", '"x"', "must be a JSON object, got JSON str"),
        ("SERVE_ALLOWED_ORIGINS", '{"a": 1}', "must be a JSON array, got a JSON object"),
        ("SERVE_HF_OVERRIDES", "[1]", "takes a JSON object or a plain string, not an array"),
    ],
)  # fmt: skip
def test_json_of_the_wrong_shape_is_refused(
    vllm_table, base_env: dict[str, str], name: str, value: str, words: str
) -> None:
    output = refused({**base_env, name: value})
    assert name in output and words in output


def test_json_of_the_right_shape_passes(vllm_table, base_env: dict[str, str]) -> None:
    env = {
        **base_env,
        "SERVE_SPECULATIVE_CONFIG": '{"method": "mtp", "num_speculative_tokens": 1}',
        "SERVE_ALLOWED_ORIGINS": '["*"]',
        "SERVE_HF_OVERRIDES": '{"rope_theta": 10000}',
    }
    assert invoke(env, "render").exit_code == 0


def test_every_json_option_has_a_known_shape(vllm_table: OptionTable) -> None:
    """The shape comes from vLLM's annotations; only a str-or-dict option may admit any."""
    unknown = sorted(
        option
        for option, action in vllm_table.actions.items()
        if kind_of(action) in (JSON, DICT_OR_STR) and not json_shapes(action)
    )
    assert unknown == ["--pt-load-map-location"]
    arrays = sorted(
        o for o, a in vllm_table.actions.items()
        if kind_of(a) == JSON and json_shapes(a) == {"a JSON array"}
    )  # fmt: skip
    assert arrays == ["--allowed-headers", "--allowed-methods", "--allowed-origins"]


# Class 3: SERVE_EXTRA_ARGS never overrides a SERVE_* option.
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('["--port", "9000"]', "SERVE_EXTRA_ARGS sets --port, which SERVE_PORT already sets"),
        ('["--port=9000"]', "SERVE_EXTRA_ARGS sets --port, which SERVE_PORT already sets"),
        ('["--model", "/x"]', "SERVE_EXTRA_ARGS sets --model, which SERVE_MODEL already sets"),
        ('["--seed", "1", "--seed", "2"]', "SERVE_EXTRA_ARGS sets --seed twice"),
    ],
)
def test_extra_args_may_not_repeat_an_option(
    vllm_table, base_env: dict[str, str], extra: str, words: str
) -> None:
    assert words in refused({**base_env, "SERVE_EXTRA_ARGS": extra})


def test_extra_args_may_repeat_a_bool_only_through_one_source(
    vllm_table, base_env: dict[str, str]
) -> None:
    env = {**base_env, "SERVE_ENFORCE_EAGER": "true", "SERVE_EXTRA_ARGS": '["--no-enforce-eager"]'}
    assert "which SERVE_ENFORCE_EAGER already sets" in refused(env)


# Class 4: tracebacks become errors.
def test_env_file_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_bytes(b"SERVE_MODEL=\xff\xfe\n")
    for command in ("render", "serve", "probe", "status"):
        output = refused({}, "--env-file", str(bad), command=command)
        assert f"env file {bad}: not UTF-8 text (byte 0xff at offset 12)" in output


def test_ready_file_that_is_a_directory(
    vllm_table, base_env: dict[str, str], recorder: Recorder, tmp_path: Path
) -> None:
    folder = tmp_path / "ready-dir"
    folder.mkdir()
    output = refused({**base_env, "SERVE_READY_FILE": str(folder)}, command="serve")
    assert f"SERVE_READY_FILE={folder}: is a directory" in output
    output = refused({**base_env, "SERVE_STATUS_FILE": str(folder)}, command="serve")
    assert f"SERVE_STATUS_FILE={folder}: is a directory" in output
    assert recorder.exec_argv is None


def _llama_header_gguf(path: Path) -> Path:
    """A GGUF with only an architecture: enough to reach the config cache."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("cache", ["a-file", "a-file/below"])
def test_gguf_config_cache_that_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("FRONTIER_CACHE", str(tmp_path / cache))
    model = _llama_header_gguf(tmp_path / "m.gguf")
    with pytest.raises(ConfigError, match="FRONTIER_CACHE: cannot write the GGUF config cache"):
        gguf_config.extract(model)


@pytest.mark.parametrize(
    "content",
    [b"", b"GGUF", b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", 2**62) + b"ab",
     b"GGUF" + struct.pack("<IQQ", 3, 2**60, 2**60)],
)  # fmt: skip
def test_bare_gguf_that_is_empty_or_absurd(
    vllm_table, base_env: dict[str, str], recorder: Recorder, tmp_path: Path, content: bytes
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(content)
    output = refused({**base_env, "SERVE_MODEL": str(model)}, command="serve")
    assert str(model) in output or "m.gguf" in output
    assert recorder.exec_argv is None


# Class 5: no false readiness, no false health.
def _ready_for(path: Path, heartbeat: float, pid_start: str | None, stale: object = 15) -> None:
    write_ready(
        str(path),
        {"phase": "ready", "pid": os.getpid(), "heartbeat": heartbeat, "argv_digest": "x",
         "stale_after": stale, "pid_start": pid_start},
    )  # fmt: skip


def test_probe_accepts_a_fresh_file_of_this_process(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    _ready_for(ready, time.time(), process_start(os.getpid()))
    assert probe.probe(str(ready))[0] == 0


@pytest.mark.parametrize(
    ("heartbeat", "pid_start", "stale", "words"),
    [
        (time.time() + 3600, "own", 15, "in the future"),
        (None, "own", "nan", "stale limit nan"),
        (None, "own", "inf", "stale limit inf"),
        (None, "own", "-1", "stale limit -1"),
        ("nan", "own", 15, "unreadable readiness file"),
        (None, "12345", 15, "from an earlier run of pid"),
        (None, None, 15, "from an earlier run of pid"),
    ],
)
def test_probe_refuses_a_file_it_cannot_trust(
    tmp_path: Path, heartbeat: object, pid_start: str | None, stale: object, words: str
) -> None:
    ready = tmp_path / "ready"
    own = process_start(os.getpid())
    _ready_for(ready, time.time() if heartbeat is None else heartbeat,  # type: ignore[arg-type]
               own if pid_start == "own" else pid_start, stale)  # fmt: skip
    code, line = probe.probe(str(ready))
    assert code == 1 and words in line, line


def test_probe_max_age_must_be_a_positive_finite_number(tmp_path: Path) -> None:
    for value in ("nan", "inf", "0", "-5"):
        assert probe.main(["probe", "--ready-file", str(tmp_path / "r"), "--max-age", value]) == 2


def test_status_names_a_corrupt_status_file(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text('{"phase": "re')
    code, text = probe.status_text(str(tmp_path / "ready"))
    assert code == 1 and "corrupt status file" in text
    (tmp_path / "status.json").write_text("[1, 2]")
    assert "not a JSON object" in probe.status_text(str(tmp_path / "ready"))[1]
    (tmp_path / "status.json").unlink()
    assert "no status file at" in probe.status_text(str(tmp_path / "ready"))[1]


def test_a_new_start_voids_the_old_ready_file_before_it_validates(
    vllm_table, base_env: dict[str, str], recorder: Recorder
) -> None:
    """A container restart keeps /run/serve: the file from the last run, fresh and with
    a live pid, must stop passing the probe as soon as the new start begins, even when
    the new start then fails its checks."""
    ready = Path(base_env["SERVE_READY_FILE"])
    ready.parent.mkdir(parents=True)
    _ready_for(ready, time.time(), process_start(os.getpid()))
    assert probe.probe(str(ready))[0] == 0
    refused({**base_env, "SERVE_MAX_NUM_SEQS": "0"}, command="serve")
    assert not ready.exists()
    assert probe.probe(str(ready))[0] == 1
    status = read_json(str(ready.parent / "status.json"))
    assert status is not None and status["phase"] == "exited" and status["exit_code"] == 2
    assert "SERVE_MAX_NUM_SEQS" in status["reason"]


# Class 8: Kubernetes' service-link VLLM_PORT.
def test_a_service_link_vllm_port_is_dropped_with_a_warning(
    vllm_table, base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, str | None] = {}

    def run_module(module: str, args: list[str]) -> int:  # what vLLM would see
        seen["VLLM_PORT"] = os.environ.get("VLLM_PORT")
        return 0

    rec = Recorder()
    import entrypoint.start.serve as serve_module
    from entrypoint.start import vllm_in_process

    monkeypatch.setattr(vllm_in_process, "run_module", run_module)
    monkeypatch.setattr(serve_module.subprocess, "Popen", rec.popen)
    monkeypatch.setenv("VLLM_PORT", "tcp://10.96.0.12:8000")
    result = invoke({**base_env, "VLLM_PORT": "tcp://10.96.0.12:8000"}, "serve")
    assert "warning: ignoring VLLM_PORT='tcp://10.96.0.12:8000': not a port number" in result.output
    assert "enableServiceLinks: false" in result.output
    assert seen == {"VLLM_PORT": None}
    monkeypatch.setenv("VLLM_PORT", "29600")  # a real port number is the user's and stays
    result = invoke({**base_env, "VLLM_PORT": "29600"}, "serve")
    assert "VLLM_PORT" not in result.output and seen == {"VLLM_PORT": "29600"}


def test_the_status_says_validating_while_the_checks_run(tmp_path: Path) -> None:
    from entrypoint.start.serve import mark_validating

    ready = tmp_path / "ready"
    _ready_for(ready, time.time(), process_start(os.getpid()))
    mark_validating({"SERVE_READY_FILE": str(ready)})
    status = read_json(str(tmp_path / "status.json"))
    assert not ready.exists()
    assert status is not None and status["phase"] == "validating" and status["pid"] == os.getpid()


@pytest.mark.parametrize(("name", "value"), [("FRONTIER_GGUF_READS", "fast"),
                                             ("FRONTIER_GGUF_READERS", "0"),
                                             ("FRONTIER_GGUF_READERS", "65"),
                                             ("FRONTIER_GGUF_READERS", "two")])
def test_gguf_read_settings_are_checked_before_the_start(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        preflight.check_gguf_reads({name: value})
    preflight.check_gguf_reads({"FRONTIER_GGUF_READS": "mmap", "FRONTIER_GGUF_READERS": "64"})


def test_gguf_read_settings_match_the_plugins() -> None:
    reads = pytest.importorskip("vllm_gguf_plugin.gguf_reads")
    assert (preflight.GGUF_READS, preflight.GGUF_READS_MODES) == (reads.MODE_ENV, reads.MODES)
    assert preflight.GGUF_READERS == reads.READERS_ENV
