"""The runtime: the asyncio shell around the broker core (the broker node, its send queues and
links), the in-process simulation of an overlay, and the one backoff every reconnection uses."""
