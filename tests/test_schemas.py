"""Typed event classes: schemas declared once, known overlay-wide, kept on disk, checked at the
edge; untyped classes as before."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padres.broker import Broker
from padres.broker.quotas import Quotas
from padres.broker.sqlite_journal import SqliteJournal
from padres.client.connection import Client, ClientState
from padres.errors import (
    InvalidMessage,
    JournalError,
    RequestFailed,
    SchemaConflict,
    SchemaViolation,
)
from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_filter,
    parse_publication,
    parse_subscription,
)
from padres.model.classes import (
    AttributeSpec,
    AttributeType,
    Schema,
    check_filter,
    check_publication,
    format_attributes,
    merge,
    parse_attributes,
    widen,
)
from padres.model.dates import date_value, is_date, is_datetime
from padres.model.messages import Filter, Predicate, Publication, Variable
from padres.model.protocol import (
    DeclareSchema,
    DropSchema,
    Durable,
    Error,
    Guaranteed,
    Hello,
    Notify,
    Ok,
    Query,
    QueryResult,
    Rejected,
    Role,
    RouteSchema,
    decode_frame,
    encode_frame,
)
from padres.runtime.simulation import SimClient, Simulation
from padres.testing.processes import BrokerProcess
from rete.operators import Op, Value, evaluate
from tests import strategies
from tests.strategies import NOW
from tests.support import eventually

STOCK = "symbol:string price:float volume:integer? listed:boolean?"


def _declare(ref: str, class_name: str, spec: str) -> DeclareSchema:
    return DeclareSchema(ref, class_name, parse_attributes(spec))


def _pub(text: str, ident: str = "p1") -> Publication:
    return parse_publication(text, id=ident)


def _triangle(seed: int = 1) -> Simulation:
    """Brokers A, B and C, each linked to the other two."""
    sim = Simulation(seed)
    for b in "ABC":
        sim.add_broker(b)
    sim.link("A", "B")
    sim.link("B", "C")
    sim.link("C", "A")
    sim.run()
    return sim


def _typed(seed: int = 1) -> tuple[Simulation, SimClient]:
    """The triangle with STOCK's schema declared at A by the client returned."""
    sim = _triangle(seed)
    admin = sim.attach("admin", "A")
    sim.send(admin, _declare("d1", "STOCK", STOCK))
    sim.run()
    assert admin.acks == ["d1"] and not admin.errors
    return sim, admin


def _schemas(sim: Simulation) -> dict[str, list[str]]:
    return {name: [str(s) for s in broker.schemas] for name, broker in sim.brokers.items()}


def _versions(sim: Simulation, class_name: str) -> set[int]:
    """The versions of the class's schema the brokers have (0: none)."""
    schemas = [b.schemas.get(class_name) for b in sim.brokers.values()]
    return {0 if schema is None else schema.version for schema in schemas}


def _refusal(client: SimClient) -> str:
    (error,) = client.errors
    client.errors.clear()
    return error.text


# -- declaring -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_a_schema_declared_at_one_broker_reaches_every_broker_before_the_ok(seed: int) -> None:
    sim = _triangle(seed)
    admin = sim.attach("admin", "A")
    sim.send(admin, _declare("d1", "STOCK", STOCK))
    while not admin.acks:  # the ok comes once every broker has it, whatever the interleaving
        assert sim.step(1) == 1
    assert _versions(sim, "STOCK") == {1}
    sim.run()
    row = "'STOCK' v1: listed:boolean? price:float symbol:string volume:integer?"
    assert _schemas(sim) == {b: [row] for b in "ABC"}
    assert sim.tables_empty() and not any(len(b.echoes) for b in sim.brokers.values())


