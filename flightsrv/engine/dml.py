"""DELETE, UPDATE and MERGE: DuckDB decides which rows change; flightsrv records it.

Every statement runs against pinned snapshots (the target and every table it reads, pinned
once at statement start). The target is exposed with two hidden columns, the row's data
file and physical position (:mod:`flightsrv.engine.relations`), which user SQL cannot name.

- **DELETE** ``FROM t [AS a] [USING ...] [WHERE ...]`` runs as
  ``SELECT [DISTINCT] a.file, a.position FROM <t> AS a [, ...] [WHERE ...]``, the user's own
  USING items and WHERE condition, cut from the statement text along DuckDB's tokens. The
  positions become deletion vectors (``delete_mode = 'dv'``) or a physical splice
  (``'splice'``): the matched rows leave the bytes, and with them every row already deleted
  in the row groups the splice re-encodes (``PURGE t`` erases the rest).
- **Deleted rows are never evaluated.** Every phase of every statement reads the target's
  live rows only (the same masked view a SELECT reads), in both delete modes; no error,
  count or history field can depend on the value of a row a deletion vector hides.
- **UPDATE** ``t [AS a] SET ... [FROM ...] [WHERE ...]`` and **MERGE** ``INTO t USING s ON
  ... WHEN ...`` run in two phases. Phase 1 selects the identity (file, position) of the
  *candidate* rows of the target (UPDATE: the rows the FROM/WHERE match; MERGE: the rows the
  ON condition matches, or every row when a ``WHEN NOT MATCHED BY SOURCE`` clause exists),
  reading only the target columns the statement names (all of them when it can read the
  whole row: ``*``, ``COLUMNS(...)``, the table used as a value); the candidates' whole
  rows are then read by position (:meth:`~flightsrv.table.scan.Snapshot.take`), or, for an
  UPDATE without FROM whose read by position would run in DuckDB, by the find itself, which
  then selects every column (one scan; ``ONE_PASS_UPDATE``). Phase 2 runs
  the user's statement itself, unchanged but for the relation names, against a plain DuckDB
  table holding exactly the candidates, in a second DuckDB database that can open no file at
  all; every other relation it reads is handed over as Arrow. So casts, NULL logic and the
  order of WHEN clauses are DuckDB's own. A target row that several source rows match is
  an error (the docs promise it; DuckDB 2.0.1 would silently apply one match): phase 1
  counts, in DuckDB's own join, the source rows of each candidate (UPDATE with FROM, MERGE
  with a WHEN MATCHED clause) and refuses more than one before anything runs. The commit
  deletes every candidate and adds the candidates' final contents (updated, or unchanged
  when no clause applied) plus the inserted rows, in one version; a MERGE that only
  inserted just appends.
- The part that decides which rows change (WHERE, USING, ON, FROM and the WHEN conditions)
  must be deterministic: volatile functions and samples are refused, naming the function.
- Conflicts (:mod:`flightsrv.table.delete_plan`): when the head disagrees with the pinned
  version about the rows the statement touched, the whole statement re-runs on a new
  snapshot; stale positions are never applied. Disjoint concurrent deletes merge.
- **Colliding statements take turns.** A statement's first run is optimistic. Once it must
  re-run, it waits for its table's gate in this engine (:class:`_Gates`) and runs again
  holding it, so statements of one server that keep changing the same rows (many clients
  incrementing one counter row) re-run one after another instead of against each other
  until ``MAX_RERUNS`` and failing. First runs never wait (statements that do not collide
  keep running side by side; making them queue behind the gate too held every DELETE of the
  soak benchmark behind hot-row re-runs, p99 12 s). The wait is cancellable and counts
  against the statement's deadline.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64
from sqlglot import exp

from flightsrv.engine import guard
from flightsrv.engine import text as tx
from flightsrv.engine.relations import (FILE_COLUMN, HIDDEN, POSITION_COLUMN,
                                        file_position_order)
from flightsrv.errors import CommitConflict, CorruptObject, SchemaMismatch, SqlError
from flightsrv.table.schema import write_defaults
from flightsrv.sql import binder
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st
from flightsrv.sql import types as sqltypes
from flightsrv.table.types import cast_table, fit_sql_rows
from flightsrv.sql.names import PublicNames
from flightsrv.sql.allowed_functions import VOLATILE_FUNCTIONS
from flightsrv.table.commit import BACKOFF_BASE_S, BACKOFF_MAX_S
from flightsrv.table.delete_plan import MAX_RERUNS, Rerun, commit_changes

TARGET_RELATION = "__fsrv_target"  # the target's relation in phase 1
MATCHES = "__fsrv_matches"  # phase 1's count of the rows joined to each candidate
CANDIDATES = "__fsrv_candidates"  # the candidates table of phase 2
#: UPDATE without FROM finds its candidates and reads their whole rows in one DuckDB scan
#: where the read by position would run in DuckDB anyway (False: find, then read by
#: position). UPDATE of 1% of 1M rows: find ~11 ms + read by position ~40 ms against one
#: scan ~40 ms; 10M rows: the statement 1.27x -> 1.05x DuckLake's (benchmarks/RESULTS.md,
#: fifteenth session)
ONE_PASS_UPDATE = True
_SQLGLOT_VOLATILE = {"rand": "random", "uuid": "uuid"}


@dataclass
class Cut:
    """The statement text, its tokens and the clauses found at depth 0."""

    text: str
    toks: list
    clauses: dict[str, tuple[int, int]]  # WORD -> (char start of the clause body, end)


def _cut(stmt: st.Statement, order: list[str], sql: str) -> Cut:
    """The statement's top-level clauses: for each word of ``order`` (the grammar's clause
    order), its first occurrence after the previous clause; later occurrences belong to a
    clause body (``JOIN ... USING (...)``, ``WHEN ...``)."""
    text = stmt.text
    end = len(text.rstrip().rstrip(";").rstrip())
    toks = tx.tokenize(text[:end])
    found = tx.clause_starts(toks, set(order))
    picked: list[tuple[str, int]] = []
    after = -1
    for word in order:
        hit = next((i for w, i in found if w == word and i > after), None)
        if hit is not None:
            picked.append((word, hit))
            after = hit
    clauses = {}
    for k, (word, i) in enumerate(picked):
        stop = toks[picked[k + 1][1]].start if k + 1 < len(picked) else end
        clauses[word] = (toks[i].end, stop)
    return Cut(text[:end], toks, clauses)


def _deterministic(nodes, sql: str) -> None:
    """Refuse volatile functions in the parts of a statement that decide which rows change
    (checked on the tree: the phase that re-evaluates them runs without the guard)."""
    for node in nodes:
        if node is None:
            continue
        sample = False  # one walk; a volatile function is reported before a sample
        for fn in node.walk():
            if isinstance(fn, exp.TableSample):
                sample = True
            if not isinstance(fn, exp.Func):
                continue
            name = binder.function_name(fn)
            name = _SQLGLOT_VOLATILE.get(name, name)
            if name in VOLATILE_FUNCTIONS:
                raise SqlError(f"function {name}() is volatile: its result cannot decide "
                               "which rows a statement changes", statement=st._short(sql),
                               function=name)
        if sample:
            raise SqlError("a sample cannot decide which rows a statement changes",
                           statement=st._short(sql))


#: the words of a MERGE's WHEN clauses outside their expressions (with an INSERT's column
#: list): anything else there is refused, so every other token is in a verified expression
_WHEN_WORDS = frozenset({"WHEN", "NOT", "MATCHED", "BY", "SOURCE", "TARGET", "THEN", "UPDATE",
                         "INSERT", "DELETE", "DO", "NOTHING", "NAME", "POSITION", "DEFAULT",
                         "VALUES", "*"})


def _when_expressions(cut: Cut, edits, sql: str) -> list[str]:
    """The expressions of a MERGE's WHEN clauses, as text DuckDB parses as a SELECT list:
    each ``AND`` condition, each ``SET`` list, each ``VALUES (...)`` row and each ``ERROR``
    message. Every other token of the clauses must be one of :data:`_WHEN_WORDS` or an
    ``INSERT`` column list, so nothing phase 2 runs escapes the guard."""
    span = cut.clauses.get("WHEN")
    if span is None:
        return []
    lo = next(i for i, t in enumerate(cut.toks) if t.start >= span[0])
    hi = next((i for i, t in enumerate(cut.toks) if t.start >= span[1]), len(cut.toks))
    marks = dict((i, w) for w, i in tx.clause_starts(
        cut.toks, {"WHEN", "AND", "SET", "VALUES", "ERROR", "THEN"}, lo, hi))
    out, i, columns = [], lo, False
    refuse = SqlError("cannot verify this MERGE's WHEN clauses", statement=st._short(sql))
    while i < hi:
        t = cut.toks[i]
        word = marks.get(i)
        if word in ("AND", "SET", "VALUES", "ERROR"):
            # the expression runs to the next clause word at depth 0 (THEN ends a condition,
            # WHEN the action)
            stop = next((j for j in sorted(marks) if j > i and marks[j] in
                         ("THEN", "WHEN")), hi)
            if word == "AND" and (stop == hi or marks[stop] != "THEN"):
                raise refuse
            end = cut.toks[stop].start if stop < hi else span[1]
            body = tx.render(cut.text, cut.toks, t.end, end, edits)
            if body:
                out.append(body)
            elif word != "VALUES":
                raise refuse
            i = stop
            continue
        if t.upper == "INSERT" and i + 1 < hi and cut.toks[i + 1].upper == "(":
            columns = True
        elif columns and t.upper == ")":
            columns = False
        elif not ((columns and (t.kind in ("identifier", "keyword")  # a name (value, user)
                                or t.upper in ("(", ",")))
                  or t.upper in _WHEN_WORDS):
            raise refuse
        i += 1
    return out


def _no_whole_target_rows(tree: exp.Expression, target: exp.Table, columns: list[str],
                          sql: str) -> None:
    """Refuse what would read the target's row as a whole: ``*``, ``COLUMNS(...)`` in the
    statement's own scope, ``a.*`` and the target's name as a value (``CAST(a AS VARCHAR)``,
    ``to_json(a)``). In DuckDB they stand for the table's columns; the relation flightsrv
    binds the target to also carries each row's file and position (the find's output), which
    they would expand to, so they would not mean what they mean in DuckDB (``WHERE
    COLUMNS(*) = 5`` would also compare the position). Stars of a subquery over its own FROM,
    ``count(*)`` and a MERGE's ``UPDATE SET *`` / ``INSERT *`` (the source's columns) stay."""
    alias = target.args.get("alias")
    names = {target.name.lower()} | ({alias.name.lower()} if alias is not None and alias.name
                                     else set())
    own = {c.lower() for c in columns}

    def refuse(node: exp.Expression, what: str) -> SqlError:
        return SqlError(f"{what} is not supported in DELETE/UPDATE/MERGE: name the target's "
                        "columns", statement=st._short(sql), table=target.name,
                        expression=node.sql(st.DIALECT)[:80])

    stack: list[tuple[exp.Expression, bool]] = [(tree, True)]
    while stack:
        node, top = stack.pop()
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star) and node.table.lower() in names:
                raise refuse(node, f"{node.table}.*")
            if not node.table and node.name.lower() in names and node.name.lower() not in own:
                raise refuse(node, "the target's row as a value")
            if node.name.lower() == "rowid" and "rowid" not in own and (
                    not node.table or node.table.lower() in names):
                # DuckDB's row id of a table; the target is no DuckDB table (a query
                # cannot name it either), so it would be a meaningless number here
                raise refuse(node, "rowid")
        elif top and isinstance(node, exp.Columns):
            raise refuse(node, "COLUMNS(...)")
        elif top and isinstance(node, exp.Star) and not isinstance(
                node.parent, (exp.Count, exp.Update, exp.Insert)):
            raise refuse(node, "*")
        for child in node.iter_expressions():
            # a subquery with a FROM of its own expands its own relations, not the target
            stack.append((child, top and not (isinstance(child, exp.Select)
                                              and child.args.get("from_") is not None)))


def _keeps_nanoseconds(rows, table: str, operation: str) -> None:
    """Refuse to rewrite rows whose ``duration[ns]`` value has a part below a microsecond:
    the rewrite goes through DuckDB, whose INTERVAL holds microseconds, so it would be lost
    (``rows``: the candidates read by position exactly)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for f, col in zip(rows.schema, rows.columns):
        if pa.types.is_duration(f.type) and f.type.unit == "ns" and len(col):
            ticks = pc.cast(col, pa.int64())
            whole = pc.multiply(pc.divide(ticks, 1000), 1000)  # integer division
            if pc.any(pc.not_equal(ticks, whole)).as_py():
                raise SchemaMismatch(
                    f"{operation.upper()} would rewrite a duration[ns] value below a "
                    "microsecond, which DuckDB's INTERVAL cannot hold (the rewrite would "
                    "lose it); nothing was changed", table=table, column=f.name)


