"""Settings of a long-running command from a TOML file and the environment, as well as flags.

Every option of such a command (``padres broker``) may be given three ways; the first found
wins:

1. on the command line: ``--max-frame 8``;
2. in the environment: ``PADRES_BROKER_MAX_FRAME=8`` (the prefix, then the option's name in
   capitals with underscores; a flag is ``1``/``true``/``yes`` or ``0``/``false``/``no``; a
   repeatable option takes several values one per line, or separated by commas or spaces
   when they hold no filter);
3. in the file named by ``--config FILE`` (or ``PADRES_BROKER_CONFIG``): ``max-frame = 8``
   (the option's name; ``max_frame`` is read the same), a flag ``true`` or ``false``, a
   repeatable option a list.

``--print-config`` shows the settings in effect, as a file that gives them.
"""

from __future__ import annotations

import argparse
import difflib
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from padres.errors import CommandError

__all__ = ["SECRETS", "add_settings_options", "configured", "preset", "shown"]

SECRETS = frozenset({"password", "token"})
"""Settings ``--print-config`` does not show."""
_OWN = frozenset({"help", "config", "print_config"})
_EXPECTED: dict[Any, str] = {int: "not a whole number", float: "not a number"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def add_settings_options(p: argparse.ArgumentParser, prefix: str) -> None:
    """``--config`` and ``--print-config``, for a command whose settings ``preset`` reads
    with environment variables starting with ``prefix``."""
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"a TOML file of settings, one per option (max-frame = 8); the environment "
        f"({prefix}MAX_FRAME=8) goes over it, and flags over both",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the settings in effect, as a file that gives them, and exit",
    )
    p.set_defaults(settings_prefix=prefix)


def configured(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.ArgumentParser | None:
    """The parser of the command ``argv`` names, if it takes settings
    (``add_settings_options``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word in argv:
                if word in action.choices:
                    sub: argparse.ArgumentParser = action.choices[word]
                    return sub if sub.get_default("settings_prefix") else None
    return None


def preset(parser: argparse.ArgumentParser, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make the settings of the file and of the environment ``parser``'s defaults, so that
    parsing ``argv`` then lets its flags go over them."""
    prefix: str = parser.get_default("settings_prefix")
    options = _options(parser)
    named = argparse.ArgumentParser(add_help=False)
    named.add_argument("--config")
    path = named.parse_known_args(list(argv))[0].config or env.get(prefix + "CONFIG")
    values: dict[str, Any] = {}
    if path:
        values |= _from_file(path, options)
    for key, action in options.items():
        variable = prefix + key.upper().replace("-", "_")
        text = env.get(variable)
        if text is not None:
            values[action.dest] = _converted(action, _split(action, text), variable)
    for action in parser._actions:
        if action.dest in values and action.required:
            action.required = False  # given by the file or the environment
    parser.set_defaults(**values)


def shown(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The settings ``args`` hold, written as the file that gives them."""
    lines = []
    for key, action in _options(parser).items():
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._StoreFalseAction):
            value = not value  # --no-conformity = true: conformity off
        if value is None:
            lines.append(f"# {key} =")
        elif action.dest in SECRETS:
            lines.append(f'{key} = "(hidden)"')
        else:
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The long options of ``parser`` that are settings, by name without dashes."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        names = [o for o in action.option_strings if o.startswith("--")]
        if names and action.dest not in _OWN:
            out[names[0][2:]] = action
    return out


def _from_file(path: str, options: Mapping[str, argparse.Action]) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except OSError as exc:
        raise CommandError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"--config {path}: not TOML: {exc}") from None
    values: dict[str, Any] = {}
    for raw, value in table.items():
        key = raw.replace("_", "-")
        action = options.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(options), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CommandError(f"--config {path}: no setting named {raw!r}{hint}")
        values[action.dest] = _converted(action, value, f"{path}: {raw}")
    return values


def _split(action: argparse.Action, text: str) -> Any:
    """An environment variable's text as the value of ``action``."""
    if not isinstance(action, argparse._AppendAction):
        return text
    if "\n" in text:
        parts = text.splitlines()
    elif "[" in text or "{" in text:  # a filter, whose commas are its own
        parts = [text]
    else:
        parts = re.split(r"[,\s]+", text)
    return [part.strip() for part in parts if part.strip()]


def _converted(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` (from a file or the environment) as ``action`` would store it."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        flag = _flag(value, where)
        return flag if isinstance(action, argparse._StoreTrueAction) else not flag
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item, where) for item in items]
    return _one(action, value, where)


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise CommandError(f"{where}: {value!r} is not true or false")


def _one(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, dict | list):
        raise CommandError(f"{where}: one value expected, not {type(value).__name__}")
    convert = action.type if callable(action.type) else str
    try:
        converted = convert(value if isinstance(value, str) else str(value))
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        why = _EXPECTED.get(convert) or str(exc)
        raise CommandError(f"{where}: {value!r}: {why}") from None
    if action.choices is not None and converted not in action.choices:
        allowed = ", ".join(map(str, action.choices))
        raise CommandError(f"{where}: {value!r} is not one of {allowed}")
    return converted


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
