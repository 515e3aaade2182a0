"""Flight SQL protocol messages, built at runtime in a private protobuf pool.

Spec: https://github.com/apache/arrow/blob/main/format/FlightSql.proto (message names and
field numbers) and https://github.com/apache/arrow/blob/main/format/Flight.proto (the
session/cancel actions). Only the wire format matters to clients, so:

- the messages live under our own package ``flightsrv.wire.sql`` in a private
  ``DescriptorPool``: flightsql-dbapi registers ``arrow.flight.protocol.sql.*`` in the default
  pool and a second registration would fail with "duplicate symbol";
- commands travel inside ``google.protobuf.Any`` whose ``type_url`` names Arrow's message,
  ``type.googleapis.com/arrow.flight.protocol.sql.<Message>``: see ``pack`` / ``unpack``;
- no protoc step: the descriptors are built from the small table ``_MESSAGES`` below.

Enums are declared as ``int32`` fields (same varint on the wire); their values are the
``IntEnum`` classes at the bottom of this module.
"""

from __future__ import annotations

import enum

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

ARROW_SQL_PACKAGE = "arrow.flight.protocol.sql"
TYPE_URL_PREFIX = f"type.googleapis.com/{ARROW_SQL_PACKAGE}."

_PACKAGE = "flightsrv.wire.sql"

# name -> [(field, number, type, label)]; label: "" (singular), "opt" (proto3 optional),
# "rep" (repeated). A type that is not a scalar names a message in this table.
# Nested messages are written "Outer.Inner".
_MESSAGES: dict[str, list[tuple[str, int, str, str]]] = {
    "CommandGetSqlInfo": [("info", 1, "uint32", "rep")],
    "CommandGetXdbcTypeInfo": [("data_type", 1, "int32", "opt")],
    "CommandGetCatalogs": [],
    "CommandGetDbSchemas": [
        ("catalog", 1, "string", "opt"),
        ("db_schema_filter_pattern", 2, "string", "opt"),
    ],
    "CommandGetTables": [
        ("catalog", 1, "string", "opt"),
        ("db_schema_filter_pattern", 2, "string", "opt"),
        ("table_name_filter_pattern", 3, "string", "opt"),
        ("table_types", 4, "string", "rep"),
        ("include_schema", 5, "bool", ""),
    ],
    "CommandGetTableTypes": [],
    "CommandGetPrimaryKeys": [
        ("catalog", 1, "string", "opt"),
        ("db_schema", 2, "string", "opt"),
        ("table", 3, "string", ""),
    ],
    "CommandGetExportedKeys": [
        ("catalog", 1, "string", "opt"),
        ("db_schema", 2, "string", "opt"),
        ("table", 3, "string", ""),
    ],
    "CommandGetImportedKeys": [
        ("catalog", 1, "string", "opt"),
        ("db_schema", 2, "string", "opt"),
        ("table", 3, "string", ""),
    ],
    "CommandGetCrossReference": [
        ("pk_catalog", 1, "string", "opt"),
        ("pk_db_schema", 2, "string", "opt"),
        ("pk_table", 3, "string", ""),
        ("fk_catalog", 4, "string", "opt"),
        ("fk_db_schema", 5, "string", "opt"),
        ("fk_table", 6, "string", ""),
    ],
    "ActionCreatePreparedStatementRequest": [
        ("query", 1, "string", ""),
        ("transaction_id", 2, "bytes", "opt"),
    ],
    "ActionCreatePreparedStatementResult": [
        ("prepared_statement_handle", 1, "bytes", ""),
        ("dataset_schema", 2, "bytes", ""),
        ("parameter_schema", 3, "bytes", ""),
    ],
    "ActionClosePreparedStatementRequest": [("prepared_statement_handle", 1, "bytes", "")],
    "ActionBeginTransactionRequest": [],
    "ActionEndTransactionRequest": [
        ("transaction_id", 1, "bytes", ""),
        ("action", 2, "int32", ""),
    ],
    "CommandStatementQuery": [
        ("query", 1, "string", ""),
        ("transaction_id", 2, "bytes", "opt"),
    ],
    "CommandStatementSubstraitPlan": [("transaction_id", 2, "bytes", "opt")],
    "TicketStatementQuery": [("statement_handle", 1, "bytes", "")],
    "CommandPreparedStatementQuery": [("prepared_statement_handle", 1, "bytes", "")],
    "CommandStatementUpdate": [
        ("query", 1, "string", ""),
        ("transaction_id", 2, "bytes", "opt"),
    ],
    "CommandPreparedStatementUpdate": [("prepared_statement_handle", 1, "bytes", "")],
    "CommandStatementIngest.TableDefinitionOptions": [
        ("if_not_exist", 1, "int32", ""),
        ("if_exists", 2, "int32", ""),
    ],
    "CommandStatementIngest.OptionsEntry": [  # map<string, string> options = 1000
        ("key", 1, "string", ""),
        ("value", 2, "string", ""),
    ],
    "CommandStatementIngest": [
        ("table_definition_options", 1, "CommandStatementIngest.TableDefinitionOptions", ""),
        ("table", 2, "string", ""),
        ("schema", 3, "string", "opt"),
        ("catalog", 4, "string", "opt"),
        ("temporary", 5, "bool", ""),
        ("transaction_id", 6, "bytes", "opt"),
        ("options", 1000, "CommandStatementIngest.OptionsEntry", "rep"),
    ],
    "DoPutUpdateResult": [("record_count", 1, "int64", "")],
    "DoPutPreparedStatementResult": [("prepared_statement_handle", 1, "bytes", "opt")],
    "ActionCancelQueryRequest": [("info", 1, "bytes", "")],
    "ActionCancelQueryResult": [("result", 1, "int32", "")],
    # Flight.proto (package arrow.flight.protocol): the body of the "CancelFlightInfo" and
    # "CloseSession" actions. These are sent raw, never inside Any. ``info`` is really a
    # FlightInfo message; reading it as bytes lets pyarrow's FlightInfo.deserialize parse it.
    "CancelFlightInfoRequest": [("info", 1, "bytes", "")],
    "CancelFlightInfoResult": [("status", 1, "int32", "")],
    "CloseSessionRequest": [],
    "CloseSessionResult": [("status", 1, "int32", "")],
    # the session options actions (raw as well). SessionOptionValue's ``oneof
    # option_value`` is declared as proto3-optional fields: the same wire format, and
    # HasField says which one a client set
    "SessionOptionValue.StringListValue": [("values", 1, "string", "rep")],
    "SessionOptionValue": [
        ("string_value", 1, "string", "opt"),
        ("bool_value", 2, "bool", "opt"),
        ("int64_value", 3, "sfixed64", "opt"),
        ("double_value", 4, "double", "opt"),
        ("string_list_value", 5, "SessionOptionValue.StringListValue", "opt"),
    ],
    "SetSessionOptionsRequest.SessionOptionsEntry": [
        ("key", 1, "string", ""),
        ("value", 2, "SessionOptionValue", ""),
    ],
    "SetSessionOptionsRequest": [
        ("session_options", 1, "SetSessionOptionsRequest.SessionOptionsEntry", "rep"),
    ],
    "SetSessionOptionsResult.Error": [("value", 1, "int32", "")],
    "SetSessionOptionsResult.ErrorsEntry": [
        ("key", 1, "string", ""),
        ("value", 2, "SetSessionOptionsResult.Error", ""),
    ],
    "SetSessionOptionsResult": [("errors", 1, "SetSessionOptionsResult.ErrorsEntry", "rep")],
    "GetSessionOptionsRequest": [],
    "GetSessionOptionsResult.SessionOptionsEntry": [
        ("key", 1, "string", ""),
        ("value", 2, "SessionOptionValue", ""),
    ],
    "GetSessionOptionsResult": [
        ("session_options", 1, "GetSessionOptionsResult.SessionOptionsEntry", "rep"),
    ],
}

