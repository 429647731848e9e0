"""A database node (``padres db``) controlled by DB_CONTROL publications, against a real broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from historic import Store
from padres.client import Client, Delivery
from padres.messages import Filter, Predicate
from padres.protocol import Notify
from padres.runtime.processes import BrokerProcess
from rete.operators import Op


@pytest.fixture
def broker() -> Iterator[str]:
    proc = BrokerProcess("B1")
    yield proc.start()
    proc.stop()


def _control(command: str, request: str, spec: str = "") -> str:
    spec_part = f",[spec,'{spec}']" if spec else ""
    return f"[class,'DB_CONTROL'],[db,'DB1'],[command,'{command}'],[request,'{request}']{spec_part}"


async def _status(replies: list[Delivery], request: str) -> dict[str, object]:
    for _ in range(200):
        for note in replies:
            if isinstance(note, Notify) and note.publication.attributes["request"] == request:
                return dict(note.publication.attributes)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no DB_STATUS for {request}")


def test_database_node_stores_what_it_is_told_once_and_stops(broker: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db1.sqlite'}"
    db = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "padres.cli",
            "db",
            "--id",
            "DB1",
            "--broker",
            broker,
            "--url",
            url,
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert db.stdout is not None
    assert "database DB1 attached to B1" in db.stdout.readline()
    try:
        asyncio.run(_scenario(broker))
    finally:
        db.terminate()
        _, err = db.communicate(timeout=10)
    assert db.returncode == 0, err
    store = Store(url)
    stored = store.query(Filter((Predicate("class", Op.EQ, "Order"),)))
    assert [p.id for p in stored] == ["o0", "o1", "o2", "o9"]  # o2 matched both specs: once
    assert all(p.publisher == "shop@B1" for p in stored)
    store.close()


async def _scenario(broker: str) -> None:
    async with Client(broker, "manager") as manager, Client(broker, "shop") as shop:
        replies: list[Delivery] = []
        await manager.subscribe("[class,eq,'DB_STATUS'],[db,eq,'DB1']", replies.append)
        await manager.advertise(
            "[class,eq,'DB_CONTROL'],[db,eq,'DB1'],[command,isPresent,''],[request,isPresent,'']"
        )
        await manager.advertise(
            "[class,eq,'DB_CONTROL'],[db,eq,'DB1'],[command,isPresent,''],"
            "[request,isPresent,''],[spec,isPresent,'']"
        )
        await shop.advertise("[class,eq,'Order'],[item,isPresent,''],[price,isPresent,0]")
        await manager.publish(
            _control("STORE", "r1", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r1"))["ok"] is True
        await manager.publish(_control("STORE", "r2", "[class,eq,\\'Order\\'],[price,>,100]"))
        status = await _status(replies, "r2")
        assert status["ok"] is True and "[price,>,100]" in str(status["specs"])
        await manager.publish(_control("STORE", "r3", "[class,eq,\\'Order\\'],[price,>,\\'x\\']"))
        assert (await _status(replies, "r3"))["ok"] is False  # a bad spec is refused
        await manager.publish(_control("FLY", "r4"))
        assert "unknown command" in str((await _status(replies, "r4"))["detail"])
        for i, (item, price) in enumerate(
            [("shoes", 50), ("hat", 150), ("shoes", 200), ("hat", 5)]
        ):
            await shop.publish(f"[class,'Order'],[item,'{item}'],[price,{price}]", id=f"o{i}")
        # A round trip: the broker has passed the orders on before the next command.
        await shop.query("subscriptions")
        await manager.publish(_control("LIST", "r5"))
        assert str((await _status(replies, "r5"))["specs"]).count("\n") == 1  # two specs
        await manager.publish(
            _control("STOP", "r6", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r6"))["ok"] is True
        await manager.publish(
            _control("STOP", "r7", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r7"))["ok"] is False  # no longer stored
        await shop.publish("[class,'Order'],[item,'shoes'],[price,60]", id="late")
        await shop.publish("[class,'Order'],[item,'hat'],[price,300]", id="o9")
        await shop.query("subscriptions")
        await manager.publish(_control("LIST", "r8"))
        await _status(replies, "r8")
