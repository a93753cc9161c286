"""The queue and bus seam: the `Transport` protocol, with an in-process `loopback` implementation
(for `--role all` and tests) and a NATS JetStream one (distributed mode).
"""