_MAP_ENTRIES = {"CommandStatementIngest.OptionsEntry",
                "SetSessionOptionsRequest.SessionOptionsEntry",
                "SetSessionOptionsResult.ErrorsEntry",
                "GetSessionOptionsResult.SessionOptionsEntry"}

_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "sfixed64": descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64,
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
}


def _fill_message(msg: descriptor_pb2.DescriptorProto, fields) -> None:
    FD = descriptor_pb2.FieldDescriptorProto
    for name, number, typ, label in fields:
        f = msg.field.add(name=name, number=number, json_name=name)
        if typ in _SCALARS:
            f.type = _SCALARS[typ]
        else:
            f.type = FD.TYPE_MESSAGE
            f.type_name = f".{_PACKAGE}.{typ}"
        f.label = FD.LABEL_REPEATED if label == "rep" else FD.LABEL_OPTIONAL
        if label == "opt":  # proto3 `optional`: a synthetic one-field oneof
            f.proto3_optional = True
            f.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")


def _build_pool() -> descriptor_pool.DescriptorPool:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="flightsrv/wire/flight_sql.proto", package=_PACKAGE, syntax="proto3"
    )
    top: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full in _MESSAGES:  # outer messages first, so nested ones find their parent
        if "." not in full:
            top[full] = fdp.message_type.add(name=full)
    for full, fields in _MESSAGES.items():
        if "." in full:
            outer, inner = full.split(".", 1)
            msg = top[outer].nested_type.add(name=inner)
            if full in _MAP_ENTRIES:
                msg.options.map_entry = True
        else:
            msg = top[full]
        _fill_message(msg, fields)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


_POOL = _build_pool()


def _cls(name: str) -> type[Message]:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


