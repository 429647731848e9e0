"""Public names loaded on first use (PEP 562).

A package lists where each of its public names lives and takes its ``__getattr__`` and
``__dir__`` from here, so that importing it loads only what is used: the message model loads
without the Rete network and NumPy, and the command line starts without the broker. Every
package of the project does so; this module is at the bottom of their layers, and imports
nothing of them.
"""

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy"]


def lazy(
    namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``: a
    name of ``homes`` (name -> module) is imported from its module when first asked for, and
    kept in the package, where it is found from then on without ``__getattr__``."""
    package = namespace["__name__"]

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
