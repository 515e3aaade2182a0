"""DoPut payloads: bulk ingest (``CommandStatementIngest``) and bound parameters.

Contract:

- ``ingest_mode(cmd, table_exists)`` maps Flight SQL's ``TableDefinitionOptions`` to an
  ``IngestMode`` (INVALID_ARGUMENT for combinations we do not serve; NOT_FOUND for
  REPLACE with ``if_not_exist=FAIL`` on a missing table).
- ``check_target(cmd)`` refuses temporary tables, transactions and any catalog or schema
  but ``flightsrv``/``main``.
- ``limited(reader, max_bytes)`` is the client's stream as a ``RecordBatchReader`` that
  raises ``LimitExceeded`` (naming ``max_message_bytes``) on a batch larger than
  ``max_bytes``, and ``QueryCancelled`` once ``cancel`` trips or when the stream ends
  because the client cancelled the call; it is read lazily, so an ingest streams and never
  holds the whole upload.
- ``read_params(reader, max_bytes)`` is the bound parameters as one batch (dense-union
  columns from flightsql-dbapi made plain), or None when none were sent.

pyarrow's server keeps gRPC's message size unlimited and offers no hook to change it, so
the limit is checked on each decoded batch: an oversized message is refused before it is
used, but after it was received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from flightsrv import errors
from flightsrv.engine.api import Cancel, IngestMode
from flightsrv.server import metadata as md
from flightsrv.server import proto
from flightsrv.server.status import invalid, unimplemented


def check_target(cmd) -> str:
    table = cmd.table
    if not table:
        raise invalid("ingest needs a table name")
    if cmd.HasField("transaction_id"):
        raise unimplemented("transactions are not supported (transaction_id given)",
                            table=table)
    if cmd.temporary:
        raise unimplemented("temporary tables are not supported", table=table)
    for field_name, expected in (("catalog", md.CATALOG), ("schema", md.DB_SCHEMA)):
        given = getattr(cmd, field_name) if cmd.HasField(field_name) else None
        # in any case, as SQL resolves ``MAIN.t`` (SqlInfo SQL_IDENTIFIER_CASE)
        if given and given.casefold() != expected.casefold():
            raise invalid(f"unknown {field_name} (only {expected!r} exists)",
                          **{field_name: given}, table=table)  # fmt: skip
    return table


def ingest_mode(cmd, table_exists: Callable[[], bool]) -> IngestMode:
    opts = cmd.table_definition_options
    N, E = proto.TableNotExistOption, proto.TableExistsOption
    not_exist, exists = N(opts.if_not_exist), E(opts.if_exists)
    if not_exist == N.CREATE and exists == E.FAIL:
        return IngestMode.CREATE
    if not_exist == N.FAIL and exists == E.APPEND:
        return IngestMode.APPEND
    if not_exist == N.CREATE and exists == E.APPEND:
        return IngestMode.CREATE_APPEND
    if exists == E.REPLACE and not_exist in (N.CREATE, N.FAIL):
        if not_exist == N.FAIL and not table_exists():
            raise errors.TableNotFound("ingest with if_not_exist=FAIL", table=cmd.table)
        return IngestMode.REPLACE
    raise invalid("unsupported ingest table_definition_options",
                  if_not_exist=not_exist.name, if_exists=exists.name, table=cmd.table)


def _too_big(batch: pa.RecordBatch, max_bytes: int) -> errors.LimitExceeded:
    return errors.LimitExceeded("DoPut message larger than the server accepts; send "
                                "smaller record batches", limit="max_message_bytes",
                                value=max_bytes, bytes=batch.nbytes)


def limited(reader, max_bytes: int, cancel: Cancel | None = None,
            gone: Callable[[], bool] | None = None) -> pa.RecordBatchReader:
    """``reader`` (a ``flight.MetadataRecordBatchReader``) as a checked batch stream.
    ``gone()``: whether the client cancelled the call. It is asked at the end of the
    stream: a client whose own data source failed part way (ADBC) cancels the call, and
    the server then sees an ordinary end of stream; those rows must not be committed."""
    schema = reader.schema

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            if cancel is not None:
                cancel.check()
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                if gone is not None and gone():
                    raise errors.QueryCancelled(
                        "the client cancelled the upload before it ended; nothing was "
                        "committed", reason="cancelled") from None
                return
            batch = chunk.data
            if batch is None:
                continue
            if batch.nbytes > max_bytes:
                raise _too_big(batch, max_bytes)
            yield batch

    return pa.RecordBatchReader.from_batches(schema, batches())


def carries_rows(reader, max_bytes: int) -> bool:
    """Whether a DoPut that takes no data (CommandStatementUpdate) came with rows: they
    would be ignored, so the caller refuses the request instead. A client may send the
    command alone, without even a schema message (ADBC's ``execute_update``)."""
    try:
        if len(reader.schema) == 0:
            return False
    except OSError:  # "Client never sent a data message": no schema, so no rows
        return False
    return any(batch.num_rows for batch in limited(reader, max_bytes))


def read_params(reader, max_bytes: int) -> pa.RecordBatch | None:
    stream = limited(reader, max_bytes)
    if len(stream.schema) == 0:
        return None
    batches = list(stream)
    if len(batches) == 1 and not any(pa.types.is_union(t) for t in stream.schema.types):
        # the usual bind: one batch (checked against max_bytes as it was read), its columns
        # as they came, under plain fields of their names (as below)
        return pa.RecordBatch.from_arrays(batches[0].columns, names=stream.schema.names)
    table = pa.Table.from_batches(batches, schema=stream.schema)
    if table.nbytes > max_bytes:
        # every batch passed; all of them together are one execution's parameter set,
        # held in memory at once, and bounded by the same figure
        raise errors.LimitExceeded(
            "the parameters bound in one DoPut (all record batches together) are larger "
            "than the server accepts; bind fewer rows per execution",
            limit="max_message_bytes", value=max_bytes, bytes=table.nbytes)
    columns = []
    for column in table.columns:
        if pa.types.is_union(column.type):
            column = _union_values(column.combine_chunks(), len(columns) + 1)
        else:
            column = column.combine_chunks()
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=table.column_names)


def _union_values(column: pa.UnionArray, number: int) -> pa.Array:
    """A parameter column a client bound as a union of types (the JDBC driver does) as
    the values of their own type: the one child every row uses, taken without a round trip
    through Python (which cannot hold a BC date); rows of different types go through
    Python, which must then hold every value."""
    codes = column.type_codes.to_numpy(zero_copy_only=False)
    if len(codes) and (codes == codes[0]).all():
        child = column.field(column.type.type_codes.index(int(codes[0])))
        if column.type.mode == "dense":
            return child.take(column.offsets)
        return child
    try:
        return pa.array(column.to_pylist())
    except (OverflowError, ValueError, pa.ArrowException):
        raise errors.SqlError("a bound parameter value cannot be read (outside the range "
                              "of its type)", parameter=f"${number}") from None
