"""The client library: a connection to a broker, delivery handling and transactions."""

from padres.client.connection import BlockingClient, Client

__all__ = ["BlockingClient", "Client"]
