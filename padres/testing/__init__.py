"""Test helpers: broker processes on free ports, and the pytest plugin built on them."""
