"""rete: a Rete matching network for attribute/value facts; it knows nothing of pub/sub."""
