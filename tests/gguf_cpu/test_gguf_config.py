"""`entrypoint.start.gguf_config`: config and tokenizer from a GGUF with no HF config beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFWriter

from entrypoint.errors import ConfigError
from entrypoint.start.gguf_config import (
    HF_CONFIG_PATH,
    MODEL,
    TOKENIZER,
    gguf_config_env,
    gguf_header_fields,
    main,
    needs_extraction,
)

pytestmark = pytest.mark.vllm  # transformers comes with the CPU tier


def write_gguf(path: Path, arch: str, add_bos: bool | None = None) -> Path:
    writer = GGUFWriter(str(path), arch)
    writer.add_token_list([f"t{i}" for i in range(300)])  # a string array to skip over
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_header_reader_agrees_with_gguf_py(tmp_path: Path) -> None:
    from gguf import GGUFReader

    model = write_gguf(tmp_path / "m.gguf", "gemma3", add_bos=True)
    keys = {"general.architecture", "tokenizer.ggml.add_bos_token", "missing.key"}
    ours = gguf_header_fields(model, keys)
    fields = GGUFReader(model).fields
    assert ours == {k: fields[k].contents() for k in keys if k in fields}
    assert ours["tokenizer.ggml.add_bos_token"] is True


def test_explicit_config_path_wins(gemma_path: Path) -> None:
    env = {MODEL: str(gemma_path), HF_CONFIG_PATH: "/somewhere/else"}
    assert needs_extraction(env) is None
    assert gguf_config_env(env) == {}


def test_nothing_to_do_beside_a_config_or_for_other_models(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "m.gguf", "llama")
    (tmp_path / "config.json").write_text("{}")
    assert gguf_config_env({MODEL: str(model)}) == {}
    assert gguf_config_env({MODEL: "Qwen/Qwen3-0.6B"}) == {}
    assert gguf_config_env({MODEL: str(tmp_path / "missing.gguf")}) == {}


def test_unreadable_architecture_fails_by_name(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = write_gguf(tmp_path / "glm.gguf", "glm-dsa")
    with pytest.raises(ConfigError) as caught:
        gguf_config_env({MODEL: str(model)})
    message = str(caught.value)
    assert "'glm-dsa'" in message and HF_CONFIG_PATH in message
    assert main([str(model)]) == 1
    assert "glm-dsa" in capsys.readouterr().err


def test_gemma_config_and_tokenizer_from_the_file(gemma_path: Path) -> None:
    said: list[str] = []
    updates = gguf_config_env({MODEL: str(gemma_path)}, log=said.append)
    folder = Path(updates[HF_CONFIG_PATH])
    assert updates[TOKENIZER] == str(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["num_hidden_layers"] == 18
    assert (folder / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    # the GGUF says add_bos_token; transformers' conversion alone would drop it
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer("Hello")["input_ids"][0] == config["bos_token_id"]
    assert any(HF_CONFIG_PATH in line and str(folder) in line for line in said)
    # the second start reuses the folder and says so
    said.clear()
    assert gguf_config_env({MODEL: str(gemma_path)}, log=said.append) == updates
    assert "cached" in said[-1]


def test_explicit_tokenizer_is_kept(gemma_path: Path) -> None:
    updates = gguf_config_env({MODEL: str(gemma_path), TOKENIZER: "/my/tokenizer"})
    assert set(updates) == {HF_CONFIG_PATH}
    assert (Path(updates[HF_CONFIG_PATH]) / "config.json").is_file()


def test_rendered_argv_carries_the_extracted_folder(gemma_path: Path) -> None:
    """What `serve` execs once prepare() applies with_gguf_config (the lead's hook)."""
    from entrypoint.argv.render import render
    from entrypoint.start.gguf_config import with_gguf_config

    env = with_gguf_config({MODEL: str(gemma_path), "SERVE_QUANTIZATION": "gguf"})
    argv = render(env).argv
    folder = env[HF_CONFIG_PATH]
    assert argv[argv.index("--hf-config-path") + 1] == folder
    assert argv[argv.index("--tokenizer") + 1] == folder


def test_one_gguf_header_reader_with_bounds_checks(tmp_path: Path) -> None:
    """gguf_config reads through the plugin's gguf_headers: a truncated file is
    a ConfigError naming it, not a struct.error or a silent short read."""
    import entrypoint.start.gguf_config as gguf_config

    source = Path(gguf_config.__file__).read_text()
    assert "struct" not in source and "plugin_files.module(\"headers\")" in source
    model = write_gguf(tmp_path / "m.gguf", "gemma3", add_bos=True)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[:200])
    with pytest.raises(ConfigError, match=r"cut\.gguf: header ends early"):
        gguf_header_fields(cut, {"general.architecture"})


def test_plugin_files_fall_back_to_the_overlay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the plugin is not installed (the gguf-config image stage), the same
    modules come from patches/vllm-gguf-plugin/files."""
    import importlib.util

    from entrypoint.start import plugin_files

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == plugin_files.PLUGIN else real(name, *a),
    )
    assert plugin_files.plugin_root() == plugin_files.OVERLAY
    assert (plugin_files.OVERLAY / "gguf_headers.py").is_file()
