"""Covering among the members of a subscription group at their broker (``Subscribe.group``).

A publication reaches a group once if it matches any of its members, so a member covered by
another of the same group changes nothing the group receives. Only the members no other member
covers need matching: the routing network holds those (*matched*); each of the others is
*hidden* under one that covers it, and is matched in its place when that one leaves and no
other matched member covers it. Forwarding is another matter: every member is still forwarded,
or hidden, toward the advertisements it overlaps as any subscription is (``routes``).

A client's third of the subscriptions of ``padres bench network`` (3,333 stock-quote filters)
held as a group keeps about a quarter of them in the network (850), and its broker matches each
publication against those only.
"""

from __future__ import annotations

from padres.matching.relations import EqKey, covering, eq_key
from padres.model.messages import Filter

__all__ = ["Groups"]


class Groups:
    """The members of every group at one broker: which are matched, which hidden, under what."""

    def __init__(self, scan: int) -> None:
        """``scan``: matched members tried as covers of a new one, at most (beyond those with
        the very same filter)."""
        self._scan = scan
        self._matched: dict[str, dict[EqKey, dict[Filter, set[str]]]] = {}
        """Per group, its matched members by equality key and filter."""
        self.group_of: dict[str, str] = {}
        """Every member's group."""
        self._filters: dict[str, Filter] = {}
        self._hidden_by: dict[str, str] = {}
        self._hides: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.group_of)

    def add(self, group: str, member: str, flt: Filter) -> bool:
        """A new member of ``group``: whether it is to be matched (False: a matched member of
        the group covers it, and it is hidden under that one)."""
        self.group_of[member] = group
        self._filters[member] = flt
        return self._place(group, member, flt)

    def remove(self, member: str) -> list[tuple[str, Filter]]:
        """Forget ``member``: the members to be matched from now on in its place (those hidden
        under it that no other matched member covers)."""
        group, flt = self.group_of.pop(member), self._filters.pop(member)
        coverer = self._hidden_by.pop(member, None)
        if coverer is not None:
            hidden = self._hides[coverer]
            hidden.discard(member)
            if not hidden:
                del self._hides[coverer]
            return []
        by_key = self._matched[group]
        key = eq_key(flt)
        same = by_key[key][flt]
        same.discard(member)
        if not same:
            del by_key[key][flt]
            if not by_key[key]:
                del by_key[key]
                if not by_key:
                    del self._matched[group]
        shown: list[tuple[str, Filter]] = []
        for hidden_member in sorted(self._hides.pop(member, ())):
            del self._hidden_by[hidden_member]
            hidden_filter = self._filters[hidden_member]
            if self._place(group, hidden_member, hidden_filter):
                shown.append((hidden_member, hidden_filter))
        return shown

    def _place(self, group: str, member: str, flt: Filter) -> bool:
        """Hide ``member`` under a matched member covering it, or make it a matched one."""
        coverer = self._coverer(group, flt)
        if coverer is not None:
            self._hidden_by[member] = coverer
            self._hides.setdefault(coverer, set()).add(member)
            return False
        by_key = self._matched.setdefault(group, {})
        by_key.setdefault(eq_key(flt), {}).setdefault(flt, set()).add(member)
        return True

    def _coverer(self, group: str, flt: Filter) -> str | None:
        """A matched member of ``group`` covering ``flt``, if one is found among ``scan``."""
        members = covering(self._matched.get(group, {}), flt, self._scan)
        return None if members is None else min(members)
