"""The schemas a broker knows: kept in its journal, flooded to every broker, checked at the edge.

A schema declared at a broker (``declare_schema`` or a ``SCHEMA`` publication) floods the
overlay as ``RouteSchema``, as an advertisement does: each broker keeps it if it holds more
than the one it has for the class and passes it on to its other neighbours, and drops it
otherwise, which ends the flood in a cyclic overlay. A broker linking to a neighbour sends it
every schema it knows, as it offers its trees, so a broker that joins or comes back learns
them; and each keeps them in its journal, so a restarted broker enforces them at once.
Versions declared apart, across a partition, neither widening the other, merge when they meet
(``Schemas._reconcile``): every attribute either had stays, and every broker ends with the same
merged version.

Every copy carries an echo token (see ``padres.broker.echoes``): the declaring client's ``ok``
comes once every broker the flood reached has the schema.

A dropped schema (``DropSchema``, an administrator's right) leaves a tombstone, a version
marked ``dropped``, that floods and is kept like a schema: the class is untyped again at every
broker, and a later declaration starts again above the tombstone's version.

Checks are made at the broker a message enters the overlay by (``screen``): brokers trust
each other's routing messages. So are the limits (``Quotas.schemas`` and
``Quotas.schema_attributes``): a declaration that would take the overlay beyond them is
refused where it is made.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from padres.broker.echoes import Echoes
from padres.broker.journal import Journal
from padres.broker.quotas import Quotas
from padres.broker.routes import Out
from padres.errors import InvalidMessage, SchemaLimit
from padres.model.classes import (
    SCHEMA_CLASS,
    Attributes,
    Schema,
    check_filter,
    check_publication,
    declared_by,
    merge,
    widen,
)
from padres.model.messages import Advertisement, Publication, Subscription
from padres.model.protocol import (
    DeclareSchema,
    DropSchema,
    Echo,
    Envelope,
    Error,
    RouteSchema,
    TxPublish,
)
from padres.model.requests import composite_of, publication_of, reference, subscription_of

__all__ = ["Declaration", "Schemas"]

log = logging.getLogger("padres.broker")


class Declaration(NamedTuple):
    """A schema a client declares: the request's id (for the reply), the class, its
    attributes (None: the client drops the class's schema)."""

    ref: str
    class_name: str
    attributes: Attributes | None


class Schemas:
    """See the module docstring. ``quotas``: how many schemas, and attributes in one, a
    declaration made here may bring the overlay to."""

    def __init__(self, journal: Journal, echoes: Echoes, quotas: Quotas) -> None:
        self._journal = journal
        self._echoes = echoes
        self.quotas = quotas
        self._known = {schema.class_name: schema for schema in journal.schemas()}
        """Every class's schema, dropped ones too (their tombstones)."""

    def __iter__(self) -> Iterator[Schema]:
        """The schemas in force (not the dropped ones)."""
        return (schema for schema in self._known.values() if not schema.dropped)

    def get(self, class_name: str) -> Schema | None:
        """The schema in force for ``class_name``, None if the class is untyped."""
        schema = self._known.get(class_name)
        return None if schema is None or schema.dropped else schema

    def _keep(self, schema: Schema) -> None:
        self._known[schema.class_name] = schema
        self._journal.save_schema(schema)

    # -- at the edge -------------------------------------------------------------------------

    def screen(self, message: Envelope) -> Error | Declaration | None:
        """What a client's ``message`` is as far as schemas go: the ``Error`` refusing it
        (it breaks the schema of its class, or is a malformed declaration), a ``Declaration``
        (``declare_schema``, or a publication of class ``SCHEMA``), or None: let it pass."""
        try:
            return self._screen(message)
        except InvalidMessage as exc:
            return Error(str(exc), reference(message))

    def _screen(self, message: Envelope) -> Declaration | None:
        pub = publication_of(message)  # publications first: most messages are
        if pub is not None:
            if pub.class_name != SCHEMA_CLASS:
                self._check_publication(pub)
                return None
            if isinstance(message, TxPublish):
                raise InvalidMessage(
                    f"a {SCHEMA_CLASS} publication declares a schema: it cannot be part of a "
                    "transaction"
                )
            return Declaration(pub.id, *declared_by(pub))
        sub = subscription_of(message)
        if sub is not None:
            self._check_filter(sub)
            return None
        composite = composite_of(message)
        if composite is not None:
            for i, flt in enumerate(composite.filters, 1):
                schema = self.get(flt.class_name)
                if schema is not None:
                    what = f"composite subscription {composite.id!r}, part {i}"
                    check_filter(schema, flt, what)
            return None
        match message:
            case DeclareSchema():
                return Declaration(message.id, message.class_name, message.attributes)
            case DropSchema():
                return Declaration(message.id, message.class_name, None)
            case Advertisement():
                self._check_filter(message)
        return None

    def _check_publication(self, pub: Publication) -> None:
        schema = self.get(pub.class_name)
        if schema is not None:
            check_publication(schema, pub, f"publication {pub.id!r}")

    def _check_filter(self, message: Subscription | Advertisement) -> None:
        schema = self.get(message.filter.class_name)
        if schema is not None:
            what = "advertisement" if isinstance(message, Advertisement) else "subscription"
            check_filter(schema, message.filter, f"{what} {message.id!r}")

    def declare(self, declaration: Declaration) -> Schema | None:
        """Declare a class's schema, widen it, or drop it: the new version (a tombstone for a
        drop), kept, or None if nothing changed. Raises ``SchemaConflict`` if it is declared
        again other than as a widening, ``SchemaLimit`` beyond ``quotas``."""
        name, attributes = declaration.class_name, declaration.attributes
        old = self._known.get(name)
        if attributes is None:
            if old is None or old.dropped:
                return None
            schema: Schema | None = Schema(
                class_name=name, version=old.version + 1, attributes={}, dropped=True
            )
        elif old is None or old.dropped:
            held = sum(1 for _ in self)
            if held >= self.quotas.schemas:
                raise SchemaLimit(
                    f"cannot declare the schema of {name!r}: the overlay holds {held:,} "
                    f"schemas, the limit is {self.quotas.schemas:,}; drop some first"
                )
            version = 1 if old is None else old.version + 1
            schema = Schema(class_name=name, version=version, attributes=attributes)
        else:
            schema = widen(old, attributes)
        if schema is None:
            return None
        if len(schema.attributes) > self.quotas.schema_attributes:
            raise SchemaLimit(
                f"cannot declare the schema of {name!r}: it has {len(schema.attributes):,} "
                f"attributes, the limit is {self.quotas.schema_attributes:,}"
            )
        self._keep(schema)
        return schema

    # -- between brokers ---------------------------------------------------------------------

    def flood(
        self, schema: Schema, peers: Mapping[str, str], source: str = ""
    ) -> tuple[list[Out], set[str]]:
        """``schema`` to every neighbour but ``source``, and the echo tokens the copies
        carry. ``peers``: the neighbours, hop -> broker id."""
        out: list[Out] = []
        tokens: set[str] = set()
        for hop in peers:
            if hop != source:
                token = self._echoes.sent(hop)
                tokens.add(token)
                out.append((hop, RouteSchema(schema, token)))
        return out, tokens

    def arrive(self, message: RouteSchema, hop: str, peers: Mapping[str, str]) -> list[Out]:
        """A neighbour sent a schema: kept and passed on if it holds more than the one known
        (see ``_reconcile``), and echoed once the neighbours it went to have echoed."""
        old = self._known.get(message.schema.class_name)
        out: list[Out] = []
        tokens: set[str] = set()
        schema = message.schema if old is None else self._reconcile(old, message.schema)
        if schema is not None:
            self._keep(schema)
            # A merge goes back to the sender too: it has neither version.
            out, tokens = self.flood(schema, peers, hop if schema is message.schema else "")
        if not message.echo:
            return out
        echo = message.echo
        return out + self._echoes.wait(tokens, hop, lambda inc: (hop, Echo(echo, inc)))

    def _reconcile(self, held: Schema, incoming: Schema) -> Schema | None:
        """What replaces ``held`` when ``incoming`` arrives, or None. Versions declared apart
        (across a partition) merge (``padres.model.classes.merge``), so that no attribute in force
        anywhere is lost: ``incoming`` if it holds all ``held`` does, or if both have the same
        attributes and it supersedes ``held``; else the merge of both, one version above
        both. Every broker ends with the same schema, in whatever order the versions come."""
        if held.dropped or incoming.dropped:  # the later wins; at once, the drop
            later = (incoming.version, incoming.dropped) > (held.version, held.dropped)
            return incoming if later else None
        attributes, conflicts = merge(held.attributes, incoming.attributes)
        if attributes == held.attributes:
            same = incoming.attributes == held.attributes
            return incoming if same and incoming.supersedes(held) else None
        if attributes == incoming.attributes and incoming.version >= held.version:
            return incoming
        version = max(held.version, incoming.version) + 1
        if conflicts:
            log.warning(
                "class %r: versions %d and %d of its schema, declared apart, give attribute(s) "
                "%s different types: version %d keeps the greater type",
                held.class_name,
                held.version,
                incoming.version,
                ", ".join(conflicts),
                version,
            )
        return Schema(class_name=held.class_name, version=version, attributes=attributes)

    def offer(self, hop: str) -> list[Out]:
        """Every schema known, dropped ones too, to a neighbour that has just linked."""
        return [(hop, RouteSchema(schema)) for schema in self._known.values()]
