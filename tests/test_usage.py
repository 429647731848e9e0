"""The benchmarks' meter of bytes received: the kernel's count of a process's TCP bytes."""

from __future__ import annotations

import os
import socket

from padres.bench.usage import Meter, per_delivery, received, tcp_received


def test_the_bytes_a_process_receives_on_tcp_are_counted_with_their_framing() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        taker, _ = server.accept()
        with sender, taker:
            meter = Meter(lambda: {}, lambda: {}, received({"me": [os.getpid()]}))
            meter.start()
            sender.sendall(b"x" * 10_000)
            got = 0
            while got < 10_000:
                got += len(taker.recv(65536))
            usage = meter.stop()
    # both ends are this process's: what one sent, the other received
    assert usage.received == {"me": 10_000}
    assert per_delivery(usage, 100)["bytes_received_per_delivery"] == {"me": 100.0}
    assert tcp_received({os.getpid() + 10_000_000}) == 0  # no such process
