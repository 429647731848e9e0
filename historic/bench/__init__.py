"""Benchmarks of the historic path: the store, a database node's replay, and the peers."""
