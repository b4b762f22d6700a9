from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateStructuredRequest(_message.Message):
    __slots__ = ("target_type", "model", "max_attempts", "grounding")
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    GROUNDING_FIELD_NUMBER: _ClassVar[int]
    target_type: str
    model: str
    max_attempts: int
    grounding: _any_pb2.Any
    def __init__(self, target_type: _Optional[str] = ..., model: _Optional[str] = ..., max_attempts: _Optional[int] = ..., grounding: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class GenerateStructuredResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: _any_pb2.Any
    def __init__(self, message: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...
