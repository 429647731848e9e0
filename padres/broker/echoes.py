"""Settled routing: propagation with feedback over the FIFO links between brokers.

Every routing message a broker sends to a neighbour (``RouteAdvertise``, ``RouteSubscribe``)
carries an *echo token*; the neighbour answers each with ``Echo(token)`` once what the message
set off has settled beyond it:

- an advertisement it accepted has been flooded on, and every neighbour it went to has echoed;
  a copy it ignored (it already has the tree) is echoed at once;
- a subscription it received has been forwarded toward the roots of its trees and those
  forwards have echoed, or it is hidden behind a covering subscription whose own forward has
  echoed; at a tree's root there is nothing to forward.

Links are FIFO and a broker sends what it owes on a link (the subscriptions an advertisement
draws back, forwards of subscriptions from below) before it echoes on that link, so when the
echoes are back at the broker that started, the advertisement has reached every broker and the
subscriptions overlapping it are at the advertiser's broker; or the subscription has reached the
broker of every overlapping advertisement. Only then does the client get its ``Ok``.

A link that fails with echoes outstanding ends those waits: the answer names what is
incomplete (``Echo.incomplete`` and ``Ok.incomplete``), and nothing waits for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from padres.broker.routes import Out
from padres.model.protocol import Echo, Ok

__all__ = ["Echoes"]

Reply = Callable[[tuple[str, ...]], Out]
"""Builds the message to send when a wait is over, given what is incomplete."""


@dataclass
class _Sent:
    """A routing message sent to ``hop``, waiting for its echo."""

    hop: str
    labels: tuple[Hashable, ...]
    waiters: set[int] = field(default_factory=set)


@dataclass
class _Wait:
    pending: set[str]
    """Tokens of sent messages whose echo this wait needs."""
    reply: Reply
    hop: str
    """Where the reply goes (a client's hop, or the neighbour to echo to)."""
    incomplete: list[str] = field(default_factory=list)


class Echoes:
    """A broker's outstanding echoes, and the answers waiting on them."""

    def __init__(self) -> None:
        self._count = 0
        self._sent: dict[str, _Sent] = {}
        self._labels: dict[Hashable, str] = {}
        """What a pending message was sent for (a subscription at a slot) -> its token."""
        self._waits: dict[int, _Wait] = {}
        self._awaited: dict[str, int] = {}
        """Per hop, how many of the messages sent to it have not echoed."""

    def __len__(self) -> int:
        return len(self._sent) + len(self._waits)

    def sent(self, hop: str, labels: Iterable[Hashable] = ()) -> str:
        """A routing message is going to ``hop``: the token it carries."""
        self._count += 1
        token = f"e{self._count}"
        record = self._sent[token] = _Sent(hop, tuple(labels))
        self._awaited[hop] = self._awaited.get(hop, 0) + 1
        for label in record.labels:
            self._labels[label] = token
        return token

    def awaited(self, hop: str) -> bool:
        """Whether a routing message sent to ``hop`` has not echoed yet: ``hop`` may not
        have taken it in."""
        return hop in self._awaited

    def pending(self, label: Hashable) -> str | None:
        """The token of the message sent for ``label`` if its echo has not come back."""
        return self._labels.get(label)

    def wait(self, tokens: Iterable[str], hop: str, reply: Reply) -> list[Out]:
        """Send ``reply(incomplete)`` to ``hop`` once every token in ``tokens`` has echoed
        (at once if none is outstanding).

        A wait never waits for an echo from ``hop`` itself. What settles beyond a message from
        ``hop`` never goes back to it (a flood leaves out the copy's sender, a subscription
        travels away from the child that sent it), so such a token is left over from an
        earlier state of the routing: a tree that reached this broker along another path
        before it was lost. ``hop`` may wait for this broker's echo in turn, and neither would
        ever answer."""
        pending = {t for t in tokens if t in self._sent and self._sent[t].hop != hop}
        if not pending:
            return [reply(())]
        self._count += 1
        key = self._count
        self._waits[key] = _Wait(pending, reply, hop)
        for token in pending:
            self._sent[token].waiters.add(key)
        return []

    def ok(self, tokens: Iterable[str], hop: str, ref: str) -> list[Out]:
        """Acknowledge request ``ref`` to the client on ``hop`` once ``tokens`` have echoed."""
        return self.wait(tokens, hop, lambda incomplete: (hop, Ok(ref, incomplete)))

    def relay(self, tokens: Iterable[str], hop: str, echo: str) -> list[Out]:
        """Echo ``echo`` back to the neighbour on ``hop`` once ``tokens`` have echoed."""
        return self.wait(tokens, hop, lambda incomplete: (hop, Echo(echo, incomplete)))

    def echo(self, token: str, hop: str, incomplete: tuple[str, ...] = ()) -> list[Out]:
        """``hop`` echoed ``token``; returns the replies of the waits now complete."""
        record = self._sent.get(token)
        if record is None or record.hop != hop:
            return []
        return self._done(token, incomplete)

    def supersede(self, old: str, new: str) -> None:
        """The message sent with token ``old`` was replaced by the one sent with ``new``: the
        waits for ``old`` wait for ``new`` instead, and ``old`` is forgotten."""
        if old not in self._sent or new not in self._sent:
            return
        record = self._sent.pop(old)
        self._unawait(record.hop)
        for label in record.labels:
            if self._labels.get(label) == old:
                del self._labels[label]
        for key in record.waiters:
            wait = self._waits[key]
            wait.pending.discard(old)
            wait.pending.add(new)
            self._sent[new].waiters.add(key)

    def hop_down(self, hop: str, why: str) -> list[Out]:
        """``hop`` is gone: its echoes will not come (the waits learn ``why``), and replies
        that were to go to it are dropped."""
        for key in [k for k, w in self._waits.items() if w.hop == hop]:
            for token in self._waits.pop(key).pending:
                self._sent[token].waiters.discard(key)
        out: list[Out] = []
        for token in [t for t, s in self._sent.items() if s.hop == hop]:
            out += self._done(token, (why,))
        return out

    def _done(self, token: str, incomplete: tuple[str, ...]) -> list[Out]:
        record = self._sent.pop(token)
        self._unawait(record.hop)
        for label in record.labels:
            if self._labels.get(label) == token:
                del self._labels[label]
        out: list[Out] = []
        for key in sorted(record.waiters):
            wait = self._waits[key]
            wait.pending.discard(token)
            wait.incomplete += [i for i in incomplete if i not in wait.incomplete]
            if not wait.pending:
                del self._waits[key]
                out.append(wait.reply(tuple(wait.incomplete)))
        return out

    def _unawait(self, hop: str) -> None:
        left = self._awaited[hop] - 1
        if left:
            self._awaited[hop] = left
        else:
            del self._awaited[hop]