def _split_whole(got, schema, names: list[str], table: str,
                 version: int) -> tuple[dict[str, np.ndarray], object]:
    """A one-pass find's result (the candidates' columns ``names``, then the hidden file
    ordinal and position) as the find's (file, position) arrays and the candidates' rows
    typed like the table, in file and position order as a read by position gives them."""
    import pyarrow as pa

    got, fi, fr = file_position_order(got, FILE_COLUMN, POSITION_COLUMN)
    if bool(np.any((np.diff(fi) == 0) & (np.diff(fr) == 0))):
        # a relation is a union of disjoint files: a row twice would be written twice
        raise CorruptObject("the target's relation gave one row twice",
                            table=table, version=version)
    rows = got.select(names)
    want = pa.schema([schema.field(c) for c in names])
    if rows.schema != want:
        rows = cast_table(rows, want)
    return {FILE_COLUMN: fi, POSITION_COLUMN: fr}, rows


def _positions(found: dict[str, np.ndarray], file_list) -> dict[str, BitMap64]:
    """Positions per data file path from a find's (file ordinal, position) columns."""
    files, pos = found[FILE_COLUMN], found[POSITION_COLUMN]
    if len(files) == 0:
        return {}
    files = files.astype(np.int64)
    pos = pos.astype(np.uint64)
    order = np.argsort(files, kind="stable")
    files, pos = files[order], pos[order]
    bounds = np.flatnonzero(np.diff(files)) + 1
    out: dict[str, BitMap64] = {}
    for chunk_f, chunk_p in zip(np.split(files, bounds), np.split(pos, bounds)):
        bm = BitMap64()
        bm.update(chunk_p)
        out[file_list[int(chunk_f[0])].path] = bm
    return out