def test_a_schema_publication_declares_and_widens_as_the_command_does() -> None:
    sim, _ = _typed()
    pub = sim.attach("pub", "C")  # no advertisement needed: the broker takes it as a request
    spec = f"{STOCK} exchange:string?"
    sim.send(pub, _pub(f"[class,'SCHEMA'],[of,'STOCK'],[attributes,'{spec}']", "p9"))
    sim.run()
    assert pub.acks == ["p9"] and not pub.errors
    assert _versions(sim, "STOCK") == {2}
    sim.send(pub, Guaranteed(_pub("[class,'SCHEMA'],[of,'Order'],[attributes,'id:integer']")))
    sim.run()
    assert pub.acks == ["p9", "p1"]
    assert all(b.schemas.get("Order") is not None for b in sim.brokers.values())


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[class,'SCHEMA'],[attributes,'x:integer']", "[of,'<class>']"),
        ("[class,'SCHEMA'],[of,'T'],[attributes,'x:int']", "unknown type 'int'"),
        ("[class,'SCHEMA'],[of,'T'],[attributes,'x']", "has no type"),
        ("[class,'SCHEMA'],[of,'T'],[attributes,'x:string x:float']", "declared twice"),
        ("[class,'SCHEMA'],[of,'T'],[attributes,'class:string']", "'class' is the class"),
        ("[class,'SCHEMA'],[of,'T'],[attributes,'time:float']", "timestamp"),
        ("[class,'SCHEMA'],[of,'T'],[colour,'red']", "only [of,'<class>']"),
        ("[class,'SCHEMA'],[of,'SCHEMA']", "reserved"),
        ("[class,'SCHEMA'],[of,7]", "[of,'<class>']"),
    ],
)
def test_a_malformed_declaration_is_refused_with_its_reason(text: str, reason: str) -> None:
    sim = _triangle()
    pub = sim.attach("pub", "B")
    sim.send(pub, _pub(text, "p4"))
    sim.run()
    (error,) = pub.errors
    assert error.ref == "p4" and reason in error.text
    assert _schemas(sim) == {b: [] for b in "ABC"}


def test_declaring_the_same_schema_again_changes_nothing() -> None:
    sim, admin = _typed()
    sim.send(
        admin,
        _declare("d2", "STOCK", "listed:boolean?, volume:integer?, price:float, symbol:string"),
    )
    sim.send(admin, _declare("d3", "STOCK", STOCK))  # in another order: the same schema
    sim.run()
    assert admin.acks == ["d1", "d2", "d3"]
    assert _versions(sim, "STOCK") == {1}


def test_a_schema_only_widens_with_new_optional_attributes() -> None:
    sim, admin = _typed()
    cases = {
        "d2": ("symbol:string price:integer volume:integer? listed:boolean?", "cannot become"),
        "d3": ("symbol:string volume:integer? listed:boolean?", "'price' cannot be dropped"),
        "d4": (f"{STOCK} exchange:string", "'exchange' must be optional"),
        "d5": ("symbol:string price:float? volume:integer? listed:boolean?", "float?"),
    }
    for ref, (spec, _) in cases.items():
        sim.send(admin, _declare(ref, "STOCK", spec))
    sim.run()
    assert admin.acks == ["d1"]
    for error, (ref, (_, reason)) in zip(admin.errors, cases.items(), strict=True):
        assert error.ref == ref and reason in error.text, error
        assert "class 'STOCK' has schema version 1" in error.text
    sim.send(admin, _declare("d6", "STOCK", f"{STOCK} exchange:string?"))
    sim.run()
    assert admin.acks == ["d1", "d6"]
    assert _versions(sim, "STOCK") == {2}


def test_widen_names_what_it_refuses() -> None:
    old = Schema(class_name="T", attributes=parse_attributes("x:integer"))
    with pytest.raises(SchemaConflict) as caught:
        widen(old, parse_attributes("x:float"))
    assert caught.value.class_name == "T" and caught.value.version == 1
    assert widen(old, parse_attributes("x:integer")) is None
    new = widen(old, parse_attributes("x:integer y:string?"))
    assert new is not None and new.version == 2 and str(new) == "'T' v2: x:integer y:string?"


def test_declarations_made_at_once_at_two_brokers_settle_on_one_everywhere() -> None:
    both = 0
    for seed in range(6):
        sim = _triangle(seed)
        a, c = sim.attach("a", "A"), sim.attach("c", "C")
        sim.send(a, _declare("d1", "T", "x:integer"))
        sim.send(c, _declare("d1", "T", "x:string"))
        sim.run()
        rows = _schemas(sim)
        assert rows["A"] == rows["B"] == rows["C"], seed
        for client in (a, c):  # each got its ok, or was told of the other's schema
            assert client.acks == ["d1"] or "cannot become" in _refusal(client)
        if a.acks == c.acks == ["d1"]:  # made at once: the same winner everywhere
            both += 1
            assert rows["A"] == ["'T' v1: x:string"]
    assert both


