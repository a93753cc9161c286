"""Wire formats of SIE: attrs message types, the one cattrs converter, and the msgpack/JSON/numpy codecs.

Imports nothing from other `sie` packages. Message classes live in http, queue, config, ipc, ipc_control
and ipc_batch; error codes in codes; error bodies in envelopes.
"""

from sie.wire.codec import dumps_json, loads_json, packb, unpackb
from sie.wire.converter import from_json, from_msgpack, structure, to_json, to_msgpack, unstructure
from sie.wire.errors import DecodeError, EncodeError, WireError

__all__ = [
    "DecodeError",
    "EncodeError",
    "WireError",
    "dumps_json",
    "from_json",
    "from_msgpack",
    "loads_json",
    "packb",
    "structure",
    "to_json",
    "to_msgpack",
    "unpackb",
    "unstructure",
]