class _Gate:
    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.Lock()


class _Gates:
    """One gate (a lock) per table name for the DML statements of one engine that collide.
    A gate lives only while a statement holds a reference to it (weak values), so the map
    holds at most one entry per table with a statement in flight."""

    POLL_S = 0.05  # how often a waiting statement looks at its cancellation

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def get(self, table: str) -> _Gate:
        with self._lock:
            gate = self._gates.get(table)
            if gate is None:
                gate = self._gates[table] = _Gate()
            return gate

    def enter(self, gate: _Gate, ctx, sql: str) -> None:
        """Wait for ``gate``; a cancelled statement (deadline, client) stops waiting."""
        while not gate.lock.acquire(timeout=self.POLL_S):
            ctx.check(sql)


class Dml:
    """The DML planner of one :class:`~flightsrv.engine.duck.DuckEngine`."""

    def __init__(self, engine):
        self.engine = engine
        self._gates = _Gates()

    # -- shared ------------------------------------------------------------------------------

    def _attempts(self, ctx, stmt, run):
        """``run()`` until it commits, re-running it (on a new snapshot) when a concurrent
        commit changed what it decided on. The first run is optimistic; a re-run waits for
        the table's gate and holds it, so this engine's re-running statements take turns.
        Between re-runs that still collide (with a first run, or another process's commit)
        a random wait that doubles each time, as the commit loop's."""
        last = None
        runtime = self.engine.warehouse.runtime
        gate, held = None, False
        try:
            for attempt in range(MAX_RERUNS):
                if attempt and not held:
                    gate = self._gates.get(stmt.table)
                    self._gates.enter(gate, ctx, stmt.sql)
                    held = True
                elif attempt:
                    delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** attempt))
                    runtime.clock.sleep(runtime.rng.uniform(0, delay))
                try:
                    return run()
                except Rerun as r:
                    last = r
        finally:
            if held:
                gate.lock.release()
        raise CommitConflict("statement re-ran too often: the rows it changes keep changing",
                             statement=st._short(stmt.sql), table=stmt.table,
                             attempts=MAX_RERUNS, reason=last.reason if last else None)

    def _plan(self, ctx, stmt, tree, target: exp.Table, pinner, sql: str):
        """(target snapshot, other scans, reference edits of the statement text)."""
        if tree is stmt.tree and not ctx.extra and stmt.binding is not None:
            bound = stmt.binding  # the same bind, done while parsing (no parameters bound)
        else:
            bound = binder.bind(tree, sql, skip=(target,), extra=frozenset(ctx.extra))
        if bound.functions:
            raise SqlError("metadata functions cannot be used in DELETE/UPDATE/MERGE",
                           statement=st._short(sql))
        if target.args.get("when") is not None:
            raise SqlError("the target of a DELETE/UPDATE/MERGE is always the latest version; "
                           "AT (...) is not allowed there", statement=st._short(sql))
        snap = pinner.pin(stmt.table)
        _no_whole_target_rows(tree, target, snap.schema.names, sql)
        refs = bound.tables
        snapshots = []
        for t in refs:
            version, as_of = sqlplan._time_travel(t, sql)
            snapshots.append(pinner.pin(t.name, version, as_of))
        columns = sqlplan._projections(tree, refs, [s.schema for s in snapshots])
        scans = [sqlplan.Scan(f"{sqlplan.RELATION_PREFIX}{i}", t.name, s, columns[i], ())
                 for i, (t, s) in enumerate(zip(refs, snapshots))]
        edits = sqlplan.reference_edits(stmt.text, refs, [s.relation for s in scans])
        ctx.names = PublicNames(  # what messages show for the relations
            [(TARGET_RELATION, sqlplan.shown_reference(target, None), sqlplan.aliased(target))]
            + [(s.relation, sqlplan.shown_reference(t, None), sqlplan.aliased(t))
               for s, t in zip(scans, refs)])
        if edits is None or not stmt.spliceable:
            raise SqlError("cannot plan this statement's table references (write plain or "
                           "main.-qualified table names, and t.col rather than main.t.col)",
                           statement=st._short(sql))
        return snap, scans, edits

    def _target_columns(self, tree, target, snap) -> list[str] | None:
        """The target columns a statement can read (every column whose name appears in it),
        at least one; None (all columns) when it can read the whole row: a ``*``, the
        table or alias used as a value, or ``COLUMNS(...)``."""
        whole = {target.name.lower(), self._alias(target).strip('"').lower()}
        names = set()  # every identifier's name, gathered in the same walk
        for node in tree.walk():
            if isinstance(node, exp.Identifier):
                names.add(node.name.lower())
            elif type(node) in st.KEYWORD_NAMES:
                # a bare current_user, localtime, ...: a call to sqlglot, a column of that
                # name to DuckDB when the table has one (read it; DuckDB decides)
                names.update(st.KEYWORD_NAMES[type(node)])
            elif isinstance(node, exp.Star):
                return None
            elif isinstance(node, exp.Column) and not node.table and \
                    node.name.lower() in whole:
                return None
            elif isinstance(node, exp.Func) and binder.function_name(node) in (
                    "columns", "row", "struct_pack", "pack", "to_json", "hash"):
                return None
        cols = [n for n in snap.schema.names if n.lower() in names]
        return cols or [snap.schema.names[0]]

    @staticmethod
    def _alias(target: exp.Table) -> str:
        alias = target.args.get("alias")
        if alias is not None and alias.name:
            return alias.this.sql(st.DIALECT) if isinstance(alias, exp.TableAlias) \
                else alias.sql(st.DIALECT)
        return target.this.sql(st.DIALECT)

    def _param_edits(self, cut: Cut, values) -> list:
        literals = [sqltypes.parameter_literal(v, i + 1) for i, v in enumerate(values)]
        return tx.parameter_edits(cut.toks, literals)

    def _slice(self, cut: Cut, word: str, edits) -> str | None:
        span = cut.clauses.get(word)
        if span is None:
            return None
        body = tx.render(cut.text, cut.toks, span[0], span[1], edits)
        if not body:
            raise SqlError(f"{word} needs a body")
        return body

    # -- DELETE ------------------------------------------------------------------------------

    def delete(self, ctx, stmt: st.Delete, tree, values, mode: str, *,
               splice_options: dict | None = None) -> int:
        sql = stmt.sql
        target = tree.this
        if tree.args.get("returning"):
            raise SqlError("DELETE ... RETURNING is not supported", statement=st._short(sql))
        _deterministic([tree.args.get("where"), *(tree.args.get("using") or [])], sql)
        table = self.engine._table(stmt.table)

        def run():
            pinner = self.engine._pinner()
            snap, scans, edits = self._plan(ctx, stmt, tree, target, pinner, sql)
            cut = _cut(stmt, ["USING", "WHERE", "RETURNING"], sql)
            edits = edits + self._param_edits(cut, values)
            items = self._slice(cut, "USING", edits)
            cond = self._slice(cut, "WHERE", edits)
            a = self._alias(target)
            find = (f"SELECT {'DISTINCT ' if items else ''}{a}.{FILE_COLUMN}, "
                    f"{a}.{POSITION_COLUMN} FROM {TARGET_RELATION} AS {a}"
                    + (f", {items}" if items else "") + (f" WHERE {cond}" if cond else ""))
            relations = [TARGET_RELATION] + [s.relation for s in scans] + list(ctx.extra)
            guard.verify(find, relations, sql=sql, columns=HIDDEN, deterministic=True)
            where = tree.args.get("where")
            prune = sqlplan.dml_prune_terms(where.this if where is not None else None, target,
                                            snap.schema, only_target=not items)
            target_scan = sqlplan.Scan(TARGET_RELATION, stmt.table, snap,
                                       self._target_columns(tree, target, snap), prune)
            # live rows only, in both modes: a row a deletion vector hides is never seen by
            # the user's condition (its value could otherwise decide an error or a count)
            with self.engine._statement_cursor(ctx, sql) as cur:
                file_list = self.engine._register(cur, ctx, target_scan, hidden=True)
                for scan in scans:
                    self.engine._register(cur, ctx, scan)
                found = self.engine._fetch(cur, ctx, find, sql, numpy=True)
            deletes = _positions(found, file_list)
            ctx.info.tables[stmt.table] = snap.version
            fp = self.engine._fingerprint(stmt, tree)
            if mode == "splice":
                return self._splice(table, snap, deletes, fp, splice_options or {})
            m, n = commit_changes(table, snap.manifest, deletes, operation="delete",
                                  summary=self.engine._summary(stmt, fp))
            if m is not None:
                ctx.info.commits.append((stmt.table, m.version))
            return n

        return self._attempts(ctx, stmt, run)

    def _splice(self, table, snap, deletes: dict[str, BitMap64], fp: str,
                options: dict) -> int:
        from flightsrv.table.erase import ErasedCount, StalePlan, splice_positions

        try:
            # strict: a row found live but deleted since (an UPDATE moving it) re-runs the
            # statement, as a deletion vector commit does (found in session 28: the DELETE
            # committed 0 rows and the row's updated copy stayed live)
            result = splice_positions(table, snap, deletes, fingerprint=fp,
                                      operation="splice_delete", strict=True, **options)
        except StalePlan as e:
            raise Rerun("a data file the statement changes was rewritten") from e
        return ErasedCount(result.rows_deleted, result)

    # -- UPDATE / MERGE ---------------------------------------------------------------------------

    def update(self, ctx, stmt, tree, values) -> int:
        sql = stmt.sql
        if tree.args.get("returning"):
            raise SqlError("UPDATE ... RETURNING is not supported", statement=st._short(sql))
        _deterministic([tree.args.get("where"), tree.args.get("from_")], sql)
        for eq in tree.expressions:
            col = eq.this if isinstance(eq, exp.EQ) else None
            if isinstance(col, exp.Column) and col.name.lower().startswith(binder.RESERVED):
                raise SqlError("reserved column name", statement=st._short(sql))

        def candidates(cut, edits, a, whole=()):
            items = self._slice(cut, "FROM", edits)
            cond = self._slice(cut, "WHERE", edits)
            # with FROM items, each target row's number of matches, as DuckDB joins them;
            # ``whole``: the find carries the candidates' whole rows too (one pass)
            find = ("SELECT " + "".join(f"{a}.{sqltypes.quote_ident(c)}, " for c in whole)
                    + f"{a}.{FILE_COLUMN}, {a}.{POSITION_COLUMN}"
                    + (f", count(*) AS {MATCHES}" if items else "")
                    + f" FROM {TARGET_RELATION} AS {a}"
                    + (f", {items}" if items else "") + (f" WHERE {cond}" if cond else "")
                    + (" GROUP BY ALL" if items else ""))
            # phase 2 adds the SET list: DuckDB parses it as a SELECT list (c = e, ...)
            return find, [f"SELECT {self._slice(cut, 'SET', edits)}"]

        return self._two_phase(ctx, stmt, tree, values, ["SET", "FROM", "WHERE", "RETURNING"],
                               candidates, "update", appends_conflict=False,
                               one_pass=tree.args.get("from_") is None)

    def merge(self, ctx, stmt, tree, values) -> int:
        sql = stmt.sql
        whens = tree.args.get("whens")
        clauses = whens.expressions if whens is not None else []
        if tree.args.get("returning"):
            raise SqlError("MERGE ... RETURNING is not supported", statement=st._short(sql))
        on_tree = tree.args.get("on")
        _deterministic([tree.args.get("using"), on_tree if isinstance(on_tree, exp.Expression)
                        else None] + [w.args.get("condition") for w in clauses], sql)
        by_source = any(w.args.get("source") for w in clauses)
        matched = any(w.args.get("matched") and not w.args.get("source") for w in clauses)
        inserts = any(isinstance(w.args.get("then"), exp.Insert) for w in clauses)
        #: ``USING src USING (k, ...)``: the source joins on equal named columns
        join_columns = [c.sql(st.DIALECT) for c in tree.args.get("using_cond") or ()]
        src = tree.args.get("using")
        src_name = src.alias_or_name if isinstance(src, exp.Expression) else ""

        def candidates(cut, edits, a):
            using = cut.clauses.get("USING")
            on = cut.clauses.get("ON")
            if using is not None and on is None and join_columns and src_name:
                inner = [i for i, t in enumerate(cut.toks) if using[0] <= t.start < using[1]]
                second = tx.clause_starts(cut.toks, {"USING"}, inner[0], inner[-1] + 1) \
                    if inner else []
                if second:  # the source ends where its join columns start
                    using = (using[0], cut.toks[second[0][1]].start)
                    on = ()
            if using is None or on is None:
                raise SqlError("MERGE needs USING ... ON ... (or USING ... USING (columns))",
                               statement=st._short(sql))
            inner = [t for t in cut.toks if using[0] <= t.start < using[1]]
            if any(w == "JOIN" for w, _ in tx.clause_starts(inner, {"JOIN"})):
                raise SqlError("a MERGE source with JOIN ... ON must be written as a "
                               "subquery: USING (SELECT ...) AS s", statement=st._short(sql))
            source = tx.render(cut.text, cut.toks, using[0], using[1], edits)
            if on:
                cond = tx.render(cut.text, cut.toks, on[0], on[1], edits)
            else:
                src_ref = sqltypes.quote_ident(src_name)
                cond = " AND ".join(f"{a}.{c} = {src_ref}.{c}" for c in join_columns)
            ident = f"{a}.{FILE_COLUMN}, {a}.{POSITION_COLUMN}"
            joined = f"FROM {TARGET_RELATION} AS {a} SEMI JOIN {source} ON {cond}"
            # phase 2 adds the source and ON (when every row is a candidate) and the WHEN
            # clauses' conditions and values: each is checked by the same guard
            checks = [f"SELECT {e} {joined}" for e in _when_expressions(cut, edits, sql)]
            if by_source:
                checks = [f"SELECT {ident} {joined}"] + checks
            if not matched:  # no WHEN MATCHED clause: how often a row matches is moot
                if by_source:
                    return f"SELECT {ident} FROM {TARGET_RELATION} AS {a}", checks
                return f"SELECT {ident} {joined}", checks
            # each candidate with the number of source rows DuckDB joins to it (a LEFT JOIN
            # gives an unmatched row one output row, so "more than one" means the same)
            join = "LEFT JOIN" if by_source else "JOIN"
            return (f"SELECT {ident}, count(*) AS {MATCHES} FROM {TARGET_RELATION} AS {a} "
                    f"{join} {source} ON {cond} GROUP BY ALL"), checks

        return self._two_phase(ctx, stmt, tree, values, ["USING", "ON", "WHEN"], candidates,
                               "merge", appends_conflict=inserts)

    def _two_phase(self, ctx, stmt, tree, values, words, candidates, operation: str, *,
                   appends_conflict: bool, one_pass: bool = False) -> int:
        """``one_pass``: the candidates are the target's rows a condition on the target alone
        matches (UPDATE without FROM), so when their whole rows would be read back through
        DuckDB anyway (:meth:`DuckEngine._take` with the mask extension, a local table), the
        find reads them itself: one scan of the files instead of a find over the columns
        the statement names and a second read of every column by position."""
        sql = stmt.sql
        target = tree.this
        table = self.engine._table(stmt.table)

        def run():
            pinner = self.engine._pinner()
            snap, scans, edits = self._plan(ctx, stmt, tree, target, pinner, sql)
            cut = _cut(stmt, words, sql)
            params = self._param_edits(cut, values)
            a = self._alias(target)
            whole = list(snap.schema.names) if one_pass and ONE_PASS_UPDATE \
                and self.engine.takes_in_duckdb(snap) else []
            find, checks = (candidates(cut, edits + params, a, whole) if whole
                            else candidates(cut, edits + params, a))
            relations = [TARGET_RELATION] + [s.relation for s in scans] + list(ctx.extra)
            guard.verify(find, relations, sql=sql, columns=HIDDEN + (MATCHES,),
                         deterministic=True)
            # the rest of what phase 2 runs: the same guard, the same function allow-list
            for check in checks:
                guard.verify(check, relations, sql=sql, columns=HIDDEN)
            where = tree.args.get("where") if operation == "update" else None
            prune = sqlplan.dml_prune_terms(
                where.this if where is not None else None, target, snap.schema,
                only_target=tree.args.get("from_") is None)
            target_scan = sqlplan.Scan(TARGET_RELATION, stmt.table, snap,
                                       None if whole else
                                       self._target_columns(tree, target, snap), prune)
            with self.engine._statement_cursor(ctx, sql) as cur:
                file_list = self.engine._register(cur, ctx, target_scan, hidden=True)
                others = {}
                for scan in scans:
                    # read each other relation once, as Arrow: both phases scan it, and an
                    # Arrow scan of a snapshot can be read only once
                    self.engine._register(cur, ctx, scan)
                    others[scan.relation] = self.engine._fetch(
                        cur, ctx, f"SELECT * FROM {scan.relation}", sql)
                    cur.execute(f"DROP VIEW {scan.relation}")
                    cur.register(scan.relation, others[scan.relation])
                if whole:
                    found, rows = _split_whole(self.engine._fetch(cur, ctx, find, sql),
                                               snap.schema, whole, stmt.table, snap.version)
                else:
                    found = self.engine._fetch(cur, ctx, find, sql, numpy=True)
            matches = found.get(MATCHES)
            if matches is not None and len(matches) and int(matches.max()) > 1:
                # DuckDB 2.0.1 would apply one of the matches, which one undefined; upstream
                # DuckDB raises for MERGE: flightsrv raises for both, changing nothing
                raise SqlError(f"a row of table {stmt.table} is matched more than once (by "
                               "several source rows); make each target row match at most "
                               "one",
                               statement=st._short(sql), table=stmt.table)
            ctx.info.tables[stmt.table] = snap.version
            # DuckDB found the candidates' identities over only the columns the statement
            # reads; their whole rows are read by position (by DuckDB with a mask keeping
            # only them when the mask extension is loaded, else the row groups holding one)
            deletes = _positions(found, file_list)
            if not whole:
                with self.engine._statement_cursor(ctx, sql) as cur:
                    rows = self.engine._take(
                        cur, ctx, snap, {path: np.asarray(bm.to_array(), dtype=np.int64)
                                         for path, bm in deletes.items()}, file_list, sql)
            _keeps_nanoseconds(rows, stmt.table, operation)
            target_edit = sqlplan.reference_edits(stmt.text, [target], [CANDIDATES])
            if target_edit is None:
                raise SqlError("cannot plan the statement's target", statement=st._short(sql))
            phase2 = tx.render(cut.text, cut.toks, 0, len(cut.text),
                               sorted(edits + params + target_edit))
            count, final, actions = self.engine._sandbox_run(
                ctx, phase2, rows, snap.schema, others, sql,
                returning=" RETURNING merge_action, *" if operation == "merge" else "",
                target=stmt.table, defaults=write_defaults(snap.manifest.schema, snap.schema))
            if count == 0:
                return 0
            if operation == "merge" and actions is not None and set(actions) <= {"INSERT"}:
                deletes, new_rows = {}, final
            else:
                new_rows = final
            written = []
            try:
                if new_rows.num_rows:
                    new_rows = fit_sql_rows(new_rows, snap.schema, table=stmt.table)
                    written, _, _ = table.write_files(new_rows, head=snap.manifest)
                m, _ = commit_changes(table, snap.manifest, deletes, written,
                                      operation=operation,
                                      summary=self.engine._summary(
                                          stmt, self.engine._fingerprint(stmt, tree)),
                                      appends_conflict=appends_conflict)
            except BaseException:
                for f in written:  # never committed: remove what was written
                    with contextlib.suppress(Exception):
                        table.store.delete(f.path)
                raise
            if m is not None:
                ctx.info.commits.append((stmt.table, m.version))
                if any(f.inline is not None for f in written):  # rows it inlined (§18)
                    table.maybe_flush(m)
            return count

        return self._attempts(ctx, stmt, run)


__all__ = ["Dml"]
