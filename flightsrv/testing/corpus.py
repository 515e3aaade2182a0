"""The ``sql/`` corpus: a sqllogictest-like file format and a runner that compares a system
under test (flightsrv, in process or through a Flight SQL client) with plain DuckDB.

The format is documented in ``sql/README.md``. In short, records are separated by blank
lines; ``#`` starts a comment line::

    statement ok [noref]
    CREATE TABLE t (id BIGINT, s VARCHAR)

    statement count 2 [noref]
    INSERT INTO t VALUES (1, 'a'), (2, 'b')

    statement error [substring]
    COPY t TO '/tmp/x.csv'

    query IT [nosort|rowsort] [noref]
    SELECT id, s FROM t
    ----
    1	a
    2	b

A ``query`` without a ``----`` block is compared with the reference; with one, both the
system under test and (unless ``noref``) the reference must produce exactly those rows.
``statement error`` records never run on the reference (DuckDB would happily COPY).

Runner API:

- :func:`parse_file` / :func:`parse_text` -> list of :class:`Record`
- :func:`run` (records, sut, reference) -> :class:`Report` (``.failures``, ``.ok``)
- executors: :class:`EngineExecutor` (a ``DuckEngine`` + ``Session``),
  :class:`DbapiExecutor` (any DB-API 2 connection, e.g. ``adbc_driver_flightsql.dbapi``),
  :class:`DuckReference` (a fresh plain DuckDB connection).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import decimal
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SEPARATOR = "----"
TYPE_LETTERS = frozenset("ITRB?")


# -- records -------------------------------------------------------------------------


@dataclass
class Record:
    kind: str  # "statement" | "query"
    sql: str
    line: int  # 1-based line of the header in the file
    source: str = "?"
    expect: str = "ok"  # statement: "ok" | "error" | "count"
    error: str = ""  # expected error substring (statement error)
    count: int | None = None  # statement count N
    types: str = ""  # query column letters
    sort: str = "nosort"
    reference: bool = True
    expected: list[list[str]] | None = None  # query rows, rendered

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


class CorpusFormatError(ValueError):
    pass


def parse_file(path: str | pathlib.Path) -> list[Record]:
    p = pathlib.Path(path)
    return parse_text(p.read_text(), source=p.name)


def parse_text(text: str, source: str = "?") -> list[Record]:
    records: list[Record] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        header, start = line.split(), i + 1
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() and lines[i].strip() != SEPARATOR:
            if not lines[i].lstrip().startswith("#"):
                body.append(lines[i])
            i += 1
        expected = None
        if i < len(lines) and lines[i].strip() == SEPARATOR:
            i += 1
            expected = []
            while i < len(lines) and lines[i].strip():
                expected.append(lines[i].split("\t"))
                i += 1
        if not body:
            raise CorpusFormatError(f"{source}:{start}: record without SQL")
        records.append(_record(header, "\n".join(body), expected, start, source))
    return records


def _record(header: list[str], sql: str, expected, line: int, source: str) -> Record:
    kind, args = header[0], header[1:]
    noref = "noref" in args
    args = [a for a in args if a != "noref"]
    if kind == "statement":
        if expected is not None:
            raise CorpusFormatError(f"{source}:{line}: statement with a result block")
        if not args or args[0] == "ok":
            return Record("statement", sql, line, source, reference=not noref)
        if args[0] == "error":
            return Record("statement", sql, line, source, expect="error",
                          error=" ".join(args[1:]), reference=False)
        if args[0] == "count" and len(args) == 2 and args[1].isdigit():
            return Record("statement", sql, line, source, expect="count", count=int(args[1]),
                          reference=not noref)
        raise CorpusFormatError(f"{source}:{line}: bad statement header {' '.join(header)!r}")
    if kind == "query":
        if not args or not set(args[0]) <= TYPE_LETTERS:
            raise CorpusFormatError(f"{source}:{line}: query needs column types (I T R B ?)")
        sort = args[1] if len(args) > 1 else "nosort"
        if sort not in ("nosort", "rowsort"):
            raise CorpusFormatError(f"{source}:{line}: unknown sort mode {sort!r}")
        if noref and expected is None:
            raise CorpusFormatError(f"{source}:{line}: noref query needs expected rows")
        return Record("query", sql, line, source, types=args[0], sort=sort,
                      reference=not noref, expected=expected)
    raise CorpusFormatError(f"{source}:{line}: unknown record {kind!r}")


# -- rendering -----------------------------------------------------------------------------


def render(value: Any, letter: str) -> str:
    """One value as the corpus writes it: NULL, integers, R with 3 decimals, true/false."""
    if value is None:
        return "NULL"
    if letter == "I":
        if isinstance(value, bool):
            return str(int(value))
        if isinstance(value, (float, decimal.Decimal)):
            return str(int(value))
        return str(value)
    if letter == "R":
        return f"{float(value):.3f}"
    if letter == "B":
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else "(empty)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, _dt.datetime) else value.isoformat()
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_rows(rows: Sequence[Sequence[Any]], types: str, sort: str) -> list[list[str]]:
    out = []
    for r in rows:
        if len(r) != len(types):
            raise AssertionError(f"expected {len(types)} columns, got {len(r)}: {r!r}")
        out.append([render(v, t) for v, t in zip(r, types)])
    return sorted(out) if sort == "rowsort" else out


# -- executors --------------------------------------------------------------------------------


class Executor(Protocol):
    def query(self, sql: str) -> list[tuple]: ...

    def update(self, sql: str) -> int: ...


class EngineExecutor:
    """Run through an Engine in process (no Flight)."""

    def __init__(self, engine, session=None):
        from flightsrv.engine.api import Session

        self.engine, self.session = engine, session or Session("corpus")

    def query(self, sql: str) -> list[tuple]:
        t = self.engine.execute_query(sql, self.session).reader.read_all()
        return [tuple(r.values()) for r in t.to_pylist()]

    def update(self, sql: str) -> int:
        from flightsrv.engine.api import StatementKind

        if self.engine.prepare(sql, self.session).kind == StatementKind.QUERY:
            self.engine.execute_query(sql, self.session).reader.read_all()
            return -1
        return self.engine.execute_update(sql, self.session)


class DbapiExecutor:
    """Run through a DB-API 2 connection (ADBC Flight SQL, flightsql-dbapi, ...)."""

    def __init__(self, conn):
        self.conn = conn

    def query(self, sql: str) -> list[tuple]:
        cur = self.conn.cursor()
        try:
            cur.execute(sql)
            return [tuple(r) for r in cur.fetchall()]
        finally:
            cur.close()

    def update(self, sql: str) -> int:
        cur = self.conn.cursor()
        try:
            cur.execute(sql)
            if cur.description is not None:  # ADBC runs DML as a prepared query
                with contextlib.suppress(Exception):
                    cur.fetchall()
            return cur.rowcount
        finally:
            cur.close()


class DuckReference:
    """Plain DuckDB, in memory, as the reference implementation."""

    def __init__(self):
        import duckdb

        self.con = duckdb.connect()

    def query(self, sql: str) -> list[tuple]:
        return [tuple(r) for r in self.con.sql(sql).fetchall()]

    def update(self, sql: str) -> int:
        rel = self.con.execute(sql)
        try:
            row = rel.fetchone()
        except Exception:  # noqa: BLE001 - statements without a result
            return -1
        return int(row[0]) if row and isinstance(row[0], int) else -1


# -- running -----------------------------------------------------------------------------------


@dataclass
class Failure:
    record: Record
    message: str

    def __str__(self) -> str:
        return f"{self.record.where}: {self.message}\n    {self.record.sql.strip()}"


@dataclass
class Report:
    ran: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        head = f"{self.ran} records, {len(self.failures)} failed"
        return "\n".join([head] + [str(f) for f in self.failures])


def run(records: Sequence[Record], sut: Executor, reference: Executor | None = None,
        *, stop_on_failure: bool = False) -> Report:
    """Run ``records`` in order against ``sut`` (and ``reference`` where the record allows)."""
    report = Report()
    for rec in records:
        report.ran += 1
        msg = _run_one(rec, sut, reference if rec.reference else None)
        if msg is not None:
            report.failures.append(Failure(rec, msg))
            if stop_on_failure:
                break
    return report


def _run_one(rec: Record, sut: Executor, ref: Executor | None) -> str | None:
    if rec.kind == "statement":
        if rec.expect == "error":
            try:
                sut.update(rec.sql)
            except Exception as e:  # noqa: BLE001 - any error is the expected outcome
                if rec.error and rec.error.lower() not in str(e).lower():
                    return f"error does not mention {rec.error!r}: {e}"
                return None
            return "statement succeeded but an error was expected"
        try:
            n = sut.update(rec.sql)
        except Exception as e:  # noqa: BLE001
            return f"statement failed: {type(e).__name__}: {e}"
        if rec.expect == "count" and n != rec.count:
            return f"row count {n}, expected {rec.count}"
        if ref is not None:
            try:
                rn = ref.update(rec.sql)
            except Exception as e:  # noqa: BLE001
                return f"reference failed: {type(e).__name__}: {e}"
            if rec.expect == "count" and rn not in (rec.count, -1):
                return f"reference row count {rn}, expected {rec.count}"
        return None
    try:
        got = render_rows(sut.query(rec.sql), rec.types, rec.sort)
    except Exception as e:  # noqa: BLE001
        return f"query failed: {type(e).__name__}: {e}"
    if rec.expected is not None:
        want = sorted(rec.expected) if rec.sort == "rowsort" else rec.expected
        if got != want:
            return _diff("expected", want, got)
    if ref is not None:
        try:
            ref_rows = render_rows(ref.query(rec.sql), rec.types, rec.sort)
        except Exception as e:  # noqa: BLE001
            return f"reference failed: {type(e).__name__}: {e}"
        if got != ref_rows:
            return _diff("reference", ref_rows, got)
    return None


def _diff(what: str, want: list[list[str]], got: list[list[str]], limit: int = 10) -> str:
    lines = [f"result differs from {what} ({len(want)} vs {len(got)} rows)"]
    for i in range(min(max(len(want), len(got)), limit)):
        w = "\t".join(want[i]) if i < len(want) else "<none>"
        g = "\t".join(got[i]) if i < len(got) else "<none>"
        mark = " " if w == g else "!"
        lines.append(f"  {mark} want {w!r:40} got {g!r}")
    return "\n".join(lines)


def corpus_files(directory: str | pathlib.Path | None = None) -> list[pathlib.Path]:
    """The ``*.test`` files of the corpus directory (default: the repo's top-level ``sql/``)."""
    d = pathlib.Path(directory) if directory else pathlib.Path(__file__).resolve().parents[2] / "sql"
    return sorted(d.glob("*.test"))
