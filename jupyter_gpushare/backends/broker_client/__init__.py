"""The GPU broker's client: the same backend protocol over a Unix socket or HTTP, with the
caller's identity (the backend, its transport, the wire format and the broker's live feed)."""
