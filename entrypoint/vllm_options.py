"""vLLM's own argument parser, and what kind of value each of its options takes.

The parser is built exactly as `vllm serve` / the OpenAI api_server build it, so
the option list is never kept by hand: a new vLLM release brings its options along.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass
from typing import Any

# Kinds of option, decided from the argparse action alone.
FLAG = "flag"  # --x (store_true/store_const): true -> --x, false -> nothing
BOOL = "bool"  # --x/--no-x (BooleanOptionalAction)
OPTIONAL = "optional"  # --x [VALUE]: true -> bare --x, false -> nothing, else the value
JSON = "json"  # parsed by vLLM as JSON
DICT_OR_STR = "dict-or-str"  # JSON when it looks like an object, else a plain string
MULTI = "multi"  # nargs +/*: one value, or a JSON array of values
APPEND = "append"  # repeated option: one value, or a JSON array of values
VALUE = "value"  # one value checked with the action's own type


@functools.lru_cache(maxsize=1)
def vllm_parser() -> argparse.ArgumentParser:
    """The api_server's parser (the same `make_arg_parser` that `vllm serve` uses)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def _closure_values(fn: Any) -> list[Any]:
    cells = getattr(fn, "__closure__", None) or ()
    values = []
    for cell in cells:
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return values


def base_type(fn: Any) -> Any:
    """Unwrap vLLM's optional_type()/parse_type() closures to the converter inside."""
    seen = 0
    while fn is not None and getattr(fn, "__name__", "") in ("_optional_type", "_parse_type"):
        inner = [v for v in _closure_values(fn) if callable(v)]
        if not inner or seen > 5:
            break
        fn, seen = inner[0], seen + 1
    return fn


def _is_json_type(fn: Any) -> bool:
    fn = base_type(fn)
    return fn is json.loads or getattr(fn, "__name__", "") == "parse_dataclass"


def kind_of(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return BOOL
    if action.nargs == 0:
        return FLAG
    if isinstance(action, argparse._AppendAction):
        return APPEND
    if action.nargs == "?" and action.const is not None:
        return OPTIONAL
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return MULTI
    if _is_json_type(action.type):
        return JSON
    if getattr(base_type(action.type), "__name__", "") == "union_dict_and_str":
        return DICT_OR_STR
    return VALUE


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "human_readable_int": "an integer (e.g. 8, 4k, 1M)",
    "human_readable_int_or_auto": "an integer (e.g. 4096, 32k) or auto",
    "loads": "JSON",
    "parse_dataclass": "a JSON object",
    "str": "a string",
}


def expected_words(action: argparse.Action) -> str:
    """How to describe the value an option wants, for error messages."""
    if action.choices:
        shown = [str(c) for c in action.choices if c is not None]
        return "one of " + ", ".join(shown)
    name = getattr(base_type(action.type), "__name__", "")
    return _TYPE_WORDS.get(name, "a value vLLM accepts")


@dataclass(frozen=True)
class OptionTable:
    """Long options of a parser, by option string."""

    actions: dict[str, argparse.Action]

    @classmethod
    def of(cls, parser: argparse.ArgumentParser) -> OptionTable:
        # argparse has no public option index; `_option_string_actions` and the action
        # classes below have been stable since Python 3.2.
        actions = {
            opt: action
            for opt, action in parser._option_string_actions.items()
            if opt.startswith("--")
            and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
        }
        return cls(actions)

    def names(self) -> list[str]:
        return sorted(self.actions)
