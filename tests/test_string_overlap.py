"""The overlap of string predicates, checked against a brute-force oracle.

The oracle looks for a witness among strings built from the operands themselves and their
neighbours in the string order (the operand with the least character, \x01, or a letter
appended, its last character moved one code point either way, its last character dropped), a
few least characters and the operands again: a universe that holds a witness for every
combination of the predicates below that has one. A string holds no NUL (the language refuses
it), so \x01 is the least character.
"""

from __future__ import annotations

import itertools
import random
from functools import cache

import pytest

from padres.language.parser import parse_filter
from padres.matching.relations import overlaps
from padres.model.messages import Filter, Predicate
from rete.operators import Op, evaluate

OPERATORS = (
    Op.EQ,
    Op.NEQ,
    Op.STR_LT,
    Op.STR_LE,
    Op.STR_GT,
    Op.STR_GE,
    Op.STR_PREFIX,
    Op.STR_POSTFIX,
    Op.STR_CONTAINS,
)
OPERANDS = ("", "bc", "i", "ib", "ibm", "ibn", "ibm\x01", "\U0010ffff")
PREDICATES = [(op, x) for op in OPERATORS for x in OPERANDS]


def _neighbours(x: str) -> set[str]:
    out = {x, x + "\x01", x + "a", x + "z", x[:-1]}
    if x:
        code = ord(x[-1])
        out |= {x[:-1] + chr(c) for c in (code - 1, code + 1) if 1 <= c <= 0x10FFFF}
    return out


@cache
def universe(operands: frozenset[str]) -> tuple[str, ...]:
    """Strings made of an operand or a neighbour, a few least characters, then up to two
    operands."""
    near = {"", *itertools.chain.from_iterable(_neighbours(x) for x in operands)}
    parts = {"", *operands}
    return tuple(
        a + sep + b + c
        for a in near
        for sep in ("", "\x01", "\x01\x01")
        for b in parts
        for c in parts
    )


def _filter(*predicates: tuple[Op, str]) -> Filter:
    return Filter(
        (Predicate("class", Op.EQ, "A"), *(Predicate("s", op, x) for op, x in predicates))
    )


def _witness(*predicates: tuple[Op, str]) -> str | None:
    strings = universe(frozenset(x for _, x in predicates))
    return next((s for s in strings if all(evaluate(op, x, s) for op, x in predicates)), None)


def test_every_pair_of_string_operators_is_decided_exactly() -> None:
    wrong = []
    for a, b in itertools.product(PREDICATES, repeat=2):
        witness = _witness(a, b)
        if overlaps(_filter(a), _filter(b)) is not (witness is not None):
            wrong.append((a, b, witness))
    assert wrong == []


def test_random_conjunctions_of_three_are_decided_exactly() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        a, b, c = rng.sample(PREDICATES, 3)
        witness = _witness(a, b, c)
        assert overlaps(_filter(a, b), _filter(c)) is (witness is not None), (a, b, c, witness)


@pytest.mark.parametrize(
    ("adv", "sub"),
    [
        ("str-lt,'ibm'", "str-ge,'ibm'"),
        ("str-lt,'ibm'", "str-gt,'ibm'"),
        ("str-le,'ibm'", "str-gt,'ibm'"),
        ("str-ge,'ibm'", "str-lt,'ibm'"),
        ("str-gt,'ibm'", "str-lt,'ibm'"),
        ("str-gt,'ibm'", "str-le,'ibm'"),
        ("str-ge,'ibm'", "str-prefix,'bc'"),
    ],
)
def test_padres_cases_where_bounds_meet_do_not_overlap(adv: str, sub: str) -> None:
    a = parse_filter(f"[class,eq,'stock'],[comp,{adv}]")
    s = parse_filter(f"[class,eq,'stock'],[comp,{sub}]")
    assert not overlaps(s, a)
    assert not overlaps(a, s)


def test_a_bound_next_to_another_leaves_exactly_the_strings_between() -> None:
    # 'ibm' < s < 'ibm\x01' holds no string; 'ibm' <= s < 'ibm\x01\x01' holds two, one excluded.
    assert not overlaps(_filter((Op.STR_GT, "ibm")), _filter((Op.STR_LT, "ibm\x01")))
    two = _filter((Op.STR_GE, "ibm"), (Op.STR_LT, "ibm\x01\x01"))
    assert overlaps(two, _filter((Op.NEQ, "ibm")))
    assert not overlaps(two, _filter((Op.NEQ, "ibm"), (Op.NEQ, "ibm\x01")))
    assert overlaps(two, _filter((Op.STR_POSTFIX, "\x01")))