CommandGetSqlInfo = _cls("CommandGetSqlInfo")
CommandGetXdbcTypeInfo = _cls("CommandGetXdbcTypeInfo")
CommandGetCatalogs = _cls("CommandGetCatalogs")
CommandGetDbSchemas = _cls("CommandGetDbSchemas")
CommandGetTables = _cls("CommandGetTables")
CommandGetTableTypes = _cls("CommandGetTableTypes")
CommandGetPrimaryKeys = _cls("CommandGetPrimaryKeys")
CommandGetExportedKeys = _cls("CommandGetExportedKeys")
CommandGetImportedKeys = _cls("CommandGetImportedKeys")
CommandGetCrossReference = _cls("CommandGetCrossReference")
ActionCreatePreparedStatementRequest = _cls("ActionCreatePreparedStatementRequest")
ActionCreatePreparedStatementResult = _cls("ActionCreatePreparedStatementResult")
ActionClosePreparedStatementRequest = _cls("ActionClosePreparedStatementRequest")
ActionBeginTransactionRequest = _cls("ActionBeginTransactionRequest")
ActionEndTransactionRequest = _cls("ActionEndTransactionRequest")
CommandStatementQuery = _cls("CommandStatementQuery")
CommandStatementSubstraitPlan = _cls("CommandStatementSubstraitPlan")
TicketStatementQuery = _cls("TicketStatementQuery")
CommandPreparedStatementQuery = _cls("CommandPreparedStatementQuery")
CommandStatementUpdate = _cls("CommandStatementUpdate")
CommandPreparedStatementUpdate = _cls("CommandPreparedStatementUpdate")
CommandStatementIngest = _cls("CommandStatementIngest")
DoPutUpdateResult = _cls("DoPutUpdateResult")
DoPutPreparedStatementResult = _cls("DoPutPreparedStatementResult")
ActionCancelQueryRequest = _cls("ActionCancelQueryRequest")
ActionCancelQueryResult = _cls("ActionCancelQueryResult")
CancelFlightInfoRequest = _cls("CancelFlightInfoRequest")
CancelFlightInfoResult = _cls("CancelFlightInfoResult")
CloseSessionRequest = _cls("CloseSessionRequest")
CloseSessionResult = _cls("CloseSessionResult")
SessionOptionValue = _cls("SessionOptionValue")
SetSessionOptionsRequest = _cls("SetSessionOptionsRequest")
SetSessionOptionsResult = _cls("SetSessionOptionsResult")
GetSessionOptionsRequest = _cls("GetSessionOptionsRequest")
GetSessionOptionsResult = _cls("GetSessionOptionsResult")

# Messages that may arrive inside an Any, by their Arrow name.
_BY_ARROW_NAME: dict[str, type[Message]] = {
    name: _cls(name) for name in _MESSAGES if "." not in name
}


class ProtocolError(ValueError):
    """Bytes that are not a Flight SQL message we understand."""


def arrow_name(msg: Message) -> str:
    return msg.DESCRIPTOR.name


def pack(msg: Message) -> bytes:
    """Serialize ``msg`` inside an Any whose type_url names Arrow's message."""
    any_msg = any_pb2.Any(type_url=TYPE_URL_PREFIX + arrow_name(msg), value=msg.SerializeToString())
    return any_msg.SerializeToString()


def unpack(data: bytes) -> Message:
    """Parse an Any-wrapped Flight SQL message; ``ProtocolError`` if it is not one."""
    any_msg = any_pb2.Any()
    try:
        any_msg.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"not a protobuf Any: {exc}") from None
    url = any_msg.type_url
    if not url.startswith(TYPE_URL_PREFIX):
        raise ProtocolError(f"unknown command type_url={url!r}")
    cls = _BY_ARROW_NAME.get(url[len(TYPE_URL_PREFIX) :])
    if cls is None:
        raise ProtocolError(f"unsupported Flight SQL message type_url={url!r}")
    return parse(cls, any_msg.value)


def parse(cls: type[Message], data: bytes) -> Message:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"malformed {cls.DESCRIPTOR.name}: {exc}") from None
    return msg


# -- enum values ----------------------------------------------------------------------


class TableNotExistOption(enum.IntEnum):
    UNSPECIFIED = 0
    CREATE = 1
    FAIL = 2


class TableExistsOption(enum.IntEnum):
    UNSPECIFIED = 0
    FAIL = 1
    APPEND = 2
    REPLACE = 3


class CancelStatus(enum.IntEnum):  # Flight.proto CancelStatus
    UNSPECIFIED = 0
    CANCELLED = 1
    CANCELLING = 2
    NOT_CANCELLABLE = 3


class SessionOptionError(enum.IntEnum):  # Flight.proto SetSessionOptionsResult.ErrorValue
    UNSPECIFIED = 0
    INVALID_NAME = 1
    INVALID_VALUE = 2
    ERROR = 3


class CloseSessionStatus(enum.IntEnum):  # Flight.proto CloseSessionResult.Status
    UNSPECIFIED = 0
    CLOSED = 1
    CLOSING = 2
    NOT_CLOSEABLE = 3
