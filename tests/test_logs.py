"""What a broker logs for its operator: one JSON object a line with ``--log-format json``;
clients coming and going with their addresses, links up and down on both sides, shutdown."""

from __future__ import annotations

from pathlib import Path

import orjson

from padres.client.connection import Client
from padres.testing.processes import BrokerProcess
from tests.support import eventually, health


async def test_a_broker_logs_json_lines_of_clients_links_and_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    with path.open("wb") as log:
        a = BrokerProcess("A", options=["--log-format", "json"], log=log, quiet=False)
        url_a = a.start()
        b = BrokerProcess("B", neighbours=[url_a])
        b.start()
        try:
            await eventually(lambda: health(url_a)["neighbours"] == ["B"])
            async with Client(url_a, "shop") as shop:
                await shop.advertise("[class,eq,'T']")
            b.stop()
            await eventually(lambda: health(url_a)["neighbours"] == [])
            assert a.terminate() == 0
        finally:
            b.stop()
            a.stop()
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert {e["level"] for e in entries} <= {"info", "warning"}
    assert all(e["time"].endswith("+00:00") and e["logger"] for e in entries)
    said = [e["message"] for e in entries]

    def logged(start: str) -> bool:
        return any(m.startswith(start) for m in said)

    assert logged("A: linked from B at 127.0.0.1")
    assert logged("A: client shop@A connected from 127.0.0.1")
    assert logged("A: client shop@A (127.0.0.1) left after ")
    assert logged("A: link with B down after ")
    assert logged("A: shutting down: 0 clients asked to go elsewhere")
    assert logged("A: drained in ")
