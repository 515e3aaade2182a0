"""DuckDB's own help for a statement that does not bind, against the user's own text.

flightsrv runs a rewritten text (each table reference becomes a registered relation,
:mod:`flightsrv.sql.plan`), so DuckDB's error for it names relations the user never wrote,
offers candidates from those relations (or none) and puts its caret under the rewritten
text. :meth:`Scratch.explain` asks DuckDB again, with the statement exactly as the user
typed it, over a catalog of temporary objects of one cursor of a scratch database:

- an empty table per table the statement references, with the columns (and DuckDB types)
  of the version it reads: DuckDB's "Candidate bindings", "Did you mean" and function
  candidates come from the same schema plain DuckDB would see;
- a table macro per flightsrv metadata function the statement calls, giving no row of the
  function's schema;
- for an unknown table, also an empty one-column table per name the caller may see
  (``names``: the tables the principal may list; at most :data:`MAX_NAMES`, the nearest by
  DuckDB's ``levenshtein`` when there are more), so "Did you mean" never names a table the
  principal cannot see.

A cursor's temporary objects are its own and go with it, so diagnoses running at once never
see each other's catalog, and none costs a new database (about 30-200 ms each).

The statement is bound, never run: it is wrapped as ``PREPARE`` (or ``EXPLAIN`` for what
cannot be prepared: CREATE TABLE AS, MERGE) on a line of its own, so DuckDB renders its
``LINE n:`` and caret under the user's own line (the line number is shifted back by one).
``AT (...)`` clauses (time travel, which the scratch catalog cannot do) and the catalog
qualifier ``flightsrv.`` of ``flightsrv.main.t`` are blanked to spaces, keeping every
offset, and shown again in the rendered line.

Hints come from names and schemas only: the scratch tables hold no row, so no hint can
depend on a row's value, deleted or not. The scratch database can open no file
(``enable_external_access=false``, no Python replacement scans, configuration locked), runs
one thread in a small memory limit, and at most :data:`CONCURRENT` diagnoses run at once (an
error that finds them busy keeps its plain message). The caller accepts the answer only
when it is the same kind of error as the real one (:func:`accepts`); anything unexpected
gives None.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa

#: most table names put in the scratch catalog for a "Did you mean"
MAX_NAMES = 256
#: diagnoses running at once, per engine
CONCURRENT = 2
#: statements longer than this get no second opinion
MAX_TEXT = 64 * 1024
#: the scratch database's memory limit: it holds empty tables only
MEMORY_LIMIT = "128MB"

_LOCKDOWN = ("enable_progress_bar=false", "python_enable_replacements=false",
             "enable_external_access=false", "lock_configuration=true")
_PREFIX_PREPARE = "PREPARE fsrv_diagnosis AS\n"
_PREFIX_EXPLAIN = "EXPLAIN\n"
_LINE_BLOCK = re.compile(r"\n\nLINE (\d+): (.*)\n( *\^+)$")
#: ``AT (`` opening a time-travel clause (DuckDB's ``AT TIME ZONE`` has no parenthesis)
_AT = re.compile(r"\bAT\s*\(", re.I)
#: the catalog qualifier of ``flightsrv.main.t`` (the scratch tables are in ``temp.main``)
_CATALOG = re.compile(r'(?:\bflightsrv|"flightsrv")\s*\.\s*(?=(?:main|"main")\s*\.)', re.I)


@dataclass(frozen=True)
class Help:
    """DuckDB's error for the user's text: its class (``BinderException``), first line
    (``Binder Error: ...``) and the lines after it (hints, then ``LINE n:`` and the caret
    under the user's line), as DuckDB prints them."""

    kind: str
    first: str
    detail: str


class Scratch:
    """The scratch database of one engine, made on first use; each diagnosis takes a
    cursor of its own (its temporary tables and macros are the catalog it binds against).
    Safe to call from many threads."""

    def __init__(self, concurrent: int = CONCURRENT):
        self._con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrent)
        self._closed = False

    def close(self) -> None:
        with self._lock:
            con, self._con, self._closed = self._con, None, True
        if con is not None:
            con.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if self._con is None:
                con = duckdb.connect(":memory:", config={"threads": "1",
                                                         "memory_limit": MEMORY_LIMIT})
                try:
                    for setting in _LOCKDOWN:
                        con.execute(f"SET {setting}")
                except BaseException:
                    con.close()
                    raise
                self._con = con
            return self._con.cursor()

    def _run(self, fn, *args):
        """``fn(cursor, *args)`` on a fresh cursor, in one of the slots; None when the
        slots are busy or anything fails."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            cur = self._cursor()
            try:
                return fn(cur, *args)
            finally:
                cur.close()
        except (duckdb.Error, pa.ArrowException, ValueError, TypeError, RuntimeError):
            return None
        finally:
            self._slots.release()

    def explain(self, text: str, tables: Mapping[str, pa.Schema], names: Iterable[str] = (),
                missing: str | None = None,
                functions: Mapping[str, tuple[int, pa.Schema]] | None = None
                ) -> Help | None:
        """DuckDB's error for ``text`` over a catalog of ``tables`` (name -> schema) and,
        when ``missing`` names a table that does not exist, the visible ``names``;
        ``functions``: flightsrv's metadata table functions the text calls (name ->
        (number of arguments, result schema)), each a table macro giving no row of that
        schema. None when DuckDB binds it, or when no scratch cursor can be had."""
        if len(text) > MAX_TEXT:
            return None

        names = list(names)

        def run(cur):
            _catalog(cur, tables, names, missing)
            _functions(cur, functions or {})
            return _bind(cur, text)

        found = self._run(run)
        if found is not None and missing is not None:
            found = Help(found.kind, found.first, visible_suggestions(found.detail, names))
        return found

    def parameter_types(self, text: str, tables: Mapping[str, pa.Schema],
                        count: int) -> list | None:
        """DuckDB's types of the parameters ``$1..$count`` of the user's statement ``text``
        (a DELETE, UPDATE, MERGE or INSERT) planned over empty tables with the columns of
        ``tables`` (name -> schema): None for a parameter DuckDB leaves untyped, and None
        altogether when no scratch cursor can be had. Nothing is run."""
        from flightsrv.engine.params import parameter_types_on

        if len(text) > MAX_TEXT:
            return None

        def run(cur):
            _catalog(cur, tables, (), None)
            return parameter_types_on(cur, _blank(text), count)

        return self._run(run)

    def parse_error(self, text: str) -> Help | None:
        """DuckDB's parser error for ``text`` (message, caret under the user's text); None
        when DuckDB's parser reads it. Nothing is bound or run."""
        if len(text) > MAX_TEXT:
            return None

        def run(cur):
            try:
                cur.extract_statements(text)  # parses only
            except duckdb.ParserException as e:
                first, _, detail = str(e).partition("\n")
                return Help(type(e).__name__, first, detail)
            return None

        return self._run(run)

    def suggestion(self, missing: str, names: Iterable[str]) -> str | None:
        """DuckDB's "Did you mean" line(s) for a table named ``missing`` among ``names`` (the
        tables the caller may see), for statements DuckDB has no grammar for (``DESCRIBE``,
        ``OPTIMIZE``, ``flightsrv_history('t')``); None when DuckDB suggests nothing."""
        found = self.explain(f"SELECT * FROM {_quote(missing)}", {}, names, missing=missing)
        if found is None or found.kind != "CatalogException":
            return None
        # only the hint: the caret would point into the stand-in statement, not the user's
        # (a detail with no "Did you mean" begins with it)
        hint = _LINE.split(found.detail, maxsplit=1)[0].strip("\n")
        return hint or None


