"""The protobuf messages of the KServe V2 / Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`),
the subset SIE serves: liveness and readiness, server and model metadata, and ModelInfer. They are declared here
field by field, with the names and numbers of the protocol's `grpc_predict_v2.proto` (which Triton's
`grpc_service.proto` extends), and built at import into a private descriptor pool: no generated code, no protoc at
build time, and no clash with a client's own copy of the same messages in one process.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE: Final = "inference"
SERVICE: Final = f"{PACKAGE}.GRPCInferenceService"

_Field = descriptor_pb2.FieldDescriptorProto
BOOL, INT32, INT64, UINT32, UINT64 = (
    _Field.TYPE_BOOL,
    _Field.TYPE_INT32,
    _Field.TYPE_INT64,
    _Field.TYPE_UINT32,
    _Field.TYPE_UINT64,
)
FLOAT, DOUBLE, STRING, BYTES, MESSAGE = (
    _Field.TYPE_FLOAT,
    _Field.TYPE_DOUBLE,
    _Field.TYPE_STRING,
    _Field.TYPE_BYTES,
    _Field.TYPE_MESSAGE,
)
REPEATED = "repeated"
MAP = "map"  # map<string, InferParameter>, as every `parameters` field of the protocol is

# message -> [(field, number, type, label or message type)]; nested messages are "Outer.Inner".
MESSAGES: Final[dict[str, list[tuple[Any, ...]]]] = {
    "InferParameter": [("bool_param", 1, BOOL), ("int64_param", 2, INT64), ("string_param", 3, STRING),
                       ("double_param", 4, DOUBLE), ("uint64_param", 5, UINT64)],  # one of them: parameter_choice
    "InferTensorContents": [("bool_contents", 1, BOOL, REPEATED), ("int_contents", 2, INT32, REPEATED),
                            ("int64_contents", 3, INT64, REPEATED), ("uint_contents", 4, UINT32, REPEATED),
                            ("uint64_contents", 5, UINT64, REPEATED), ("fp32_contents", 6, FLOAT, REPEATED),
                            ("fp64_contents", 7, DOUBLE, REPEATED), ("bytes_contents", 8, BYTES, REPEATED)],
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, BOOL)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, BOOL)],
    "ModelReadyRequest": [("name", 1, STRING), ("version", 2, STRING)],
    "ModelReadyResponse": [("ready", 1, BOOL)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, STRING), ("version", 2, STRING), ("extensions", 3, STRING, REPEATED)],
    "ModelMetadataRequest": [("name", 1, STRING), ("version", 2, STRING)],
    "ModelMetadataResponse.TensorMetadata": [("name", 1, STRING), ("datatype", 2, STRING),
                                             ("shape", 3, INT64, REPEATED)],
    "ModelMetadataResponse": [("name", 1, STRING), ("versions", 2, STRING, REPEATED), ("platform", 3, STRING),
                              ("inputs", 4, MESSAGE, REPEATED, "ModelMetadataResponse.TensorMetadata"),
                              ("outputs", 5, MESSAGE, REPEATED, "ModelMetadataResponse.TensorMetadata")],
    "ModelInferRequest.InferInputTensor": [("name", 1, STRING), ("datatype", 2, STRING),
                                           ("shape", 3, INT64, REPEATED), ("parameters", 4, MESSAGE, MAP),
                                           ("contents", 5, MESSAGE, None, "InferTensorContents")],
    "ModelInferRequest.InferRequestedOutputTensor": [("name", 1, STRING), ("parameters", 2, MESSAGE, MAP)],
    "ModelInferRequest": [("model_name", 1, STRING), ("model_version", 2, STRING), ("id", 3, STRING),
                          ("parameters", 4, MESSAGE, MAP),
                          ("inputs", 5, MESSAGE, REPEATED, "ModelInferRequest.InferInputTensor"),
                          ("outputs", 6, MESSAGE, REPEATED, "ModelInferRequest.InferRequestedOutputTensor"),
                          ("raw_input_contents", 7, BYTES, REPEATED)],
    "ModelInferResponse.InferOutputTensor": [("name", 1, STRING), ("datatype", 2, STRING),
                                             ("shape", 3, INT64, REPEATED), ("parameters", 4, MESSAGE, MAP),
                                             ("contents", 5, MESSAGE, None, "InferTensorContents")],
    "ModelInferResponse": [("model_name", 1, STRING), ("model_version", 2, STRING), ("id", 3, STRING),
                           ("parameters", 4, MESSAGE, MAP),
                           ("outputs", 5, MESSAGE, REPEATED, "ModelInferResponse.InferOutputTensor"),
                           ("raw_output_contents", 6, BYTES, REPEATED)],
}  # fmt: skip
# ModelInfer and the unary calls SIE answers: method -> (request message, response message).
METHODS: Final = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}


def _field(message: descriptor_pb2.DescriptorProto, path: str, spec: tuple[Any, ...]) -> None:
    """Add one field to `message` (whose full name in the package is `path`); a map field gets its entry type."""
    name, number, kind, label, type_name = (*spec, None, None)[:5]
    field = message.field.add(name=name, number=number, type=kind)
    field.label = _Field.LABEL_REPEATED if label in (REPEATED, MAP) else _Field.LABEL_OPTIONAL
    if label == MAP:
        entry = message.nested_type.add(name="ParametersEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=STRING, label=_Field.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=MESSAGE, label=_Field.LABEL_OPTIONAL,
                        type_name=f".{PACKAGE}.InferParameter")  # fmt: skip
        field.type_name = f".{PACKAGE}.{path}.ParametersEntry"
    elif type_name is not None:
        field.type_name = f".{PACKAGE}.{type_name}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="sie/kserve_v2.proto", package=PACKAGE, syntax="proto3")
    built: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name, fields in MESSAGES.items():
        outer, _, inner = full_name.partition(".")
        if inner:  # nested types are declared before their outer message, which then adopts them
            message = descriptor_pb2.DescriptorProto(name=inner)
        else:
            message = proto.message_type.add(name=outer)
            for nested_name, nested in list(built.items()):
                if nested_name.startswith(f"{outer}."):
                    message.nested_type.add().CopyFrom(nested)
                    del built[nested_name]
        for spec in fields:
            _field(message, full_name, spec)
        if inner:
            built[full_name] = message
    parameter = next(message for message in proto.message_type if message.name == "InferParameter")
    parameter.oneof_decl.add(name="parameter_choice")
    for field in parameter.field:
        field.oneof_index = 0
    return proto


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())


def message_class(name: str) -> type[Any]:
    """The message class of `name` (e.g. `ModelInferRequest`)."""
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServerLiveResponse = message_class("ServerLiveResponse")
ServerReadyResponse = message_class("ServerReadyResponse")
ModelReadyResponse = message_class("ModelReadyResponse")
ServerMetadataResponse = message_class("ServerMetadataResponse")
ModelMetadataResponse = message_class("ModelMetadataResponse")
ModelInferRequest = message_class("ModelInferRequest")
ModelInferResponse = message_class("ModelInferResponse")