@pytest.mark.parametrize("seed", range(4))
def test_versions_declared_across_a_partition_merge_and_lose_no_attribute(seed: int) -> None:
    sim = Simulation(seed)
    for name in "AB":
        sim.add_broker(name)
    sim.link("A", "B")
    sim.run()
    a, b = sim.attach("a", "A"), sim.attach("b", "B")
    sim.send(a, _declare("d1", "STOCK", "symbol:string"))
    sim.run()
    sim.unlink("A", "B")  # a lost link
    sim.run()
    sim.send(a, _declare("d2", "STOCK", "symbol:string volume:integer?"))  # v2 at A
    sim.send(b, _declare("d3", "STOCK", "symbol:string open:float?"))  # v2 at B
    sim.run()
    sim.send(b, _declare("d4", "STOCK", "symbol:string open:float? close:float?"))  # v3 at B
    sim.run()
    assert a.acks == ["d1", "d2"] and b.acks == ["d3", "d4"]
    sim.link("A", "B")  # the link is back: each learns what the other has
    sim.run()
    merged = "'STOCK' v4: close:float? open:float? symbol:string volume:integer?"
    assert _schemas(sim) == {"A": [merged], "B": [merged]}
    sim.send(a, parse_advertisement("[class,eq,'STOCK']", id="adv"))
    sim.send(a, _pub("[class,'STOCK'],[symbol,'IBM'],[volume,5],[open,1.5]"))
    sim.run()
    assert not a.errors


def test_merging_is_the_same_in_any_order_and_settles_type_conflicts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    specs = ["x:integer y:string?", "x:integer? z:boolean", "x:string w:float?"]
    ends = set()
    for seed in range(6):
        sim = Simulation(seed)
        clients = []
        for name in "ABC":
            sim.add_broker(name)
            clients.append(sim.attach(name.lower(), name))
        for client, spec in zip(clients, specs, strict=True):  # apart: no links yet
            sim.send(client, _declare("d1", "T", spec))
        sim.run()
        sim.link("A", "B")
        sim.link("B", "C")
        if seed % 2:
            sim.link("C", "A")
        sim.run()
        rows = _schemas(sim)
        assert rows["A"] == rows["B"] == rows["C"], seed
        ends.add(rows["A"][0].split(": ", 1)[1])
    assert ends == {"w:float? x:string? y:string? z:boolean?"}
    assert "give attribute(s) x different types" in caplog.text


def test_merge_keeps_every_attribute_and_requires_what_both_require() -> None:
    a = parse_attributes("x:integer y:float k:boolean")
    b = parse_attributes("x:string y:float z:boolean")
    merged, conflicts = merge(a, b)
    assert format_attributes(merged) == "k:boolean? x:string y:float z:boolean?"
    assert conflicts == ["x"]
    assert merge(b, a) == (merged, conflicts)


_ATTRIBUTES = st.dictionaries(
    st.sampled_from("abcd"),
    st.builds(AttributeSpec, st.sampled_from(list(AttributeType)), st.booleans()),
)


@settings(max_examples=strategies.scaled(200), deadline=None)
@given(_ATTRIBUTES, _ATTRIBUTES, _ATTRIBUTES)
def test_merging_is_commutative_associative_and_idempotent(
    a: dict[str, AttributeSpec], b: dict[str, AttributeSpec], c: dict[str, AttributeSpec]
) -> None:
    assert merge(a, b)[0] == merge(b, a)[0]
    assert merge(merge(a, b)[0], c)[0] == merge(a, merge(b, c)[0])[0]
    assert merge(a, a)[0] == a


def test_declarations_beyond_the_limits_are_refused_with_the_limit() -> None:
    sim = _triangle()
    sim.brokers["A"].schemas.quotas = Quotas(schemas=2, schema_attributes=3)
    admin = sim.attach("admin", "A")
    sim.send(admin, _declare("d1", "T1", "a:integer"))
    sim.send(admin, _declare("d2", "T2", "a:integer b:string c:float d:boolean"))
    sim.send(admin, _declare("d3", "T2", "a:integer b:string c:float"))
    sim.send(admin, _declare("d4", "T3", "a:integer"))
    sim.send(admin, _declare("d5", "T2", "a:integer b:string c:float d:boolean?"))
    sim.run()
    assert admin.acks == ["d1", "d3"]
    reasons = [(e.ref, e.text) for e in admin.errors]
    assert reasons == [
        ("d2", "cannot declare the schema of 'T2': it has 4 attributes, the limit is 3"),
        (
            "d4",
            "cannot declare the schema of 'T3': the overlay holds 2 schemas, the limit is 2; "
            "drop some first",
        ),
        ("d5", "cannot declare the schema of 'T2': it has 4 attributes, the limit is 3"),
    ]
    sim.send(admin, DropSchema("d6", "T1"))  # room for one more
    sim.send(admin, _declare("d7", "T3", "a:integer"))
    sim.run()
    assert admin.acks == ["d1", "d3", "d6", "d7"]
    assert _schemas(sim)["C"] == ["'T2' v1: a:integer b:string c:float", "'T3' v1: a:integer"]