_LINE = re.compile(r"(?:^|\n)\s*LINE \d+:")
_SUGGESTION = re.compile(r'Did you mean "((?:[^"]|"")*)"\?\n?')


def visible_suggestions(detail: str, names: Iterable[str]) -> str:
    """``detail`` without a "Did you mean" that names something the caller cannot query:
    DuckDB also offers the names of its own catalogs (``pg_sequences``, ``pg_am``), which
    the server refuses. Kept: a visible table (``names``) or an information_schema view the
    server serves."""
    from flightsrv.sql.validate import INFORMATION_SCHEMA, INFORMATION_SCHEMA_VIEWS

    allowed = {n.lower() for n in names} | {f"{INFORMATION_SCHEMA}.{v}"
                                            for v in INFORMATION_SCHEMA_VIEWS}

    def keep(m: re.Match) -> str:
        name = m.group(1).replace('""', '"').lower()
        return m.group(0) if name in allowed else ""

    return _SUGGESTION.sub(keep, detail)


def token_width(text: str, offset: int) -> int:
    """The length of the token of ``text`` (DuckDB's tokenizer) that starts at character
    ``offset``; 1 when none does."""
    try:
        tokens = duckdb.tokenize(text)  # byte offsets
    except duckdb.Error:
        return 1
    raw = text.encode()
    at = len(text[:offset].encode())
    starts = [pos for pos, _ in tokens] + [len(raw)]
    for i, pos in enumerate(starts[:-1]):
        if pos == at:
            token = raw[pos:starts[i + 1]].decode(errors="replace").rstrip()
            return max(1, len(token))
    return 1


