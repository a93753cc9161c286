"""Sidecar ↔ worker IPC: the WorkerClient protocol, the framed-msgpack Unix-socket client and server,
and response chunking. In `--role all` the worker service is called directly through the same protocol.
"""
