"""Hash indexes for the tests of one attribute whose outcome a dictionary lookup decides.

* ``eq`` (string or boolean): the slots wanting exactly the fact's value pass, the others fail;
* ``str-prefix`` / ``str-postfix``: the slots whose operand is a prefix / suffix of the fact's
  string pass; only the operand lengths in use are looked up;
* ``neq`` / ``<>``: the slots whose operand equals the fact's value fail, and so do those whose
  operand has another type than the fact's value.

A slot has at most one test of each kind here per attribute (a second goes to the residual
tests); that keeps "not among the passing slots" equal to "fails". Bitsets are Python ints.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from rete.operators import Op, Value

__all__ = ["KEYED_OPS", "TAGS", "KeyedIndex", "tag"]

KEYED_OPS: Final = {
    Op.EQ: "eq",
    Op.STR_PREFIX: "prefix",
    Op.STR_POSTFIX: "postfix",
    Op.NEQ: "neq",
    Op.NE_NUM: "neq",
}


TAGS: Final[dict[type, str]] = {str: "s", bool: "b"}
"""``tag`` by type, for loops that look it up inline: any other type is a number."""


def tag(value: Value) -> str:
    """The type class of a value for keyed lookups: ``n`` number, ``s`` string, ``b`` boolean."""
    return TAGS.get(type(value), "n")


class _Family:
    """One kind of keyed test: key -> bitset of slots, and the bitset of all its slots."""

    __slots__ = ("all", "by_key", "lengths")

    def __init__(self) -> None:
        self.all = 0
        self.by_key: dict[object, int] = {}
        self.lengths: Counter[int] = Counter()

    def add(self, key: object, bit: int) -> None:
        self.all |= bit
        self.by_key[key] = self.by_key.get(key, 0) | bit

    def discard(self, key: object, bit: int) -> None:
        self.all &= ~bit
        rest = self.by_key[key] & ~bit
        if rest:
            self.by_key[key] = rest
        else:
            del self.by_key[key]


class KeyedIndex:
    """The keyed tests of one attribute in one cluster."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def __bool__(self) -> bool:
        return any(f.all for f in self.families.values())

    @staticmethod
    def _keys(kind: str, operand: Value) -> tuple[object, ...]:
        """The keys a test is filed under (neq files under its value and its type class)."""
        if kind == "neq":
            return ((tag(operand), operand), ("type", tag(operand)))
        if kind == "eq":
            return ((tag(operand), operand),)
        return (operand,)

    def add(self, kind: str, operand: Value, bits: int) -> None:
        """File a test under the slots of ``bits``."""
        family = self.families.setdefault(kind, _Family())
        for key in self._keys(kind, operand):
            family.add(key, bits)
        if kind in ("prefix", "postfix"):
            family.lengths[len(operand)] += bits.bit_count()  # type: ignore[arg-type]

    def discard(self, kind: str, operand: Value, slot: int) -> None:
        family = self.families[kind]
        for key in self._keys(kind, operand):
            family.discard(key, 1 << slot)
        if kind in ("prefix", "postfix"):
            length = len(operand)  # type: ignore[arg-type]
            family.lengths[length] -= 1
            if not family.lengths[length]:
                del family.lengths[length]
        if not family.all:
            del self.families[kind]

    def failing(self, value: Value) -> int:
        """The slots whose keyed test on this attribute fails for ``value``."""
        fail = 0
        kind_of = tag(value)
        for kind, family in self.families.items():
            get = family.by_key.get
            if kind == "eq":
                fail |= family.all & ~get((kind_of, value), 0)
            elif kind == "neq":
                fail |= get((kind_of, value), 0) | (family.all & ~get(("type", kind_of), 0))
            elif kind_of != "s":
                fail |= family.all
            else:
                text: str = value  # type: ignore[assignment]
                passing = 0
                size = len(text)
                for length in family.lengths:
                    if length <= size:
                        part = text[:length] if kind == "prefix" else text[size - length :]
                        passing |= get(part, 0)
                fail |= family.all & ~passing
        return fail
