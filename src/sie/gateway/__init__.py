"""The gateway: the HTTP inference API, routing to pool lanes, result collection, read-side config and health."""