@pytest.mark.parametrize("seed", range(3))
def test_a_dropped_schema_leaves_the_class_untyped_everywhere(seed: int) -> None:
    sim, admin = _typed(seed)
    sim.crash("C")  # misses the drop; learns it when it is back
    sim.send(admin, DropSchema("d2", "STOCK"))
    sim.run()
    assert admin.acks == ["d1", "d2"]
    assert _schemas(sim) == {"A": [], "B": []}
    sim.crash("B")
    sim.add_broker("B")  # its journal holds the tombstone, not v1
    assert _schemas(sim) == {"A": [], "B": []}
    sim.add_broker("C")  # from its journal: STOCK v1 is in force until a link is back
    sim.link("C", "B")
    sim.link("B", "A")
    sim.run()
    assert _schemas(sim) == {"A": [], "B": [], "C": []}
    for name in "ABC":
        client = sim.attach(f"c{name}", name)
        sim.send(client, parse_subscription("[class,eq,'STOCK'],[volume,eq,'x']", id="s"))
        sim.send(client, parse_advertisement("[class,eq,'STOCK']", id="a"))
        sim.send(client, _pub("[class,'STOCK'],[anything,1]"))
        sim.run()
        assert client.acks == ["s", "a"] and not client.errors
    sim.send(admin, DropSchema("d3", "STOCK"))  # nothing to drop: answered at once
    sim.send(admin, _declare("d4", "STOCK", "symbol:string"))  # starts above the tombstone
    sim.run()
    assert admin.acks == ["d1", "d2", "d3", "d4"]
    assert {rows[0] for rows in _schemas(sim).values()} == {"'STOCK' v3: symbol:string"}
    sim.crash("B")
    sim.add_broker("B")  # its journal holds the tombstone's successor
    assert [str(s) for s in sim.brokers["B"].schemas] == ["'STOCK' v3: symbol:string"]


def test_a_drop_and_a_widening_made_apart_settle_on_the_later() -> None:
    sim = Simulation(1)
    for name in "AB":
        sim.add_broker(name)
    sim.link("A", "B")
    sim.run()
    a, b = sim.attach("a", "A"), sim.attach("b", "B")
    sim.send(a, _declare("d1", "T", "x:integer"))
    sim.run()
    sim.unlink("A", "B")
    sim.run()
    sim.send(a, DropSchema("d2", "T"))  # v2: dropped, at A
    sim.send(b, _declare("d3", "T", "x:integer y:string?"))  # v2 at B: the drop wins a tie
    sim.run()
    sim.link("A", "B")
    sim.run()
    assert _schemas(sim) == {"A": [], "B": []}
    sim.unlink("A", "B")
    sim.run()
    sim.send(b, _declare("d4", "T", "x:integer"))  # v3 at B: later than the drop
    sim.run()
    sim.link("A", "B")
    sim.run()
    assert _schemas(sim) == {"A": ["'T' v3: x:integer"], "B": ["'T' v3: x:integer"]}


# -- checks at the edge ---------------------------------------------------------------------------


def test_publications_of_a_typed_class_are_checked() -> None:
    sim, _ = _typed()
    pub = sim.attach("pub", "B")
    sim.send(pub, parse_advertisement("[class,eq,'STOCK'],[price,isPresent]", id="a1"))
    sim.run()
    bad = {
        "[class,'STOCK'],[symbol,'IBM'],[price,'high']": (
            "attribute 'price': expected float, found string 'high'"
        ),
        "[class,'STOCK'],[symbol,'IBM'],[price,1.5],[volume,2.5]": (
            "attribute 'volume': expected integer, found float 2.5"
        ),
        "[class,'STOCK'],[symbol,'IBM'],[price,1.5],[listed,1]": (
            "attribute 'listed': expected boolean, found integer 1"
        ),
        "[class,'STOCK'],[symbol,'IBM'],[price,1.5],[colour,'red']": (
            "class 'STOCK' has no attribute 'colour'"
        ),
        "[class,'STOCK'],[price,1.5]": (
            "attribute 'symbol': expected string, found nothing (it is required)"
        ),
    }
    for i, (text, reason) in enumerate(bad.items()):
        sim.send(pub, _pub(text, f"p{i}"))
        sim.run()
        (error,) = pub.errors
        assert error.ref == f"p{i}" and reason in error.text
        assert error.text.startswith(f"publication 'p{i}': class 'STOCK'")
        pub.errors.clear()
    sim.send(pub, Guaranteed(_pub("[class,'STOCK'],[price,2.0]", "g1")))
    sim.run()
    assert "found nothing" in _refusal(pub) and "g1" not in pub.acks


