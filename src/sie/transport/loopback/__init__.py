"""The in-process Transport (`--role all`, tests): JetStream-like pool streams and pub/sub without a broker.

Modules: transport (lifecycle, the Transport methods), stream (messages, timers, settlement), lane (ready
queues and waiting fetchers), consumer (fetch), delivery (settlement verbs), bus (pub/sub), subjects.
"""

from sie.transport.loopback.transport import LoopbackTransport

__all__ = ["LoopbackTransport"]
