"""Every operator of the language, case by case, including type mismatches."""

from __future__ import annotations

import pytest

from rete.operators import Op, Value, evaluate

CASES: list[tuple[Op, Value | None, Value, bool]] = [
    # numeric operators compare ints and floats by value; never strings or booleans
    (Op.LT, 10, 9, True),
    (Op.LT, 10, 10, False),
    (Op.LT, 10, 9.99, True),
    (Op.LE, 10, 10, True),
    (Op.LE, 10.5, 10.6, False),
    (Op.EQ_NUM, 10, 10.0, True),
    (Op.EQ_NUM, 10, 10.1, False),
    (Op.NE_NUM, 10, 11, True),
    (Op.NE_NUM, 10, 10.0, False),
    (Op.GT, 1, 2, True),
    (Op.GT, 1.5, 1.5, False),
    (Op.GE, 1.5, 1.5, True),
    (Op.LT, 10, "9", False),
    (Op.NE_NUM, 10, "abc", False),
    (Op.EQ_NUM, 1, True, False),
    (Op.GE, 0, False, False),
    # eq / neq need the operand's own type
    (Op.EQ, "IBM", "IBM", True),
    (Op.EQ, "IBM", "ibm", False),
    (Op.EQ, True, True, True),
    (Op.EQ, True, 1, False),
    (Op.EQ, "1", 1, False),
    (Op.NEQ, "IBM", "MSFT", True),
    (Op.NEQ, "IBM", "IBM", False),
    (Op.NEQ, "IBM", 5, False),
    (Op.NEQ, False, True, True),
    # string operators: case-sensitive, code-point order, strings only
    (Op.STR_LT, "b", "a", True),
    (Op.STR_LT, "b", "B", True),
    (Op.STR_LT, "b", "b", False),
    (Op.STR_LE, "b", "b", True),
    (Op.STR_GT, "b", "c", True),
    (Op.STR_GE, "b", "b", True),
    (Op.STR_GE, "b", "a", False),
    (Op.STR_CONTAINS, "oo", "shoes", False),
    (Op.STR_CONTAINS, "ho", "shoes", True),
    (Op.STR_CONTAINS, "HO", "shoes", False),
    (Op.STR_CONTAINS, "", "shoes", True),
    (Op.STR_PREFIX, "sh", "shoes", True),
    (Op.STR_PREFIX, "es", "shoes", False),
    (Op.STR_POSTFIX, "es", "shoes", True),
    (Op.STR_POSTFIX, "sh", "shoes", False),
    (Op.STR_PREFIX, "1", 12, False),
    (Op.STR_LT, "z", 5, False),
    # isPresent: any type
    (Op.IS_PRESENT, None, 5, True),
    (Op.IS_PRESENT, None, "x", True),
    (Op.IS_PRESENT, None, False, True),
    (Op.IS_PRESENT, None, 0.0, True),
]


@pytest.mark.parametrize(("op", "operand", "value", "expected"), CASES)
def test_operator(op: Op, operand: Value | None, value: Value, expected: bool) -> None:
    assert evaluate(op, operand, value) is expected


def test_every_operator_is_covered() -> None:
    assert {case[0] for case in CASES} == set(Op)
