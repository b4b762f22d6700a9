from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ParseDocumentRequest(_message.Message):
    __slots__ = ("text", "content", "mime_type", "name")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    text: str
    content: bytes
    mime_type: str
    name: str
    def __init__(self, text: _Optional[str] = ..., content: _Optional[bytes] = ..., mime_type: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Section(_message.Message):
    __slots__ = ("heading", "level", "paragraphs")
    HEADING_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARAGRAPHS_FIELD_NUMBER: _ClassVar[int]
    heading: str
    level: int
    paragraphs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, heading: _Optional[str] = ..., level: _Optional[int] = ..., paragraphs: _Optional[_Iterable[str]] = ...) -> None: ...

class ParseDocumentResponse(_message.Message):
    __slots__ = ("title", "sections", "paragraphs", "word_count", "text", "mime_type", "name")
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    PARAGRAPHS_FIELD_NUMBER: _ClassVar[int]
    WORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    title: str
    sections: _containers.RepeatedCompositeFieldContainer[Section]
    paragraphs: _containers.RepeatedScalarFieldContainer[str]
    word_count: int
    text: str
    mime_type: str
    name: str
    def __init__(self, title: _Optional[str] = ..., sections: _Optional[_Iterable[_Union[Section, _Mapping]]] = ..., paragraphs: _Optional[_Iterable[str]] = ..., word_count: _Optional[int] = ..., text: _Optional[str] = ..., mime_type: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ReviewRequest(_message.Message):
    __slots__ = ("title", "word_count", "name")
    TITLE_FIELD_NUMBER: _ClassVar[int]
    WORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    title: str
    word_count: int
    name: str
    def __init__(self, title: _Optional[str] = ..., word_count: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ReviewVerdict(_message.Message):
    __slots__ = ("approved", "note")
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    approved: bool
    note: str
    def __init__(self, approved: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class ReviewedDocument(_message.Message):
    __slots__ = ("name", "title", "word_count", "approved", "note")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    WORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    name: str
    title: str
    word_count: int
    approved: bool
    note: str
    def __init__(self, name: _Optional[str] = ..., title: _Optional[str] = ..., word_count: _Optional[int] = ..., approved: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...
