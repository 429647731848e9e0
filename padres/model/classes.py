"""Typed event classes: a class's schema, and the checks messages of that class must pass.

A schema names the attributes a class has, the type of each (``integer``, ``float``,
``string``, ``boolean``, ``date``, ``datetime`` or ``timestamp``: ``padres.model.dates`` says how
the last three are written) and whether a publication must carry it. ``class`` itself is always
a required string and is never declared. A class without a schema is untyped: anything goes,
as the language allows.

The checks (``docs/language.md``, "Typed event classes"):

- a publication carries only declared attributes, each with a value of its type (a ``float``
  or ``timestamp`` attribute also takes an integer; a ``date`` or ``datetime`` one a string in
  its canonical form only), and every required one;
- a predicate of a subscription, an advertisement or a part of a composite subscription names
  a declared attribute and could match a value of its type: ``[volume,str-prefix,'1']`` on an
  integer attribute or ``[symbol,<,5]`` on a string one could never match, and is refused; a
  predicate ordering or comparing a ``date`` or ``datetime`` attribute takes an operand of its
  form (``[due,str-lt,'2026/12/01']`` would compare strings, not days, and is refused).

A schema is declared again only to widen it: the attributes in force stay as they are, new ones
must be optional; the version goes up by one. Anything else is a ``SchemaConflict``. Versions
declared apart, across a partition, merge when they meet (``merge``).

The declaration's text form, the same everywhere (``padres schema declare``, a ``SCHEMA``
publication, ``Client.declare_schema``): ``NAME:TYPE`` for a required attribute,
``NAME:TYPE?`` for an optional one, separated by spaces or commas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Final, TypeAlias

import msgspec
from msgspec.structs import force_setattr

from padres.errors import InvalidMessage, SchemaConflict, SchemaViolation
from padres.model.dates import DATE_FORM, DATETIME_FORM, is_date, is_datetime
from padres.model.messages import TIME, Filter, Predicate, Publication, VarType, check_value
from padres.model.printer import format_predicate, format_value
from rete.operators import Op, OperandKind, operand_kind

__all__ = [
    "SCHEMA_CLASS",
    "AttributeSpec",
    "AttributeType",
    "Attributes",
    "Schema",
    "check_class",
    "check_filter",
    "check_publication",
    "declared_by",
    "format_attributes",
    "merge",
    "parse_attributes",
    "widen",
]

SCHEMA_CLASS: Final = "SCHEMA"
"""The reserved class whose publications declare schemas:
``[class,'SCHEMA'],[of,'<class>'],[attributes,'<NAME:TYPE ...>']``."""


class AttributeType(StrEnum):
    INTEGER = "integer"
    FLOAT = "float"
    STRING = "string"
    BOOLEAN = "boolean"
    DATE = "date"
    DATETIME = "datetime"
    TIMESTAMP = "timestamp"


_VALUES: Final[dict[AttributeType, frozenset[type]]] = {
    AttributeType.INTEGER: frozenset({int}),
    AttributeType.FLOAT: frozenset({int, float}),
    AttributeType.STRING: frozenset({str}),
    AttributeType.BOOLEAN: frozenset({bool}),
    AttributeType.DATE: frozenset({str}),
    AttributeType.DATETIME: frozenset({str}),
    AttributeType.TIMESTAMP: frozenset({int, float}),
}
"""The Python types of the values an attribute of each type takes (``bool`` is not ``int``)."""

_NAMES: Final[dict[type, str]] = {int: "integer", float: "float", str: "string", bool: "boolean"}

_FORMS: Final = {
    AttributeType.DATE: (is_date, DATE_FORM),
    AttributeType.DATETIME: (is_datetime, DATETIME_FORM),
}
"""The types whose strings have one form: how to recognise it, and how to name it."""
_ORDERING: Final = frozenset({Op.EQ, Op.NEQ, Op.STR_LT, Op.STR_LE, Op.STR_GT, Op.STR_GE})
"""The operators whose operand must be of a date's or datetime's form to mean what it says."""


class AttributeSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One attribute of a schema: its type, and whether a publication must carry it."""

    type: AttributeType
    required: bool = True

    def __str__(self) -> str:
        return f"{self.type.value}{'' if self.required else '?'}"


Attributes: TypeAlias = dict[str, AttributeSpec]


def _check_attribute_name(name: str) -> None:
    if name in ("class", TIME):
        what = "the class" if name == "class" else "the publication's timestamp"
        raise InvalidMessage(f"{name!r} is {what}, not an attribute a schema declares")
    Predicate(name, Op.IS_PRESENT)  # refuses a name the language does not allow


