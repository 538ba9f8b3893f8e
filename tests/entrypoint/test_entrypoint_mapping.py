"""Each mapping rule and each bad input, against the installed vLLM's own parser."""

from __future__ import annotations

import json

import pytest

from entrypoint.argv import settings
from entrypoint.argv.mapping import map_environment, option_for
from entrypoint.errors import ConfigError

MODEL = {"SERVE_MODEL": "org/model"}


def mapped(table, **env: str) -> list[str]:  # type: ignore[no-untyped-def]
    return map_environment({**MODEL, **env}, table)


def problems(table, **env: str) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        map_environment(env, table)
    return info.value.problems


def test_name_maps_to_option() -> None:
    assert option_for("SERVE_TENSOR_PARALLEL_SIZE") == "--tensor-parallel-size"


def test_model_comes_first_and_maps_to_model_option(vllm_table) -> None:
    args = mapped(vllm_table, SERVE_TENSOR_PARALLEL_SIZE="8")
    assert args == ["--model", "org/model", "--tensor-parallel-size", "8"]


def test_order_is_sorted_and_stable(vllm_table) -> None:
    env = {**MODEL, "SERVE_SEED": "1", "SERVE_DTYPE": "float16", "SERVE_PORT": "9000"}
    first = map_environment(env, vllm_table)
    second = map_environment(dict(reversed(list(env.items()))), vllm_table)
    assert (
        first
        == second
        == [
            "--model",
            "org/model",
            "--dtype",
            "float16",
            "--port",
            "9000",
            "--seed",
            "1",
        ]
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", ["--enforce-eager"]),
        ("1", ["--enforce-eager"]),
        ("FALSE", ["--no-enforce-eager"]),
        ("0", ["--no-enforce-eager"]),
    ],
)
def test_boolean_with_no_form(vllm_table, value: str, expected: list[str]) -> None:
    assert mapped(vllm_table, SERVE_ENFORCE_EAGER=value)[2:] == expected


def test_negative_name_of_boolean_is_understood(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_NO_ENABLE_PREFIX_CACHING="true")[2:] == [
        "--no-enable-prefix-caching"
    ]
    assert mapped(vllm_table, SERVE_NO_ENABLE_PREFIX_CACHING="false")[2:] == [
        "--enable-prefix-caching"
    ]


def test_store_true_flag_true_and_false(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_DISABLE_LOG_STATS="true")[2:] == ["--disable-log-stats"]
    assert mapped(vllm_table, SERVE_DISABLE_LOG_STATS="false")[2:] == []


def test_boolean_given_words_is_an_error(vllm_table) -> None:
    assert problems(vllm_table, **MODEL, SERVE_ENFORCE_EAGER="yes please") == [
        "SERVE_ENFORCE_EAGER='yes please': expected a boolean (true, false, 1 or 0)"
    ]


def test_optional_valued_option(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_HF_TOKEN="true")[2:] == ["--hf-token"]
    assert mapped(vllm_table, SERVE_HF_TOKEN="false")[2:] == []
    assert mapped(vllm_table, SERVE_HF_TOKEN="hf_abc")[2:] == ["--hf-token", "hf_abc"]


def test_json_option_is_canonical_single_element(vllm_table) -> None:
    spec = '{ "num_speculative_tokens": 15, "method": "dflash",\n "model": "z/d" }'
    args = mapped(vllm_table, SERVE_SPECULATIVE_CONFIG=spec)
    assert args[2:] == [
        "--speculative-config",
        '{"method":"dflash","model":"z/d","num_speculative_tokens":15}',
    ]


@pytest.mark.parametrize(
    "name",
    [
        "SERVE_COMPILATION_CONFIG",
        "SERVE_HF_OVERRIDES",
        "SERVE_KV_TRANSFER_CONFIG",
        "SERVE_SPECULATIVE_CONFIG",
        "SERVE_ALLOWED_ORIGINS",
        "SERVE_OVERRIDE_GENERATION_CONFIG",
    ],
)
def test_every_json_option_reports_position_and_excerpt(vllm_table, name: str) -> None:
    [message] = problems(vllm_table, **MODEL, **{name: '{method: "dflash"}'})
    assert message.startswith(f"{name}: invalid JSON at line 1 column 2 (char 1): ")
    assert "Expecting property name enclosed in double quotes" in message
    assert "'{method: \"dflash\"}'" in message


def test_json_validated_by_vllm_schema(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_COMPILATION_CONFIG='{"mode": "bogus"}')
    assert message.startswith(
        "SERVE_COMPILATION_CONFIG: vLLM rejects the value of --compilation-config: "
    )
    assert "bogus" in message


def test_dict_or_string_option(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_HF_OVERRIDES='{"b": 1, "a": [1, 2]}')[2:] == [
        "--hf-overrides",
        '{"a":[1,2],"b":1}',
    ]
    assert mapped(vllm_table, SERVE_MODEL_LOADER_EXTRA_CONFIG="plain")[2:] == [
        "--model-loader-extra-config",
        "plain",
    ]


