"""The NATS Transport (distributed mode): JetStream WorkQueue streams `WORK_POOL_{pool}` with durable lane
consumers, and core pub/sub for results and control messages; the only package that imports nats-py.

Modules: transport (lifecycle, the Transport methods), connection, streams (ensure + reconcile), work
(publish_work, pending), consumer (pull fetch), delivery (settlement verbs), dead_letters (the
DEAD_LETTERS stream), worker_streams (list and delete the workers' direct-dispatch streams), kv (the SIE_POOLS
key-value bucket), bus (pub/sub), scan (fast request-id scan), errors (nats-py -> TransportError), cache.
"""

from sie.transport.nats.kv import POOL_BUCKET, JetStreamKeyValue
from sie.transport.nats.scan import peek_request_id
from sie.transport.nats.transport import NatsTransport

__all__ = ["POOL_BUCKET", "JetStreamKeyValue", "NatsTransport", "peek_request_id"]