class Schema(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The schema of class ``class_name`` (``"class"`` in JSON), at ``version``.

    ``attributes`` is kept sorted by name, so that equal schemas encode alike."""

    class_name: str = msgspec.field(name="class")
    version: Annotated[int, msgspec.Meta(ge=1)] = 1
    attributes: Attributes
    dropped: bool = False
    """A tombstone: the schema was dropped at this version, the class is untyped again (kept,
    and flooded, so that every broker learns it; a later declaration starts above it)."""

    def __post_init__(self) -> None:
        check_class(self.class_name)
        for name in self.attributes:
            _check_attribute_name(name)
        force_setattr(self, "attributes", dict(sorted(self.attributes.items())))

    def __str__(self) -> str:
        what = "dropped" if self.dropped else format_attributes(self)
        return f"{format_value(self.class_name)} v{self.version}: {what}"

    def supersedes(self, other: Schema) -> bool:
        """Whether this schema replaces ``other`` of the same class: a higher version, or, for
        two versions declared at once at different brokers, the greater encoding (every broker
        picks the same one)."""
        if self.version != other.version:
            return self.version > other.version
        return msgspec.json.encode(self) > msgspec.json.encode(other)


def check_class(class_name: object) -> str:
    """A class a schema may describe: any string but the reserved ``SCHEMA``."""
    if type(class_name) is not str or not class_name:
        raise InvalidMessage(f"a schema's class must be a non-empty string, not {class_name!r}")
    if class_name == SCHEMA_CLASS:
        raise InvalidMessage(f"class {SCHEMA_CLASS!r} is reserved for schema declarations")
    return check_value(class_name, "class")  # type: ignore[return-value]


# -- the text form --------------------------------------------------------------------------------

_SEPARATORS: Final = re.compile(r"[\s,]+")
_TYPES: Final = ", ".join(t.value for t in AttributeType)


def parse_attributes(spec: str | Mapping[str, str | AttributeSpec]) -> Attributes:
    """The attributes of ``NAME:TYPE NAME:TYPE? ...``, or of a mapping from names to
    ``TYPE``/``TYPE?`` or ``AttributeSpec``; raises ``InvalidMessage`` saying what is wrong."""
    items: list[tuple[str, str | AttributeSpec]] = []
    if isinstance(spec, str):
        for item in _SEPARATORS.split(spec.strip()):
            name, colon, kind = item.partition(":")
            if item and not colon:
                raise InvalidMessage(
                    f"attribute {item!r} has no type: write NAME:TYPE, or NAME:TYPE? for an "
                    f"optional one (TYPE: {_TYPES})"
                )
            if item:
                items.append((name, kind))
    else:
        items = list(spec.items())
    out: Attributes = {}
    for name, kind in items:
        if name in out:
            raise InvalidMessage(f"attribute {name!r} is declared twice")
        _check_attribute_name(name)
        out[name] = kind if isinstance(kind, AttributeSpec) else _spec(name, kind)
    return out


def _spec(name: str, text: str) -> AttributeSpec:
    base = text.removesuffix("?")
    try:
        kind = AttributeType(base)
    except ValueError:
        raise InvalidMessage(
            f"attribute {name!r} has unknown type {text!r}: use {_TYPES}, with '?' after it "
            "for an optional attribute"
        ) from None
    return AttributeSpec(kind, required=base == text)


def format_attributes(schema: Schema | Attributes) -> str:
    """The attributes in the text form, ``open:float symbol:string volume:integer?``."""
    attrs = schema.attributes if isinstance(schema, Schema) else schema
    return " ".join(f"{name}:{spec}" for name, spec in sorted(attrs.items()))


def declared_by(pub: Publication) -> tuple[str, Attributes]:
    """The class and attributes a ``SCHEMA`` publication declares."""
    attrs = dict(pub.attributes)
    del attrs["class"]
    of = attrs.pop("of", None)
    spec = attrs.pop("attributes", "")
    if type(of) is not str:
        raise InvalidMessage(
            f"a {SCHEMA_CLASS} publication names the class it describes as a string: [of,'<class>']"
        )
    if attrs or type(spec) is not str:
        raise InvalidMessage(
            f"a {SCHEMA_CLASS} publication has only [of,'<class>'] and "
            "[attributes,'NAME:TYPE NAME:TYPE? ...']"
        )
    return check_class(of), parse_attributes(spec)


# -- redeclaration --------------------------------------------------------------------------------


def widen(old: Schema, attributes: Attributes) -> Schema | None:
    """The next version of ``old`` with ``attributes``, None if they are the same; raises
    ``SchemaConflict`` unless they only add optional attributes."""
    if attributes == old.attributes:
        return None

    def conflict(why: str) -> SchemaConflict:
        return SchemaConflict(
            f"class {old.class_name!r} has schema version {old.version} "
            f"({format_attributes(old) or 'no attributes'}): {why}; a schema only widens, "
            "with new optional attributes (NAME:TYPE?)",
            class_name=old.class_name,
            version=old.version,
        )

    for name, spec in old.attributes.items():
        new = attributes.get(name)
        if new is None:
            raise conflict(f"attribute {name!r} cannot be dropped")
        if new != spec:
            raise conflict(f"attribute {name!r} is {spec}, it cannot become {new}")
    for name, spec in attributes.items():
        if name not in old.attributes and spec.required:
            raise conflict(f"new attribute {name!r} must be optional ({name}:{spec.type}?)")
    return Schema(class_name=old.class_name, version=old.version + 1, attributes=attributes)


def merge(a: Attributes, b: Attributes) -> tuple[Attributes, list[str]]:
    """The attributes of two versions of a class's schema declared apart (across a partition),
    and the names of those whose types differed. Every attribute of either is kept; it is
    required only if both require it; two types of one attribute settle on the greater by
    name (``timestamp`` > ``string`` > ... > ``boolean``). Merging is commutative and
    associative: brokers merging the same versions in any order end with the same attributes."""
    out: Attributes = {}
    conflicts: list[str] = []
    for name in sorted(a.keys() | b.keys()):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            one = x or y
            assert one is not None
            out[name] = AttributeSpec(one.type, required=False)
            continue
        if x.type is not y.type:
            conflicts.append(name)
        kind = max(x.type, y.type, key=lambda t: t.value)
        out[name] = AttributeSpec(kind, required=x.required and y.required)
    return out, conflicts


# -- checks ---------------------------------------------------------------------------------------

_ANY: Final = frozenset({int, float, str, bool})
_NUMBER: Final = frozenset({int, float})
_VARIABLE_VALUES: Final[dict[VarType, frozenset[type]]] = {
    VarType.STRING: frozenset({str}),
    VarType.INTEGER: frozenset({int}),
    VarType.FLOAT: _NUMBER,
}


def _matchable(p: Predicate) -> frozenset[type]:
    """The Python types of the values ``p`` can match."""
    kind = operand_kind(p.op)
    if kind is OperandKind.NONE:
        return _ANY
    var = p.variable
    if var is not None and var.type is not VarType.ANY:
        return _VARIABLE_VALUES[var.type]
    if kind is OperandKind.NUMBER:
        return _NUMBER
    if kind is OperandKind.STRING:
        return frozenset({str})
    if var is not None:
        return frozenset({str, bool})
    return frozenset({type(p.value)})


def _describe(types: frozenset[type]) -> str:
    if types == _NUMBER:
        return "number"
    return " or ".join(sorted(_NAMES[t] for t in types))


def _unknown(schema: Schema, attribute: str, what: str) -> SchemaViolation:
    known = ", ".join(schema.attributes) or "none but class"
    return SchemaViolation(
        f"{what}: class {schema.class_name!r} has no attribute {attribute!r} "
        f"(schema version {schema.version}; its attributes: {known})",
        class_name=schema.class_name,
        attribute=attribute,
    )


def check_filter(schema: Schema, flt: Filter, what: str) -> None:
    """Raise ``SchemaViolation`` if a predicate of ``flt`` names an attribute ``schema`` does
    not declare, or could match no value of the attribute's type. ``what`` names the message
    in the error (``subscription 's1'``)."""
    for p in flt.predicates:
        if p.attribute == "class":
            continue
        spec = schema.attributes.get(p.attribute)
        if spec is None:
            raise _unknown(schema, p.attribute, what)
        found = _matchable(p)
        form = _FORMS.get(spec.type)
        if not found & _VALUES[spec.type]:
            described = _describe(found)
        elif form is not None and p.op in _ORDERING and p.variable is None:
            if form[0](p.value):
                continue
            described = f"string {format_value(p.value)}"  # type: ignore[arg-type]
        else:
            continue
        expected = f"{spec.type} {form[1]}" if form else spec.type.value
        raise SchemaViolation(
            f"{what}: class {schema.class_name!r}, attribute {p.attribute!r}: expected "
            f"{expected}, found {described} in {format_predicate(p)}",
            class_name=schema.class_name,
            attribute=p.attribute,
            expected=spec.type.value,
            found=described,
        )


def check_publication(schema: Schema, pub: Publication, what: str) -> None:
    """Raise ``SchemaViolation`` if ``pub`` carries an attribute ``schema`` does not declare,
    a value not of its attribute's type, or lacks a required attribute."""
    attrs = pub.attributes
    for name, value in attrs.items():
        if name == "class":
            continue
        spec = schema.attributes.get(name)
        if spec is None:
            raise _unknown(schema, name, what)
        form = _FORMS.get(spec.type)
        if type(value) not in _VALUES[spec.type] or (form and not form[0](value)):
            found = _NAMES[type(value)]
            expected = f"{spec.type} {form[1]}" if form else spec.type.value
            raise SchemaViolation(
                f"{what}: class {schema.class_name!r}, attribute {name!r}: expected "
                f"{expected}, found {found} {format_value(value)}",
                class_name=schema.class_name,
                attribute=name,
                expected=spec.type.value,
                found=found,
            )
    for name, spec in schema.attributes.items():
        if spec.required and name not in attrs:
            raise SchemaViolation(
                f"{what}: class {schema.class_name!r}, attribute {name!r}: expected "
                f"{spec.type}, found nothing (it is required)",
                class_name=schema.class_name,
                attribute=name,
                expected=spec.type.value,
            )
