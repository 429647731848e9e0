"""The curated public API: what ``import padres`` offers, and nothing private leaking."""

from __future__ import annotations

import padres


def test_public_names_are_exported_and_exist() -> None:
    assert sorted(padres.__all__) == padres.__all__
    for name in padres.__all__:
        assert not name.startswith("_")
        assert getattr(padres, name) is not None


def test_core_api_is_present() -> None:
    for name in (
        "Publication",
        "Subscription",
        "Advertisement",
        "CompositeSubscription",
        "Unsubscribe",
        "Unadvertise",
        "parse_message",
        "parse_batch",
        "encode",
        "decode",
        "ReferenceMatcher",
        "ParseError",
        "DecodeError",
    ):
        assert name in padres.__all__
