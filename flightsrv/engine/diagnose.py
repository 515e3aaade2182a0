"""DuckDB's own help for a statement that does not bind, against the user's own text.

flightsrv runs a rewritten text (each table reference becomes a registered relation,
:mod:`flightsrv.sql.plan`), so DuckDB's error for it names relations the user never wrote,
offers candidates from those relations (or none) and puts its caret under the rewritten
text. :func:`explain` asks DuckDB again, with the statement exactly as the user typed it,
in a scratch database that holds only a catalog:

- an empty table per table the statement references, with the columns (and DuckDB types)
  of the version it reads: DuckDB's "Candidate bindings", "Did you mean" and function
  candidates come from the same schema plain DuckDB would see;
- a table macro per flightsrv metadata function the statement calls, giving no row of the
  function's schema;
- for an unknown table, also an empty one-column table per name the caller may see
  (``names``: the tables the principal may list; at most :data:`MAX_NAMES`, the nearest by
  DuckDB's ``levenshtein`` when there are more), so "Did you mean" never names a table the
  principal cannot see.

The statement is bound, never run: it is wrapped as ``PREPARE`` (or ``EXPLAIN`` for what
cannot be prepared: CREATE TABLE AS, MERGE) on a line of its own, so DuckDB renders its
``LINE n:`` and caret under the user's own line (the line number is shifted back by one).
``AT (...)`` clauses (time travel, which the scratch catalog cannot do) are blanked to
spaces, keeping every offset, and shown again in the rendered line.

Hints come from names and schemas only: the scratch tables hold no row, so no hint can
depend on a row's value, deleted or not. The scratch database can open no file
(``enable_external_access=false``, no Python replacement scans, configuration locked), runs
one thread in a small memory limit, and at most :data:`CONCURRENT` run at once (an error
that finds them busy keeps its plain message). The caller accepts the answer only when it
is the same kind of error as the real one (:func:`accepts`); anything unexpected gives None.
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
#: scratch databases alive at once, server-wide
CONCURRENT = 2
#: statements longer than this get no second opinion
MAX_TEXT = 64 * 1024
_SLOTS = threading.BoundedSemaphore(CONCURRENT)

_PREFIX_PREPARE = "PREPARE fsrv_diagnosis AS\n"
_PREFIX_EXPLAIN = "EXPLAIN\n"
_LINE_BLOCK = re.compile(r"\n\nLINE (\d+): (.*)\n( *\^+)$")
#: ``AT (`` opening a time-travel clause (DuckDB's ``AT TIME ZONE`` has no parenthesis)
_AT = re.compile(r"\bAT\s*\(", re.I)


@dataclass(frozen=True)
class Help:
    """DuckDB's error for the user's text: its class (``BinderException``), first line
    (``Binder Error: ...``) and the lines after it (hints, then ``LINE n:`` and the caret
    under the user's line), as DuckDB prints them."""

    kind: str
    first: str
    detail: str


def explain(text: str, tables: Mapping[str, pa.Schema], names: Iterable[str] = (),
            missing: str | None = None,
            functions: Mapping[str, tuple[int, pa.Schema]] | None = None) -> Help | None:
    """DuckDB's error for ``text`` over a catalog of ``tables`` (name -> schema) and, when
    ``missing`` names a table that does not exist, the visible ``names``; ``functions``:
    flightsrv's metadata table functions the text calls (name -> (number of arguments,
    result schema)), each a table macro giving no row of that schema. None when DuckDB
    binds it, or when the scratch database cannot be made or is busy."""
    if len(text) > MAX_TEXT or not _SLOTS.acquire(blocking=False):
        return None
    try:
        con = _scratch()
        try:
            _catalog(con, tables, names, missing)
            _functions(con, functions or {})
            return _bind(con, text)
        finally:
            con.close()
    except (duckdb.Error, pa.ArrowException, ValueError, TypeError, RuntimeError):
        return None
    finally:
        _SLOTS.release()


def parse_error(text: str) -> Help | None:
    """DuckDB's parser error for ``text`` (message, caret under the user's text); None
    when DuckDB's parser reads it. Nothing is bound or run."""
    if len(text) > MAX_TEXT or not _SLOTS.acquire(blocking=False):
        return None
    try:
        con = _scratch()  # a connection of its own: the default one is no thread's
        try:
            con.extract_statements(text)  # parses only
        finally:
            con.close()
    except duckdb.ParserException as e:
        first, _, detail = str(e).partition("\n")
        return Help(type(e).__name__, first, detail)
    except duckdb.Error:
        return None
    finally:
        _SLOTS.release()
    return None


def suggestion(missing: str, names: Iterable[str]) -> str | None:
    """DuckDB's "Did you mean" line(s) for a table named ``missing`` among ``names`` (the
    tables the caller may see), for statements DuckDB has no grammar for (``DESCRIBE``,
    ``OPTIMIZE``, ``flightsrv_history('t')``); None when DuckDB suggests nothing."""
    found = explain(f"SELECT * FROM {_quote(missing)}", {}, names, missing=missing)
    if found is None or found.kind != "CatalogException":
        return None
    hint = found.detail.split("\n\nLINE ")[0].strip("\n")
    return hint or None


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


def _scratch() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:", config={"threads": "1", "memory_limit": "128MB"})
    try:
        # ``flightsrv.main.t`` as the server spells its catalog
        con.execute("ATTACH ':memory:' AS flightsrv")
        con.execute("USE flightsrv")
        for setting in ("enable_progress_bar=false", "python_enable_replacements=false",
                        "enable_external_access=false", "lock_configuration=true"):
            con.execute(f"SET {setting}")
    except BaseException:
        con.close()
        raise
    return con


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _catalog(con: duckdb.DuckDBPyConnection, tables: Mapping[str, pa.Schema],
             names: Iterable[str], missing: str | None) -> None:
    for name, schema in tables.items():
        con.register("fsrv_shape", schema.empty_table())
        try:
            con.execute(f"CREATE TABLE {_quote(name)} AS SELECT * FROM fsrv_shape")
        finally:
            con.unregister("fsrv_shape")
    if missing is None:
        return
    others = sorted({n for n in names if n not in tables})
    if len(others) > MAX_NAMES:
        con.register("fsrv_names", pa.table({"n": others}))
        try:
            others = [n for (n,) in con.execute(
                "SELECT n FROM fsrv_names ORDER BY levenshtein(lower(n), lower(?)), n "
                f"LIMIT {MAX_NAMES}", [missing]).fetchall()]
        finally:
            con.unregister("fsrv_names")
    for name in others:
        con.execute(f"CREATE TABLE {_quote(name)} (fsrv_unused INTEGER)")


def _functions(con: duckdb.DuckDBPyConnection,
               functions: Mapping[str, tuple[int, pa.Schema]]) -> None:
    """A table macro per function, giving no row of its schema (DuckDB's own types for
    it); no table is added, so no hint can name one."""
    for name, (arity, schema) in functions.items():
        con.register("fsrv_shape", schema.empty_table())
        try:
            columns = con.execute("DESCRIBE fsrv_shape").fetchall()
        finally:
            con.unregister("fsrv_shape")
        select = ", ".join(f"CAST(NULL AS {typ}) AS {_quote(col)}"
                           for col, typ, *_ in columns)
        params = ", ".join(f"fsrv_a{i}" for i in range(arity))
        con.execute(f"CREATE MACRO {_quote(name)}({params}) AS TABLE "
                    f"SELECT {select} LIMIT 0")


def _blank_time_travel(text: str) -> str:
    """``text`` with each ``AT ( ... )`` replaced by spaces (newlines kept)."""
    out = list(text)
    for m in _AT.finditer(text):
        depth, end = 0, None
        for i in range(m.end() - 1, len(text)):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        if end is None:
            continue
        for i in range(m.start(), end):
            if out[i] != "\n":
                out[i] = " "
    return "".join(out)


def _bind(con: duckdb.DuckDBPyConnection, text: str) -> Help | None:
    shown = _blank_time_travel(text)
    for prefix in (_PREFIX_PREPARE, _PREFIX_EXPLAIN):
        try:
            statements = con.extract_statements(prefix + shown)
            if len(statements) != 1:
                return None
            con.execute(statements[0])
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
        if shown != text:  # put the blanked AT clauses back into the rendered line
            blank_line, own_line = shown.split("\n")[line - 1], text.split("\n")[line - 1]
            core = rendered.removeprefix("...").removesuffix("...")
            at = blank_line.find(core) if core else -1
            if at >= 0:
                rendered = rendered.replace(core, own_line[at:at + len(core)], 1)
        message = (message[:block.start()] + f"\n\nLINE {line}: {rendered}\n" +
                   block.group(3))
    first, _, detail = message.partition("\n")
    return Help(type(e).__name__, first, detail)


__all__ = ["CONCURRENT", "Help", "MAX_NAMES", "accepts", "explain", "parse_error", "suggestion",
           "token_width"]
