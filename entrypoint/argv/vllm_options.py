"""vLLM's own argument parser, and what kind of value each of its options takes.

The parser is built exactly as `vllm serve` / the OpenAI api_server build it, so
the option list is never kept by hand: a new vLLM release brings its options along.
"""

from __future__ import annotations

import argparse
import collections.abc as abc
import dataclasses
import functools
import json
import types
import typing
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

    def given(self, argv: list[str]) -> list[tuple[str, argparse.Action]]:
        """(option string, action) for each known `--option` or `--option=value` in argv."""
        found = []
        for element in argv:
            if element.startswith("--"):
                option = element.split("=", 1)[0]
                action = self.actions.get(option)
                if action is not None:
                    found.append((option, action))
        return found


# JSON options: the top-level shape the EngineArgs/FrontendArgs annotation admits
# (an object for a dict or a config dataclass, an array for a list). vLLM's json.loads
# takes any JSON, so the wrong shape would fail only after the model has loaded.
OBJECT, ARRAY = "a JSON object", "a JSON array"


def _shapes_of(annotation: Any) -> set[str]:
    """The JSON shapes a type annotation admits ({} when it says nothing we can use)."""
    if isinstance(annotation, str):
        head = annotation.split("[")[0].strip().lower()
        return {OBJECT} if head in ("dict", "mapping") else {ARRAY} if head == "list" else set()
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        shapes: set[str] = set()
        for arg in typing.get_args(annotation):
            if arg is type(None) or typing.get_origin(arg) is abc.Callable or arg is abc.Callable:
                continue  # None, or a Callable that only Python callers can pass
            more = _shapes_of(arg)
            if not more:
                return set()  # a member we cannot read: admit anything
            shapes |= more
        return shapes
    if origin is typing.Annotated:
        return _shapes_of(typing.get_args(annotation)[0])
    target = origin or annotation
    if target in (dict, abc.Mapping, abc.MutableMapping) or (
        isinstance(target, type) and dataclasses.is_dataclass(target)
    ):
        return {OBJECT}
    if target in (list, tuple, set, abc.Sequence):
        return {ARRAY}
    if isinstance(target, type) and hasattr(target, "model_fields"):  # a pydantic model
        return {OBJECT}
    return set()


@functools.lru_cache(maxsize=1)
def _annotations() -> dict[str, Any]:
    """dest -> annotation, from vLLM's EngineArgs and the OpenAI frontend's args."""
    found: dict[str, Any] = {}
    classes: list[type] = []
    from vllm.engine.arg_utils import AsyncEngineArgs

    classes.append(AsyncEngineArgs)
    try:  # where make_arg_parser (above) takes the frontend's options from
        from vllm.entrypoints.launchers.cli_args import FrontendArgs

        classes.append(FrontendArgs)
    except ImportError:
        pass
    for cls in classes:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a forward reference vLLM never resolves: use the raw ones
            hints = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, annotation in hints.items():
            found.setdefault(name, annotation)
    return found


def json_shapes(action: argparse.Action) -> set[str]:
    """Shapes vLLM can use for a JSON option ({} when its annotation does not say)."""
    if getattr(getattr(action, "type", None), "__name__", "") == "parse_dataclass":
        return {OBJECT}
    return _shapes_of(_annotations().get(action.dest))


def shape_of(value: Any) -> str:
    if isinstance(value, dict):
        return OBJECT
    if isinstance(value, list):
        return ARRAY
    return f"JSON {type(value).__name__} {json.dumps(value)[:40]}"