def test_a_violation_carries_the_class_attribute_and_types() -> None:
    schema = Schema(class_name="STOCK", attributes=parse_attributes(STOCK))
    with pytest.raises(SchemaViolation) as caught:
        check_filter(schema, parse_filter("[class,eq,'STOCK'],[volume,str-prefix,'1']"), "s")
    error = caught.value
    assert (error.class_name, error.attribute, error.expected, error.found) == (
        "STOCK",
        "volume",
        "integer",
        "string",
    )
    assert isinstance(error, InvalidMessage)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[volume,str-prefix,'1']", "'volume': expected integer, found string"),
        ("[symbol,<,5]", "'symbol': expected string, found number in [symbol,<,5]"),
        ("[price,eq,'cheap']", "'price': expected float, found string"),
        ("[price,eq,true]", "'price': expected float, found boolean"),
        ("[listed,>,0]", "'listed': expected boolean, found number"),
        ("[listed,eq,'yes']", "'listed': expected boolean, found string"),
        ("[colour,eq,'red']", "class 'STOCK' has no attribute 'colour'"),
        ("[colour,isPresent]", "no attribute 'colour'"),
    ],
)
def test_subscriptions_and_advertisements_that_could_never_match_are_refused(
    text: str, reason: str
) -> None:
    sim, _ = _typed()
    client = sim.attach("c", "C")
    flt = f"[class,eq,'STOCK'],{text}"
    sim.send(client, parse_subscription(flt, id="s1"))
    sim.send(client, parse_advertisement(flt, id="a1"))
    sim.send(client, Durable(parse_subscription(flt, id="d1")))
    sim.run()
    assert not client.acks
    errors = {e.ref: e.text for e in client.errors}
    assert errors.keys() == {"s1", "a1", "d1"}
    assert errors["s1"].startswith("subscription 's1': ") and reason in errors["s1"]
    assert errors["a1"].startswith("advertisement 'a1': ") and reason in errors["a1"]
    assert errors["d1"].startswith("subscription 'd1': ") and reason in errors["d1"]
    assert sim.tables_empty()


_OF_TYPE: dict[AttributeType, st.SearchStrategy[Value]] = {
    AttributeType.INTEGER: strategies.ints,
    AttributeType.FLOAT: st.one_of(strategies.ints, strategies.floats),
    AttributeType.STRING: strategies.strings,
    AttributeType.BOOLEAN: st.booleans(),
    AttributeType.DATE: st.dates().map(date_value),
    AttributeType.DATETIME: st.datetimes().map(date_value),
    AttributeType.TIMESTAMP: st.one_of(strategies.ints, strategies.floats),
}


@settings(max_examples=strategies.scaled(300), deadline=None)
@given(strategies.predicates(st.just("x")), st.sampled_from(list(AttributeType)), st.data())
def test_a_refused_predicate_matches_no_value_of_the_attributes_type(
    predicate: Predicate, kind: AttributeType, data: st.DataObject
) -> None:
    schema = Schema(class_name="T", attributes={"x": AttributeSpec(kind)})
    value = data.draw(_OF_TYPE[kind])
    check_publication(schema, Publication("p1", {"class": "T", "x": value}, NOW), "p")
    try:
        check_filter(schema, Filter((Predicate("class", Op.EQ, "T"), predicate)), "s")
    except SchemaViolation as exc:
        assert exc.expected == kind.value and exc.found
        assert not isinstance(predicate.value, Variable)
        if exc.found.startswith("string '"):  # a date's or datetime's operand not of its form
            assert kind in (AttributeType.DATE, AttributeType.DATETIME)
            assert not (is_date(predicate.value) or is_datetime(predicate.value))
        else:
            assert not evaluate(predicate.op, predicate.value, value)


