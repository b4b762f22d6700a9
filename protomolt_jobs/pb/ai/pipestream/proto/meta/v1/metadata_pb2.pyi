from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor
FIELD_FIELD_NUMBER: _ClassVar[int]
field: _descriptor.FieldDescriptor
MESSAGE_FIELD_NUMBER: _ClassVar[int]
message: _descriptor.FieldDescriptor

class FieldMeta(_message.Message):
    __slots__ = ("description", "display_name", "owner", "sensitivity", "labels", "json_name")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    JSON_NAME_FIELD_NUMBER: _ClassVar[int]
    description: str
    display_name: str
    owner: str
    sensitivity: str
    labels: _containers.ScalarMap[str, str]
    json_name: str
    def __init__(self, description: _Optional[str] = ..., display_name: _Optional[str] = ..., owner: _Optional[str] = ..., sensitivity: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., json_name: _Optional[str] = ...) -> None: ...

class MessageMeta(_message.Message):
    __slots__ = ("description", "owner", "sensitivity", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    description: str
    owner: str
    sensitivity: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, description: _Optional[str] = ..., owner: _Optional[str] = ..., sensitivity: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...
