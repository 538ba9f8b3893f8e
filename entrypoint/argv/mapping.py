"""SERVE_* environment -> vLLM argv, checked option by option against vLLM's parser.

Rules: `SERVE_<OPTION>` -> `--<option>` (`_` -> `-`). Booleans are true/false/1/0.
JSON options are parsed here (so errors name the variable) and re-emitted
canonically as one argv element. Every problem found is reported, not just the first.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Mapping
from typing import Any

from entrypoint.argv import settings
from entrypoint.argv.settings import MODEL, PREFIX, SettingError, parse_bool
from entrypoint.argv.vllm_options import (
    APPEND,
    BOOL,
    DICT_OR_STR,
    FLAG,
    JSON,
    MULTI,
    OPTIONAL,
    OptionTable,
    expected_words,
    json_shapes,
    kind_of,
    shape_of,
)
from entrypoint.errors import ConfigError

_ARG_ERRORS = (ValueError, TypeError, argparse.ArgumentTypeError)


def option_for(name: str) -> str:
    return "--" + name[len(PREFIX) :].lower().replace("_", "-")


def env_name_for(option: str) -> str:
    return PREFIX + option[2:].upper().replace("-", "_")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def parse_json(name: str, raw: str) -> Any:
    """json.loads with an error that names the variable, the position and an excerpt."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        start = max(0, exc.pos - 20)
        excerpt = raw[start : exc.pos + 20]
        caret = " " * (exc.pos - start + 1) + "^"
        raise ConfigError(
            f"{name}: invalid JSON at line {exc.lineno} column {exc.colno} (char {exc.pos}): "
            f"{exc.msg}\n    {excerpt!r}\n    {caret}"
        ) from None


def _pair(option: str, value: str) -> list[str]:
    # `--opt=-1` keeps argparse from reading a leading "-" as another option.
    return [f"{option}={value}"] if value.startswith("-") else [option, value]


def _check_value(name: str, option: str, action: argparse.Action, value: str) -> None:
    """Run vLLM's own converter and choices on one value."""
    converter = action.type
    try:
        converted = converter(value) if callable(converter) else value
    except _ARG_ERRORS as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{name}={value!r}: {option} expects {expected_words(action)} ({detail[:200]})"
        ) from None
    if action.choices is not None and converted not in action.choices:
        raise ConfigError(f"{name}={value!r}: {option} expects {expected_words(action)}")


def _elements(name: str, raw: str) -> list[str]:
    """A list option's values: a JSON array when it starts with '[', else one value."""
    if not raw.lstrip().startswith("["):
        return [raw]
    items = parse_json(name, raw)
    if not isinstance(items, list) or any(isinstance(i, dict | list) for i in items):
        raise ConfigError(f"{name}: a JSON list value must be an array of scalars")
    return [i if isinstance(i, str) else json.dumps(i) for i in items]


def _json_arg(name: str, option: str, action: argparse.Action, raw: str) -> list[str]:
    value = parse_json(name, raw)
    shapes = json_shapes(action)
    if shapes and shape_of(value) not in shapes:
        raise ConfigError(
            f"{name}: {option} must be {' or '.join(sorted(shapes))}, got {shape_of(value)}"
        )
    text = canonical_json(value)
    try:
        if callable(action.type):
            action.type(text)
    except _ARG_ERRORS as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ConfigError(f"{name}: vLLM rejects the value of {option}: {detail}") from None
    return [option, text]