def test_each_part_of_a_composite_subscription_is_checked() -> None:
    sim, _ = _typed()
    client = sim.attach("c", "B")
    good = "{[class,eq,'Order'],[symbol,eq,$X]}"  # Order is untyped: anything goes
    cases = {
        "s1": (f"{good} & {{[class,eq,'STOCK'],[volume,str-contains,'9']}}", "part 2"),
        "s2": (f"{{[class,eq,'STOCK'],[symbol,=,$I$N]}} & {good}", "part 1"),
        "s3": (f"{good} || ({good} & {{[class,eq,'STOCK'],[size,>,1]}})", "part 3"),
    }
    for ident, (text, _) in cases.items():
        sim.send(client, parse_composite(text, id=ident))
    sim.run()
    assert not client.acks
    for error, (ident, (_, part)) in zip(client.errors, cases.items(), strict=True):
        assert error.ref == ident
        assert error.text.startswith(f"composite subscription {ident!r}, {part}: class 'STOCK'")
    assert "expected integer, found string in [volume,str-contains,'9']" in client.errors[0].text
    assert "expected string, found integer in [symbol,=,$I$N]" in client.errors[1].text
    assert "no attribute 'size'" in client.errors[2].text


def test_valid_traffic_of_a_typed_class_flows_across_the_overlay() -> None:
    sim, _ = _typed()
    pub, sub = sim.attach("pub", "B"), sim.attach("sub", "C")
    sim.send(pub, parse_advertisement("[class,eq,'STOCK'],[price,<,1000],[volume,>=,0]", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'STOCK'],[price,<,100],[symbol,eq,IBM]", id="s"))
    sim.send(sub, parse_subscription("[class,eq,'STOCK'],[listed,eq,true]", id="t"))
    both = "{[class,eq,'STOCK'],[symbol,eq,$S$X]} & {[class,eq,'STOCK'],[volume,=,$F$V]}"
    sim.send(sub, parse_composite(both, id="c"))
    sim.run()
    assert sorted(sub.acks) == ["c", "s", "t"] and pub.acks == ["a"]
    sim.send(pub, _pub("[class,'STOCK'],[symbol,'IBM'],[price,80]", "p1"))  # float takes an int
    sim.send(pub, _pub("[class,'STOCK'],[symbol,'IBM'],[price,8.5],[listed,true]", "p2"))
    sim.send(pub, _pub("[class,'STOCK'],[symbol,'HP'],[price,9.5],[volume,7]", "p3"))
    sim.run()
    assert not pub.errors and not sub.errors
    got = [(n.publication.id, n.subscriptions) for n in sub.notifications]
    assert got == [("p1", ("s",)), ("p2", ("s", "t"))]
    assert [[p.id for p in c.publications] for c in sub.composites] == [["p1", "p3"], ["p2", "p3"]]


def test_untyped_classes_behave_as_before() -> None:
    sim, _ = _typed()
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "C")
    sim.send(pub, parse_advertisement("[class,eq,'stock'],[price,isPresent]", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'stock'],[price,str-prefix,'1']", id="s"))
    sim.send(sub, parse_subscription("[class,eq,'SCHEMA'],[of,isPresent]", id="t"))
    sim.run()
    assert sorted(sub.acks) == ["s", "t"] and pub.acks == ["a"]
    sim.send(pub, _pub("[class,'stock'],[price,'12'],[anything,true]", "p1"))
    sim.send(pub, _pub("[class,'stock'],[price,12]", "p2"))
    sim.run()
    assert not pub.errors
    assert [n.publication.id for n in sub.notifications] == ["p1"]


def test_what_was_routed_before_the_declaration_stays() -> None:
    sim = _triangle()
    admin, sub = sim.attach("admin", "A"), sim.attach("sub", "B")
    sim.send(sub, parse_subscription("[class,eq,'T'],[x,str-prefix,'a']", id="s"))
    sim.run()
    sim.send(admin, _declare("d1", "T", "x:integer"))
    sim.send(sub, Query("subscriptions"))
    sim.run()
    assert admin.acks == ["d1"] and sub.acks == ["s"]
    (result,) = [m for m in sub.other if isinstance(m, QueryResult)]
    assert len(result.rows) == 1


# -- across time and the overlay -------------------------------------------------------------------


def test_a_broker_joining_later_learns_the_schemas() -> None:
    sim, _ = _typed()
    sim.add_broker("D")
    sim.link("D", "B")
    sim.run()
    assert _schemas(sim)["D"] == _schemas(sim)["A"] != []
    client = sim.attach("c", "D")
    sim.send(client, parse_subscription("[class,eq,'STOCK'],[volume,eq,'x']", id="s"))
    sim.run()
    assert "expected integer, found string" in _refusal(client)


def test_a_restarted_broker_enforces_what_it_knew_before_any_link_is_back() -> None:
    sim, admin = _typed()
    sim.crash("C")
    sim.send(admin, _declare("d2", "STOCK", f"{STOCK} exchange:string?"))  # C misses v2
    sim.run()
    sim.add_broker("C")
    client = sim.attach("c", "C")
    sim.send(client, parse_subscription("[class,eq,'STOCK'],[volume,eq,'x']", id="s"))
    sim.send(client, parse_subscription("[class,eq,'STOCK'],[exchange,eq,'NYSE']", id="t"))
    sim.run()
    first, second = client.errors  # v1, from its journal
    assert "expected integer, found string" in first.text
    assert "no attribute 'exchange'" in second.text
    sim.link("C", "A")
    sim.run()
    assert _schemas(sim)["C"] == _schemas(sim)["A"]  # v2, from its neighbour
    sim.send(client, parse_subscription("[class,eq,'STOCK'],[exchange,eq,'NYSE']", id="u"))
    sim.run()
    assert client.acks == ["u"]


def test_a_link_lost_during_the_flood_is_named_and_healed_when_it_is_back() -> None:
    sim = Simulation(3)
    for b in "ABC":
        sim.add_broker(b)
    sim.link("A", "B")
    sim.link("B", "C")
    sim.run()
    admin = sim.attach("admin", "A")
    sim.run()
    sim.send(admin, _declare("d1", "T", "x:integer"))
    while not sim.queued("A", "B"):
        sim.step(1)
    sim.unlink("A", "B")  # the schema is lost with the link
    sim.run()
    assert admin.acks == ["d1"] and admin.incomplete["d1"] == ("the link from A to B was lost",)
    assert _versions(sim, "T") == {0, 1}
    sim.link("B", "A")
    sim.run()
    assert _versions(sim, "T") == {1}


def test_a_journal_holding_an_unreadable_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    journal.save_schema(Schema(class_name="T", attributes=parse_attributes("x:integer")))
    journal.commit()
    journal.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schemas SET body = ?", (b'{"class": "T", "attributes": 5}',))
    db.close()
    journal = SqliteJournal(path)
    with pytest.raises(JournalError, match="a schema it cannot read"):
        Broker("B", journal=journal)
    journal.close()


def test_the_journal_keeps_schemas_on_disk(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    broker = Broker("B", journal=journal)
    broker.handle(Hello("admin", Role.CLIENT), "h1")
    assert broker.handle(_declare("d1", "T", "x:integer y:string?"), "h1") == [("h1", Ok("d1"))]
    journal.commit()
    journal.close()

    journal = SqliteJournal(path)
    broker = Broker("B", journal=journal)
    assert [str(s) for s in broker.schemas] == ["'T' v1: x:integer y:string?"]
    broker.handle(Hello("c", Role.CLIENT), "h2")
    out = broker.handle(parse_subscription("[class,eq,'T'],[x,eq,'1']", id="s"), "h2")
    assert out == [
        (
            "h2",
            Error(
                "subscription 's': class 'T', attribute 'x': expected integer, found string "
                "in [x,eq,'1']",
                "s",
            ),
        )
    ]
    assert broker.handle(Query("schemas"), "h2") == [
        ("h2", QueryResult("schemas", ("'T' v1: x:integer y:string?",)))
    ]
    journal.close()


def test_declarations_and_schemas_cross_the_wire() -> None:
    schema = Schema(class_name="T", version=3, attributes=parse_attributes("b:boolean a:float?"))
    messages = [_declare("d1", "T", "a:float?"), RouteSchema(schema, "e1")]
    assert decode_frame(encode_frame(messages)) == messages
    for attributes, reason in (
        ({"x": {"type": "int"}}, "type: unknown value 'int'"),
        ({"class": {"type": "string"}}, "$: 'class' is the class"),
        ({"x": {"type": "string", "size": 3}}, "unknown field 'size'"),
    ):
        message = {"type": "declare_schema", "id": "d1", "class": "T", "attributes": attributes}
        (rejected,) = decode_frame(orjson.dumps(message))
        assert isinstance(rejected, Rejected) and rejected.ref == "d1"
        assert reason in str(rejected.error)


# -- real brokers ----------------------------------------------------------------------------------


def _padres(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "padres.cli", *args], capture_output=True, text=True, timeout=60
    )


async def _refused_at(url: str) -> None:
    """At the broker at ``url``, STOCK's schema (v2) is in force."""
    errors: list[Error] = []
    async with Client(url, "checker", on_error=errors.append) as client:

        async def known() -> bool:
            return len(await client.query("schemas")) == 1

        await eventually(known)  # at once, or once the broker has linked to a neighbour
        with pytest.raises(RequestFailed, match="expected integer, found string"):
            await client.subscribe("[class,eq,'STOCK'],[volume,str-prefix,'1']")
        await client.subscribe("[class,eq,'STOCK'],[exchange,eq,'NYSE']")
        await client.advertise("[class,eq,'STOCK'],[price,isPresent]")
        await client.publish("[class,'STOCK'],[price,1.5]", id="p1")
        await eventually(lambda: bool(errors))
        assert errors[0].ref == "p1" and "attribute 'symbol'" in errors[0].text


async def test_brokers_enforce_a_schema_declared_by_the_command_and_the_client(
    brokers: dict[str, BrokerProcess], tmp_path: Path
) -> None:
    options = ["--heartbeat", "1", "--data", str(tmp_path / "B1")]
    brokers["B1"] = BrokerProcess("B1", options=options)
    b1 = brokers["B1"].start()
    options = ["--heartbeat", "1", "--max-schemas", "1"]
    brokers["B2"] = BrokerProcess("B2", neighbours=[b1], options=options)
    b2 = brokers["B2"].start()

    done = _padres("schema", "declare", "--broker", b2, "STOCK", "symbol:string", "price:float")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "'STOCK' v1: price:float symbol:string\n"

    async with Client(b1, "admin") as client:
        await client.declare_schema("STOCK", {"symbol": "string", "price": "float"})
        await client.declare_schema(
            "STOCK", "symbol:string price:float volume:integer? exchange:string?"
        )
        with pytest.raises(RequestFailed, match="attribute 'exchange' cannot be dropped"):
            await client.declare_schema("STOCK", {"symbol": "string", "price": "integer"})
        assert len(await client.query("schemas")) == 1
    await _refused_at(b2)
    refused = _padres("schema", "declare", "--broker", b2, "Other", "x:integer")
    assert refused.returncode != 0 and "holds 1 schemas, the limit is 1" in refused.stderr

    brokers["B2"].stop()  # B1 comes back alone: what it knows is in its journal
    brokers["B1"].kill()
    brokers["B1"].start()  # on the same port
    await _refused_at(b1)
    listed = _padres("schema", "list", "--broker", b1)
    row = "'STOCK' v2: exchange:string? price:float symbol:string volume:integer?"
    assert listed.returncode == 0 and listed.stdout == f"{row}\n"

    brokers["B3"] = BrokerProcess("B3", neighbours=[b1], options=["--heartbeat", "1"])
    b3 = brokers["B3"].start()  # joins later: learns the schema from B1
    await _refused_at(b3)

    dropped = _padres("schema", "drop", "--broker", b3, "STOCK")
    assert dropped.returncode == 0 and dropped.stdout == "'STOCK': untyped\n", dropped.stderr
    listed = _padres("schema", "list", "--broker", b1)  # the drop reached every broker
    assert listed.returncode == 0 and listed.stdout == ""


async def test_a_subscription_a_schema_refuses_after_a_reconnect_ends_and_the_rest_goes_on(
    brokers: dict[str, BrokerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    brokers["A"] = BrokerProcess("A")
    url = brokers["A"].start()

    caplog.set_level(logging.WARNING, logger="padres.client.connection")
    errors: list[Error] = []
    async with (
        Client(url, "viewer", reconnect=True, on_error=errors.append) as viewer,
        Client(url, "admin") as admin,
    ):
        doomed = await viewer.subscribe("[class,eq,'STOCK'],[volume,str-prefix,'1']")
        called = await viewer.subscribe("[class,eq,'STOCK'],[symbol,>,5]", lambda _: None)
        kept = await viewer.subscribe("[class,eq,'Other']")
        await viewer.advertise("[class,eq,'Other']")
        await admin.declare_schema("STOCK", "symbol:string volume:integer")
        assert viewer.transport is not None
        await viewer.transport.close()  # a lost connection: the client dials again
        await eventually(lambda: viewer.state is ClientState.OPEN and len(errors) == 1)
        with pytest.raises(RequestFailed, match="expected integer, found string"):
            async for _ in doomed:
                pass
        assert doomed.error is not None and doomed.error.ref == doomed.id
        assert errors[0].ref == called.id and "expected string, found number" in errors[0].text
        await viewer.publish({"class": "Other", "x": 1})
        note = await kept.get(timeout=5)
        assert isinstance(note, Notify) and note.publication.attributes["x"] == 1
        assert sorted(viewer._made) == [("a", "a1"), ("s", kept.id)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("subscription s1 not made again" in text for text in warned)
