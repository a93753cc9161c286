"""The in-process Transport (`--role all`, tests): JetStream-like pool streams and pub/sub without a broker.

Modules: transport (LoopbackTransport, its lifecycle and the Transport methods), stream (a pool stream: stored
messages, lane queues, the lane consumer's fetch, deliveries), bus (pub/sub and subject patterns), dead_letters
(the bounded in-memory dead letters).
"""

from sie.transport.loopback.transport import LoopbackTransport

__all__ = ["LoopbackTransport"]