def args_for(name: str, raw: str, option: str, action: argparse.Action) -> list[str]:
    """The argv elements for one variable."""
    kind = kind_of(action)
    positive = not option.startswith("--no-")
    if kind in (FLAG, BOOL, OPTIONAL):
        try:
            wanted = parse_bool(name, raw)
        except SettingError:
            if kind != OPTIONAL:
                raise
            return _pair(option, raw)  # an optional-valued option given a real value
        if kind == BOOL:
            # BooleanOptionalAction owns both --x and --no-x; pick by the wanted value.
            base = option if positive else "--" + option[len("--no-") :]
            return [base] if wanted == positive else ["--no-" + base[2:]]
        return [option] if wanted else []
    if kind in (JSON, DICT_OR_STR):
        if kind == DICT_OR_STR and raw.strip().startswith("["):
            raise ConfigError(
                f"{name}: {option} takes a JSON object or a plain string, not an array"
            )
        if kind == DICT_OR_STR and not raw.strip().startswith("{"):
            return _pair(option, raw)  # vLLM takes a plain string here
        return _json_arg(name, option, action, raw)
    if kind in (MULTI, APPEND):
        values = _elements(name, raw)
        for value in values:
            _check_value(name, option, action, value)
        if kind == MULTI:
            return [option, *values] if values else []
        return [arg for value in values for arg in _pair(option, value)]
    _check_value(name, option, action, raw)
    return _pair(option, raw)


def unknown_option(name: str, option: str, table: OptionTable) -> str:
    close = difflib.get_close_matches(option, table.names(), n=3, cutoff=0.6)
    hint = (
        "did you mean " + " or ".join(f"{env_name_for(c)} ({c})" for c in close) + "?"
        if close
        else "see `python -m vllm.entrypoints.openai.api_server --help` for the options"
    )
    return f"{name}: {option} is not an option of the installed vLLM; {hint}"


def extra_args(env: Mapping[str, str]) -> list[str]:
    raw = env.get(settings.EXTRA_ARGS, "").strip()
    if not raw:
        return []
    value = parse_json(settings.EXTRA_ARGS, raw)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{settings.EXTRA_ARGS} must be a JSON array of strings, "
            f'such as ["--seed", "0"]; got {raw[:80]!r}'
        )
    return value


def repeated_in_extras(
    extras: list[str], table: OptionTable, by_action: dict[int, str]
) -> list[str]:
    """SERVE_EXTRA_ARGS may add options, never repeat one: vLLM would keep the last."""
    problems: list[str] = []
    in_extras: set[int] = set()
    for option, action in table.given(extras):  # vLLM's parser names unknown ones itself
        if id(action) in by_action:
            problems.append(
                f"{settings.EXTRA_ARGS} sets {option}, which {by_action[id(action)]} already "
                "sets; set it in one place"
            )
        elif id(action) in in_extras and kind_of(action) != APPEND:
            problems.append(f"{settings.EXTRA_ARGS} sets {option} twice; vLLM would keep the last")
        in_extras.add(id(action))
    return problems


def map_environment(env: Mapping[str, str], table: OptionTable) -> list[str]:
    """vLLM options (without the program) for every non-reserved, non-empty SERVE_ variable.

    The model comes first, the rest sorted by name, then SERVE_EXTRA_ARGS: the same
    environment always gives the same argv (and so the same digest).
    """
    problems: list[str] = []
    by_action: dict[int, str] = {}
    mapped: list[tuple[str, list[str]]] = []
    names = sorted(n for n in env if n.startswith(PREFIX) and n not in settings.RESERVED)
    for name in names:
        raw = env[name]
        if not raw.strip():
            continue  # an empty value means "unset", so a profile value can be cleared
        option = option_for(name)
        action = table.actions.get(option)
        if action is None:
            problems.append(unknown_option(name, option, table))
            continue
        if id(action) in by_action:
            problems.append(f"{name} and {by_action[id(action)]} both set {option}")
            continue
        by_action[id(action)] = name
        try:
            mapped.append((name, args_for(name, raw, option, action)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    try:
        extras = extra_args(env)
    except ConfigError as exc:
        problems.extend(exc.problems)
        extras = []
    problems.extend(repeated_in_extras(extras, table, by_action))
    if not env.get(MODEL, "").strip() and not any(
        a == "--model" or a.startswith("--model=") for a in extras
    ):
        problems.append(f"{MODEL} is not set: name the model (a Hugging Face id or a local path)")
    if problems:
        raise ConfigError(problems)
    mapped.sort(key=lambda item: (item[0] != MODEL, item[0]))
    return [arg for _, args in mapped for arg in args] + extras
