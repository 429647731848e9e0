"""Sequences and absences at running brokers: the edge broker matches them, an absence fires
when its window closes although nothing more is published, and a killed broker's client makes
its sequences again."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from padres.bench.network import settled
from padres.client.connection import Client, ClientState
from padres.errors import RequestFailed
from padres.language.parser import parse_publication
from padres.model.protocol import CompositeNotify
from padres.testing.processes import BrokerProcess
from tests.support import eventually

ORDER = "{[class,eq,'Order'],[id,eq,$I]}"
PAID = "{[class,eq,'Paid'],[id,eq,$I]}"


def _start(brokers: dict[str, BrokerProcess], name: str, neighbours: list[str]) -> str:
    proc = BrokerProcess(name, neighbours=neighbours, options=["--heartbeat", "1"])
    brokers[name] = proc
    return proc.start()


async def test_sequences_and_absences_over_two_brokers(
    brokers: dict[str, BrokerProcess],
) -> None:
    first = _start(brokers, "B1", [])
    second = _start(brokers, "B2", [brokers["B1"].url])
    async with Client(first, "shop") as shop, Client(second, "watch") as watch:
        paid = await watch.subscribe_composite(f"{ORDER} ; {PAID} within 3s", id="paid")
        unpaid = await watch.subscribe_composite(f"{ORDER} ; !{PAID} within 2s", id="unpaid")
        await shop.advertise("[class,eq,'Order'],[id,isPresent]")
        await shop.advertise("[class,eq,'Paid'],[id,isPresent]")
        await settled(shop, quiet=0.5, timeout=20)  # the parts' routes have reached B1
        # A publication stamped a year ahead is ignored: it cannot make the others late.
        ahead = datetime.now(UTC) + timedelta(days=365)
        await shop.publish(parse_publication("[class,'Order'],[id,'o0']", id="o0", timestamp=ahead))
        for text, ident in [("Order", "o1"), ("Order", "o2"), ("Paid", "o1")]:
            await shop.publish(f"[class,'{text}'],[id,'{ident}']", id=f"{text}-{ident}")
        sent = time.monotonic()
        done = await paid.get(10)
        assert isinstance(done, CompositeNotify)
        assert [p.id for p in done.publications] == ["Order-o1", "Paid-o1"]
        # Nothing more is published: o2's window closes by the broker's clock.
        missing = await unpaid.get(10)
        waited = time.monotonic() - sent
        assert isinstance(missing, CompositeNotify)
        assert [p.id for p in missing.publications] == ["Order-o2"]
        assert missing.bindings == {"I": "o2"}
        assert 2 <= waited <= 8  # the window, the broker's grace (1 s), a tick, a busy machine
        await asyncio.sleep(1.5)
        assert paid.statistics().pending == unpaid.statistics().pending == 0  # o1 paid; o0 ignored


async def test_refusals_out_of_order_and_a_killed_broker(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B", [])
    async with Client(url, "c", reconnect=True) as client:
        historic = f"{ORDER} ; {{[class,eq,'Paid'],[time,>,now-1h]}} within 1s"
        with pytest.raises(RequestFailed, match="reads one time range"):
            await client.subscribe_composite(historic, id="h")
        handle = await client.subscribe_composite(f"{ORDER} ; {PAID} within 1s late 1s", id="s")
        await client.advertise("[class,eq,'Order']")
        await client.advertise("[class,eq,'Paid']")
        now = datetime.now(UTC)
        # Paid comes first, Order half a second earlier: taken in timestamp order.
        at = [("Paid", now), ("Order", now - timedelta(seconds=0.5))]
        for cls, ts in at:
            pub = parse_publication(f"[class,'{cls}'],[id,'x']", id=f"{cls}-x", timestamp=ts)
            await client.publish(pub)
        done = await handle.get(10)
        assert isinstance(done, CompositeNotify)
        assert [p.id for p in done.publications] == ["Order-x", "Paid-x"]
        # Killed, the broker forgets what the composite held; the client makes it again.
        await client.publish("[class,'Order'],[id,'y']", id="Order-y")
        brokers["B"].kill()
        await eventually(lambda: client.state is ClientState.CONNECTING)
        brokers["B"].start()
        await eventually(lambda: client.state is ClientState.OPEN, timeout=15)
        for cls, ident in [("Paid", "y"), ("Order", "z"), ("Paid", "z")]:
            await client.publish(f"[class,'{cls}'],[id,'{ident}']", id=f"{cls}-{ident}-again")
        again = await handle.get(10)
        assert isinstance(again, CompositeNotify)
        assert [p.id for p in again.publications] == ["Order-z-again", "Paid-z-again"]
        await client.unsubscribe("s")
