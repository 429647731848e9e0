"""The message model: messages, the broker protocol, the one codec of the wire format, typed
event classes, timestamps and the PADRES text printer. Imports nothing above ``padres.errors``."""
