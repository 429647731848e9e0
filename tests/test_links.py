"""Links between broker cores on connections of their own (``Links``): a neighbour that dials
again replaces its old link at once, while two brokers that each dial the other keep both."""

from __future__ import annotations

from collections import deque

from padres.broker import Broker
from padres.language.parser import parse_advertisement, parse_publication, parse_subscription
from padres.model.protocol import Envelope, Notify, Role
from padres.security.accounts import Credentials


class Wires:
    """Broker cores joined by connections, each with a hop name at either end; what goes to
    a hop with no wire is kept in ``got`` (a client's)."""

    def __init__(self, *ids: str) -> None:
        self.cores = {i: Broker(i) for i in ids}
        self.wires: dict[tuple[str, str], tuple[str, str]] = {}
        self.queue: deque[tuple[str, str, Envelope]] = deque()
        self.got: dict[tuple[str, str], list[Envelope]] = {}

    def dial(self, x: str, hx: str, y: str, hy: str) -> None:
        """``x`` dials ``y``: hop ``hx`` at ``x``, ``hy`` at ``y``."""
        self.wires[(x, hx)] = (y, hy)
        self.wires[(y, hy)] = (x, hx)
        self.emit(x, self.cores[x].open_link(hx))

    def cut(self, x: str, hx: str) -> None:
        """``x`` sees its connection ``hx`` end (the other end may not have yet)."""
        self.wires.pop((x, hx), None)
        self.emit(x, self.cores[x].close(hx))

    def emit(self, source: str, outs: list[tuple[str, Envelope]]) -> None:
        for hop, message in outs:
            if (source, hop) in self.wires:
                self.queue.append((source, hop, message))
            else:
                self.got.setdefault((source, hop), []).append(message)

    def client(self, broker: str, hop: str, message: Envelope) -> None:
        self.emit(broker, self.cores[broker].handle(message, hop))
        self.run()

    def run(self) -> None:
        while self.queue:
            source, hop, message = self.queue.popleft()
            if (source, hop) in self.wires:
                target, there = self.wires[(source, hop)]
                self.emit(target, self.cores[target].handle(message, there))

    def notified(self, broker: str, hop: str) -> list[object]:
        got = self.got.pop((broker, hop), [])
        return [m.publication.attributes["n"] for m in got if isinstance(m, Notify)]


def _publisher_at_c_subscriber_at_a() -> Wires:
    w = Wires("A", "B", "C")
    w.dial("A", "a-b", "B", "b-a")
    w.dial("C", "c-b1", "B", "b-c1")
    w.run()
    hello = Credentials().hello
    w.client("C", "pub", hello("pub", Role.CLIENT))
    w.client("A", "sub", hello("sub", Role.CLIENT))
    w.client("C", "pub", parse_advertisement("[class,eq,'X'],[n,isPresent,0]", id="a1"))
    w.client("A", "sub", parse_subscription("[class,eq,'X']", id="s1"))
    w.client("C", "pub", parse_publication("[class,'X'],[n,1]", id="p1"))
    assert w.notified("A", "sub") == [1]
    return w


def test_a_neighbour_that_dials_again_replaces_its_old_link_at_once() -> None:
    """C gave up on its link to B and dialled again; B has not noticed the old connection's
    end yet. The new link carries C's publications at once, not once B notices."""
    w = _publisher_at_c_subscriber_at_a()
    w.cut("C", "c-b1")  # only C's end: B still holds b-c1
    w.dial("C", "c-b2", "B", "b-c2")
    w.run()
    assert w.cores["B"].peers == {"b-a": "A", "b-c2": "C"}
    w.client("C", "pub", parse_publication("[class,'X'],[n,2]", id="p2"))
    assert w.notified("A", "sub") == [2]
    w.cut("B", "b-c1")  # B notices at last: nothing changes
    w.run()
    w.client("C", "pub", parse_publication("[class,'X'],[n,3]", id="p3"))
    assert w.notified("A", "sub") == [3]


def test_two_brokers_that_each_dial_the_other_keep_both_links() -> None:
    w = _publisher_at_c_subscriber_at_a()
    w.dial("B", "b-c3", "C", "c-b3")
    w.run()
    assert w.cores["B"].peers == {"b-a": "A", "b-c1": "C", "b-c3": "C"}
    w.client("C", "pub", parse_publication("[class,'X'],[n,2]", id="p2"))
    assert w.notified("A", "sub") == [2]
