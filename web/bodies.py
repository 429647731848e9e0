"""Request bodies the API declares (the publication bodies are read by hand: PADRES text or
JSON, see ``publishing``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from padres.model.protocol import MAX_PRIORITY

__all__ = ["AdvertisementBody", "StoreBody", "SubscriptionBody", "TraceBody"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdvertisementBody(_Strict):
    filter: str | list[list[Any]] = Field(
        description="PADRES text, or the wire format's list of predicates",
        examples=["[class,eq,'STOCK'],[price,isPresent,0]"],
    )
    client: str | None = Field(
        None, description="the publisher that advertises (default: web, or the user with accounts)"
    )


class SubscriptionBody(_Strict):
    filter: str | list[list[Any]] | None = Field(
        None,
        description="an atomic subscription: PADRES text or wire predicates",
        examples=["[class,eq,'STOCK'],[price,>,10]"],
    )
    expression: str | dict[str, Any] | None = Field(
        None,
        description="a composite subscription: PADRES text ({...} & {...}) or a wire expression",
    )
    durable: bool = Field(
        False, description="the broker keeps its deliveries while no stream reads it"
    )
    name: str | None = Field(
        None, description="the subscription's id (a durable subscription's name); made up if absent"
    )
    priority: StrictInt = Field(
        0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="where its deliveries come among its client's subscriptions matching the "
        "same publication, higher first (each REST subscription is a client of its own)",
    )
    scope: Literal["global", "local"] = Field(
        "global",
        description="global: publications from anywhere in the overlay; local: only those "
        "published by clients of this broker",
    )


class StoreBody(_Strict):
    filter: str = Field(description="what to store or stop storing (PADRES text)")


class TraceBody(_Strict):
    filter: str | None = Field(
        None, description="trace the next publications matching this (PADRES text)"
    )
    publication: str | dict[str, Any] | None = Field(
        None, description="publish this (PADRES text or attributes) and trace it"
    )
    client: str = Field("web", description="the publisher of 'publication'")
