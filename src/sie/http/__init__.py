"""HTTP plumbing the gateway and the config service share: serving an ASGI app with hypercorn or uvicorn on
the role's own event loop, and reading a request body under a byte cap. No routes and no domain code here."""
