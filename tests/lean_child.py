"""A broker and a client in one process that cannot import the optional packages, as after a
plain ``pip install padres``: prints what worked as one JSON line (see test_lean_install)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.abc
import io
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

OPTIONAL = ("fastapi", "starlette", "prometheus_client", "sqlalchemy", "psycopg", "pyspark")


class _Absent(importlib.abc.MetaPathFinder):
    """Refuses the optional packages as if they were not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


async def _http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def _main() -> dict[str, Any]:
    from padres.broker import Broker
    from padres.client import Client
    from padres.model.protocol import Notify
    from padres.runtime.node import BrokerNode

    node = BrokerNode(Broker("L1"))
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(port=0, ready=port.set_result))
    url = f"ws://127.0.0.1:{await port}/ws"
    sub = Client(url, "lean-sub")
    pub = Client(url, "lean-pub")
    await sub.connect()
    await pub.connect()
    handle = await sub.subscribe("[class,eq,'lean'],[n,>,0]")
    await pub.advertise("[class,eq,'lean'],[n,isPresent,0]")
    for n in range(3):
        await pub.publish(f"[class,'lean'],[n,{n}]")
    got = []
    for _ in range(2):
        delivery = await handle.get(5)
        assert isinstance(delivery, Notify)
        got.append(delivery.publication.attributes["n"])
    health, _ = await _http_get(node.address[1] if node.address else 0, "/health")
    api, _ = await _http_get(node.address[1] if node.address else 0, "/api/v1/broker")
    await pub.close()
    await sub.close()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    return {"delivered": got, "health": health, "api": api}


def main() -> None:
    sys.meta_path.insert(0, _Absent())
    result = asyncio.run(_main())
    from padres.cli import main as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result["db_exit"] = cli(["db", "--id", "D1"])
    result["db_error"] = err.getvalue()
    result["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in OPTIONAL)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