def accepts(real_kind: str, real_first: str, got: Help) -> bool:
    """Whether ``got`` explains the same error as DuckDB's ``real_kind`` / ``real_first``
    for the rewritten text: the same class, and the same first line or the same quoted
    names in it (the rewritten text's relation is a "Values list" where the user's table
    is a "Table")."""
    if got.kind != real_kind:
        return False
    if got.first == real_first:
        return True
    quoted = set(re.findall(r'"((?:[^"]|"")*)"', real_first))
    return bool(quoted) and quoted == set(re.findall(r'"((?:[^"]|"")*)"', got.first))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _catalog(cur: duckdb.DuckDBPyConnection, tables: Mapping[str, pa.Schema],
             names: Iterable[str], missing: str | None) -> None:
    for name, schema in tables.items():
        cur.register("fsrv_shape", schema.empty_table())
        try:
            cur.execute(f"CREATE TEMP TABLE {_quote(name)} AS SELECT * FROM fsrv_shape")
        finally:
            cur.unregister("fsrv_shape")
    if missing is None:
        return
    others = sorted({n for n in names if n not in tables})
    if len(others) > MAX_NAMES:
        cur.register("fsrv_names", pa.table({"n": others}))
        try:
            others = [n for (n,) in cur.execute(
                "SELECT n FROM fsrv_names ORDER BY levenshtein(lower(n), lower(?)), n "
                f"LIMIT {MAX_NAMES}", [missing]).fetchall()]
        finally:
            cur.unregister("fsrv_names")
    for name in others:
        cur.execute(f"CREATE TEMP TABLE {_quote(name)} (fsrv_unused INTEGER)")


def _functions(cur: duckdb.DuckDBPyConnection,
               functions: Mapping[str, tuple[int, pa.Schema]]) -> None:
    """A table macro per function, giving no row of its schema (DuckDB's own types for
    it); no table is added, so no hint can name one."""
    for name, (arity, schema) in functions.items():
        cur.register("fsrv_shape", schema.empty_table())
        try:
            columns = cur.execute("DESCRIBE fsrv_shape").fetchall()
        finally:
            cur.unregister("fsrv_shape")
        select = ", ".join(f"CAST(NULL AS {typ}) AS {_quote(col)}"
                           for col, typ, *_ in columns)
        params = ", ".join(f"fsrv_a{i}" for i in range(arity))
        cur.execute(f"CREATE TEMP MACRO {_quote(name)}({params}) AS TABLE "
                    f"SELECT {select} LIMIT 0")


def _blank(text: str) -> str:
    """``text`` with each ``AT ( ... )`` and each ``flightsrv.`` catalog qualifier replaced
    by spaces (newlines kept), so every other character keeps its offset."""
    out = list(text)

    def blank(start: int, end: int) -> None:
        for i in range(start, end):
            if out[i] != "\n":
                out[i] = " "

    for m in _AT.finditer(text):
        depth = 0
        for i in range(m.end() - 1, len(text)):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    blank(m.start(), i + 1)
                    break
    for m in _CATALOG.finditer(text):
        blank(m.start(), m.end())
    return "".join(out)


def _bind(cur: duckdb.DuckDBPyConnection, text: str) -> Help | None:
    shown = _blank(text)
    for prefix in (_PREFIX_PREPARE, _PREFIX_EXPLAIN):
        try:
            statements = cur.extract_statements(prefix + shown)
            if len(statements) != 1:
                return None
            cur.execute(statements[0])
        except duckdb.ParserException as e:
            if prefix == _PREFIX_PREPARE and "is not a preparable statement" in str(e):
                continue  # CREATE TABLE AS, MERGE: EXPLAIN binds them without running
            return _help(e, text, shown)
        except duckdb.Error as e:
            return _help(e, text, shown)
        return None
    return None


def _help(e: duckdb.Error, text: str, shown: str) -> Help | None:
    message = str(e)
    block = _LINE_BLOCK.search(message)
    if block is not None:
        line = int(block.group(1)) - 1  # the prefix took line 1
        if line < 1:
            return None
        rendered = block.group(2)
        if shown != text:  # put the blanked characters back into the rendered line
            blank_line, own_line = shown.split("\n")[line - 1], text.split("\n")[line - 1]
            core = rendered.removeprefix("...").removesuffix("...")
            at = blank_line.find(core) if core else -1
            if at >= 0:
                rendered = rendered.replace(core, own_line[at:at + len(core)], 1)
        message = (message[:block.start()] + f"\n\nLINE {line}: {rendered}\n" +
                   block.group(3))
    first, _, detail = message.partition("\n")
    return Help(type(e).__name__, first, detail)


__all__ = ["CONCURRENT", "Help", "MAX_NAMES", "Scratch", "accepts", "token_width"]