def test_list_option_single_and_json_array(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_SERVED_MODEL_NAME="glm-5")[2:] == [
        "--served-model-name",
        "glm-5",
    ]
    assert mapped(vllm_table, SERVE_SERVED_MODEL_NAME='["a", "b c"]')[2:] == [
        "--served-model-name",
        "a",
        "b c",
    ]
    assert mapped(vllm_table, SERVE_CUDAGRAPH_CAPTURE_SIZES="[1, 2, 4]")[2:] == [
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "4",
    ]


def test_list_option_checks_each_element(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_CUDAGRAPH_CAPTURE_SIZES='[1, "two"]')
    assert message.startswith(
        "SERVE_CUDAGRAPH_CAPTURE_SIZES='two': --cudagraph-capture-sizes expects an integer"
    )


def test_append_option_repeats(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_MIDDLEWARE='["a.B", "c.D"]')[2:] == [
        "--middleware",
        "a.B",
        "--middleware",
        "c.D",
    ]


def test_integer_given_word(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_TENSOR_PARALLEL_SIZE="eight")
    assert message.startswith(
        "SERVE_TENSOR_PARALLEL_SIZE='eight': --tensor-parallel-size expects an integer"
    )


def test_float_and_choices(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_GPU_MEMORY_UTILIZATION="ninety")
    assert "--gpu-memory-utilization expects a number" in message
    [message] = problems(vllm_table, **MODEL, SERVE_DTYPE="float17")
    assert message.startswith("SERVE_DTYPE='float17': --dtype expects one of auto, ")


def test_human_readable_and_negative_values(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_MAX_NUM_BATCHED_TOKENS="32k")[2:] == [
        "--max-num-batched-tokens",
        "32k",
    ]
    assert mapped(vllm_table, SERVE_MAX_MODEL_LEN="-1")[2:] == ["--max-model-len=-1"]


def test_unknown_option_suggests_close_names(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_TENSOR_PARALEL_SIZE="8")
    assert message.startswith(
        "SERVE_TENSOR_PARALEL_SIZE: --tensor-paralel-size is not an option of the installed "
        "vLLM; did you mean SERVE_TENSOR_PARALLEL_SIZE (--tensor-parallel-size)"
    )


def test_unknown_option_without_close_match(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_ZZZZ_QQQQ="1")
    assert "--zzzz-qqqq is not an option" in message and "--help" in message


def test_help_is_not_an_option(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_HELP="true")
    assert message.startswith("SERVE_HELP: --help is not an option")


def test_two_names_for_one_option(vllm_table) -> None:
    [message] = problems(
        vllm_table,
        **MODEL,
        SERVE_ENABLE_PREFIX_CACHING="true",
        SERVE_NO_ENABLE_PREFIX_CACHING="true",
    )
    assert message == (
        "SERVE_NO_ENABLE_PREFIX_CACHING and SERVE_ENABLE_PREFIX_CACHING "
        "both set --no-enable-prefix-caching"
    )


def test_empty_value_means_unset(vllm_table) -> None:
    assert mapped(vllm_table, SERVE_TENSOR_PARALLEL_SIZE="  ") == ["--model", "org/model"]


def test_missing_model(vllm_table) -> None:
    assert problems(vllm_table, SERVE_SEED="1") == [
        "SERVE_MODEL is not set: name the model (a Hugging Face id or a local path)"
    ]


def test_model_in_extra_args_is_enough(vllm_table) -> None:
    args = map_environment({"SERVE_EXTRA_ARGS": '["--model", "x"]'}, vllm_table)
    assert args == ["--model", "x"]


def test_extra_args_are_appended_verbatim(vllm_table) -> None:
    args = mapped(vllm_table, SERVE_SEED="1", SERVE_EXTRA_ARGS='["--max-logprobs", "5"]')
    assert args == ["--model", "org/model", "--seed", "1", "--max-logprobs", "5"]


@pytest.mark.parametrize("raw", ['"--seed 1"', '{"seed": 1}', '["--seed", 1]', "[null]"])
def test_extra_args_must_be_array_of_strings(vllm_table, raw: str) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_EXTRA_ARGS=raw)
    assert message.startswith("SERVE_EXTRA_ARGS must be a JSON array of strings")


def test_extra_args_invalid_json(vllm_table) -> None:
    [message] = problems(vllm_table, **MODEL, SERVE_EXTRA_ARGS="[--seed]")
    assert message.startswith("SERVE_EXTRA_ARGS: invalid JSON at line 1 column 2")


def test_all_problems_are_reported_together(vllm_table) -> None:
    found = problems(vllm_table, SERVE_TENSOR_PARALLEL_SIZE="eight", SERVE_ENFORCE_EAGER="y")
    assert len(found) == 3  # the integer, the boolean and the missing model


def test_reserved_names_are_not_vllm_options(vllm_table) -> None:
    for name in settings.RESERVED:
        assert name.startswith("SERVE_")
        assert option_for(name) not in vllm_table.actions, name


def test_reserved_names_are_never_mapped(vllm_table) -> None:
    env = {name: "1" for name in settings.RESERVED if name != settings.EXTRA_ARGS}
    assert map_environment({**MODEL, **env}, vllm_table) == ["--model", "org/model"]


def test_no_name_of_ours_in_the_vllm_namespace() -> None:
    import entrypoint.argv.settings as module

    names = [v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)]
    assert not [n for n in names if n.startswith("VLLM_")]
    assert json.dumps(sorted(settings.RESERVED))  # the list stays plain data
