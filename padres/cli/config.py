"""Command-line options made from a settings dataclass (``padres.broker.config``).

Each field becomes an option named after it, its docstring the help, its default the
default; a field whose value is a dataclass is a group, whose fields become options in turn.
The field's ``metadata`` overrides the name and the help, or leaves the field out (see
``padres.broker.config``). A flag turns a bool off when its default is on, on otherwise.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from collections.abc import Mapping
from dataclasses import Field, fields, is_dataclass, replace
from enum import Enum
from itertools import pairwise
from typing import Any, TypeVar

from padres.errors import CommandError

__all__ = ["add_config_options", "config_from_args"]

T = TypeVar("T")


def add_config_options(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """An option for each field of ``cls`` that has one."""
    for option in _options(cls):
        parser.add_argument(option.name, dest=option.dest, help=option.help, **option.kwargs)


def config_from_args(args: argparse.Namespace, cls: type[T], **given: Any) -> T:
    """The ``cls`` the options of ``add_config_options`` say; ``given``: fields that are no
    options, or whose options are overridden."""
    values: dict[str, Any] = {}
    groups: dict[str, list[_Option]] = {}
    for option in _options(cls):
        name = option.path[0]
        if len(option.path) == 1:
            values[name] = option.value(args)
        else:
            groups.setdefault(name, []).append(option)
    for name, options in groups.items():
        inner = {o.path[1]: o.value(args) for o in options}
        try:
            values[name] = replace(cls.__dataclass_fields__[name].default, **inner)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise CommandError(f"{', '.join(o.name for o in options)}: {exc}") from None
    return cls(**(values | given))


class _Option:
    """The option of one field: its field's ``path`` (a group's field: two names)."""

    def __init__(
        self, path: tuple[str, ...], f: Field[Any], doc: str, meta: Mapping[str, Any], prefix: str
    ) -> None:
        default = f.default
        self.path = path
        self.default = default
        self.dest = "config." + ".".join(path)
        self.kwargs: dict[str, Any]
        flag = "--" + prefix + f.name.replace("_", "-")
        if isinstance(default, bool):
            if default:
                flag = "--no-" + flag[2:]
            self.kwargs = {"action": "store_false" if default else "store_true"}
            help = meta.get("help") or _sentence(doc)
        else:
            if isinstance(default, Enum):
                choices = [member.value for member in type(default)]
                self.kwargs = {"choices": choices, "default": default.value}
                shown = default.value
            else:
                metavar = meta.get("metavar") or ("N" if isinstance(default, int) else "SECONDS")
                self.kwargs = {"type": type(default), "default": default, "metavar": metavar}
                shown = f"{default:g}" if isinstance(default, float) else str(default)
            help = meta.get("help") or f"{_sentence(doc)} (default {shown})"
        self.name: str = meta.get("option") or flag
        self.help: str = help

    def value(self, args: argparse.Namespace) -> Any:
        given = getattr(args, self.dest)
        return type(self.default)(given) if isinstance(self.default, Enum) else given


def _options(cls: type[Any]) -> list[_Option]:
    """The options of the fields of ``cls``, and of the fields of its groups."""
    options: list[_Option] = []
    docs = _docstrings(cls)
    for f in fields(cls):
        meta: Mapping[str, Any] = f.metadata
        if "option" in meta and meta["option"] is None:
            continue
        if not is_dataclass(f.default):
            options.append(_Option((f.name,), f, docs.get(f.name, ""), meta, ""))
            continue
        group: type[Any] = type(f.default)
        chosen: Mapping[str, Mapping[str, Any]] | None = meta.get("fields")
        inner_docs = _docstrings(group)
        for inner in fields(group):
            if chosen is None or inner.name in chosen:
                own = {} if chosen is None else chosen[inner.name]
                doc = inner_docs.get(inner.name, "")
                options.append(
                    _Option((f.name, inner.name), inner, doc, own, meta.get("prefix", ""))
                )
    return options


_DOCSTRINGS: dict[type[Any], dict[str, str]] = {}


def _docstrings(cls: type[Any]) -> dict[str, str]:
    """The attribute docstrings of ``cls``: field -> the string literal right under it."""
    if cls not in _DOCSTRINGS:
        _DOCSTRINGS[cls] = _read_docstrings(cls)
    return _DOCSTRINGS[cls]


def _read_docstrings(cls: type[Any]) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(cls).strip())
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for here, after in pairwise(body):
        if (
            isinstance(here, ast.AnnAssign)
            and isinstance(here.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[here.target.id] = after.value.value
    return docs


def _sentence(doc: str) -> str:
    """A docstring as help text: one line, lowercase first, no final full stop."""
    text = " ".join(doc.split()).removesuffix(".")
    return text[:1].lower() + text[1:]
