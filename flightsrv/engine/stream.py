"""Streaming a statement's result out of DuckDB: batches pulled from a cursor's Arrow reader
(errors raised inside our scans explain DuckDB's generic ones), small batches coalesced, rows
counted on the way into a table."""

from __future__ import annotations

import re
from collections.abc import Iterator

import duckdb
import pyarrow as pa

from flightsrv.engine.api import Cancel, ExecInfo
from flightsrv.engine.relations import native_failure
from flightsrv.errors import FlightsrvError, SqlError
from flightsrv.sql import statements as st
from flightsrv.sql.binder import RESERVED
from flightsrv.sql.diag import caret_block
from flightsrv.sql.names import PublicNames


#: how DuckDB's error messages start ("Conversion Error: ...", "Out of Range Error: ...")
_DUCKDB_ERROR = re.compile(r"[A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)* Error: ")


def sql_error(e: Exception, sql: str, names: PublicNames | None = None) -> SqlError:
    """DuckDB's error ``e`` as the user's: its first line, with no internal relation name
    (``names``: the statement's; any left over is replaced anyway)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    err = SqlError.from_engine((names or PublicNames()).message(msg), statement=st._short(sql))
    err.engine_class = type(e).__name__
    block = _caret_for_user(str(e), sql)
    return err.with_detail("\n" + block) if block else err


_LINE_BLOCK = re.compile(r"\n\nLINE (\d+): (.*)\n( *)(\^+)$")


def _caret_for_user(message: str, sql: str) -> str | None:
    """DuckDB's ``LINE n:`` and carets for the text it ran (flightsrv's rewrite of ``sql``)
    moved onto the user's own text: the marked text, found once on the same line of
    ``sql`` (else once in all of it); None when it cannot be placed for sure or names an
    internal relation."""
    m = _LINE_BLOCK.search(message.rstrip())
    if m is None:
        return None
    line, rendered = int(m.group(1)), m.group(2)
    col = len(m.group(3)) - len(f"LINE {line}: ")
    marked = rendered[col:col + len(m.group(4))] if col >= 0 else ""
    if not marked.strip() or "..." in marked or RESERVED in marked:
        return None
    lines = sql.split("\n")
    candidates = []
    if 1 <= line <= len(lines) and lines[line - 1].count(marked) == 1:
        candidates = [(line, lines[line - 1].index(marked))]
    elif sql.count(marked) == 1:
        at = sql.index(marked)
        before = sql[:at].split("\n")
        candidates = [(len(before), len(before[-1]))]
    if not candidates:
        return None
    n, c = candidates[0]
    return caret_block(sql, n, c + 1, len(marked))




def guarded(reader: pa.RecordBatchReader, failures: list) -> pa.RecordBatchReader:
    """``reader``, recording any exception it raises into ``failures`` before DuckDB turns
    it into a generic error of its own."""

    def gen():
        try:
            yield from reader
        except BaseException as exc:
            failures.append(exc)
            raise

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def scan_failure(failures: list) -> BaseException | None:
    """The first flightsrv error a scan raised (it explains a DuckDB failure better)."""
    for exc in failures:
        if isinstance(exc, FlightsrvError):
            return exc
    return None


def stream_batches(inner: pa.RecordBatchReader, cur: duckdb.DuckDBPyConnection,
            sql: str, failures: list, natives: dict, cancel: Cancel | None = None,
            unhook=lambda: None, info: ExecInfo | None = None,
            names: PublicNames | None = None,
            release=lambda: None, finish=None) -> Iterator[pa.RecordBatch]:
    """Batches of ``inner``; keeps ``cur`` (and its registered scans) alive until done.
    ``finish(clean)`` instead of closing ``cur`` at the end: ``clean`` when the result was
    read to its end with no error and no cancellation (the cursor may then serve again)."""
    clean = False
    try:
        while True:
            if cancel is not None:
                cancel.check(statement=st._short(sql))
            try:
                batch = inner.read_next_batch()
            except StopIteration:
                clean = True
                return
            except (duckdb.Error, pa.ArrowException, OSError) as e:
                if cancel is not None:
                    cancel.check(statement=st._short(sql))
                cause = scan_failure(failures) or native_failure(e, natives)
                if cause is not None:
                    raise cause from None
                if isinstance(e, duckdb.Error) or _DUCKDB_ERROR.match(str(e)):
                    # DuckDB's own error (pyarrow hands one raised mid-stream over as an
                    # OSError): its message, without the wrapper's class name
                    raise sql_error(e, sql, names) from None
                raise
            if info is not None:
                info.rows += batch.num_rows
                info.bytes += batch.nbytes
            yield batch
    finally:
        unhook()
        # after unhook (under the token's lock): a cancel that came before it is seen
        # here, one after it no longer reaches this cursor's interrupt()
        clean = clean and (cancel is None or not cancel.cancelled)
        try:
            inner.close()
        except BaseException:
            clean = False
            raise
        finally:
            try:
                if finish is None:
                    cur.close()
                else:
                    finish(clean)
            finally:
                release()  # after the cursor: nothing of the statement runs any more


def coalesce(batches: Iterator[pa.RecordBatch], min_rows: int,
              max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Merge consecutive small batches until one holds ``min_rows`` rows or ``max_bytes``
    bytes; batches already that large pass through untouched (no copy)."""
    pending: list[pa.RecordBatch] = []
    rows = nbytes = 0
    for b in batches:
        if not pending and (b.num_rows >= min_rows or b.nbytes >= max_bytes):
            yield b
            continue
        if b.num_rows:
            pending.append(b)
            rows += b.num_rows
            nbytes += b.nbytes
        if rows >= min_rows or nbytes >= max_bytes:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, rows, nbytes = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


class RowCounter:
    def __init__(self) -> None:
        self.rows = 0

    def count(self, reader: pa.RecordBatchReader,
              schema: pa.Schema | None = None) -> Iterator[pa.RecordBatch]:
        for b in reader:
            self.rows += b.num_rows
            if schema is not None and b.schema != schema:
                b = pa.RecordBatch.from_arrays(b.columns, schema=schema)
            yield b


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every dictionary type (DuckDB exports ENUM columns as dictionaries)
    replaced by its value type, at any depth."""
    if pa.types.is_dictionary(t):
        return _plain_type(t.value_type)
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_plain_type(t.key_type)),
                       t.item_field.with_type(_plain_type(t.item_type)), t.keys_sorted)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_plain_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_plain_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_plain_type(t.value_type)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    return t


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    if pa.types.is_map(t):
        return _has_dictionary(t.key_type) or _has_dictionary(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_dictionary(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_dictionary(f.type) for f in t)
    return False


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """A result schema without dictionary types: a result streams as plain values, because
    clients read a dictionary-encoded column badly or not at all (pyarrow's and ADBC's Flight
    clients refuse the stream, the JDBC driver shows the indices). ``schema`` itself (the
    same object) when it has none: a caller asks ``is not``, since comparing two schemas
    costs more than the rest of a point query's streaming setup."""
    if not any(_has_dictionary(t) for t in schema.types):
        return schema
    return pa.schema([f.with_type(_plain_type(f.type)) for f in schema],
                     metadata=schema.metadata)


def decoded(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``batches`` cast to ``schema`` (:func:`plain_schema` of theirs): dictionaries decoded."""
    for b in batches:
        yield b.cast(schema)
