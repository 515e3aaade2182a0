"""Plan a query over pinned table snapshots: bind parameters, resolve and pin table
references, rewrite them to registered relation names, and extract per-reference scan
hints (projection and pushable filters).

Contract:

- :func:`bind_params` replaces ``$n`` placeholders by typed literals (a copy of the tree).
- :func:`plan_query` finds every warehouse table reference in a query tree (anything in
  FROM/JOIN that is not a CTE or an allowed table function), resolves each to a snapshot
  through a :class:`Pinner`, and rewrites it to ``<relation> AS <alias>`` where the
  relation is unique per reference. ``t AT (VERSION => n)`` / ``t AT (TIMESTAMP => '...')``
  pin that version; every reference to the same table without ``AT`` gets the *same*
  snapshot (pinned once per statement).
- Scan hints are an optimisation only: DuckDB still evaluates the full query, so a hint may
  read more than needed but never less. ``columns`` is a superset of the columns the
  statement can touch (``None`` = all); ``filter`` is an AND of ``column op literal``
  conjuncts from the WHERE of the SELECT that reads the reference directly, and only when
  that SELECT has no outer joins (a filter below an outer join changes results).

Resolution goes through a callable so this module needs no table code:
``resolve(name, version, as_of) -> snapshot`` with ``.schema`` (pa.Schema) and ``.version``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from flightsrv.errors import SqlError
from flightsrv.sql import binder
from flightsrv.sql.names import printed
from flightsrv.sql import types as sqltypes
from flightsrv.sql import validate
from flightsrv.sql.statements import DIALECT, KEYWORD_NAMES, _tokenize, error
from flightsrv.runtime import text_cache

Resolver = Callable[[str, "int | None", "str | None"], Any]

RELATION_PREFIX = "__fsrv_r"  # reserved prefix (flightsrv.sql.binder.RESERVED)
#: the ``meta`` key :func:`bind_params` marks each bound value's literal with (its
#: parameter's index), so a plan knows which pruning constants came from parameters
PARAM_META = "fsrv_param"


# -- parameters ----------------------------------------------------------------------


#: how many parameters :func:`bind_params` binds between two calls of its ``check``
_CHECK_EVERY = 256


def bind_params(tree: exp.Expression, values: Sequence[pa.Scalar], sql: str,
                expected: int, check: Callable[[], None] | None = None) -> exp.Expression:
    """A copy of ``tree`` with ``$n`` replaced by the typed literal of ``values[n-1]``.
    Linear in the number of parameters (sqlglot's ``transform`` took quadratic time: 8,000
    took 20 s); ``check`` (a deadline or cancel) is called every 256 parameters."""
    if len(values) < expected:
        raise SqlError("too few parameters", statement=sql, expected=expected, got=len(values))
    if expected == 0:
        return tree
    literals = []
    for i, v in enumerate(values):
        if check is not None and i % _CHECK_EVERY == 0:
            check()
        literals.append(_literal(sqltypes.parameter_literal(v, i + 1)))
    out = tree.copy()
    # a list argument (an IN list's values) is set once with all its replacements: sqlglot's
    # replace and set walk the whole list for each (an IN list of n parameters took n^2)
    lists: dict[tuple[int, str], tuple[exp.Expression, str, dict[int, exp.Expression]]] = {}
    used: set[int] = set()
    for k, node in enumerate(list(out.find_all(exp.Placeholder))):
        if node.this is None:
            continue
        if check is not None and k % _CHECK_EVERY == 0:
            check()
        i = int(str(node.this)) - 1
        if not 0 <= i < len(literals):
            raise error(f"parameter ${i + 1} has no value", sql, node)
        # each literal is a tree of its own (built or copied by ``_literal``): used as is
        # once, copied for a parameter's further occurrences
        lit = literals[i].copy() if i in used else literals[i]
        used.add(i)
        lit.meta[PARAM_META] = i
        if node is out:
            return lit
        parent, key = node.parent, node.arg_key
        if node.index is None:
            parent.set(key, lit)
        else:
            lists.setdefault((id(parent), key), (parent, key, {}))[2][node.index] = lit
    for parent, key, swaps in lists.values():
        items = list(parent.args[key])
        for idx, lit in swaps.items():
            items[idx] = lit
        parent.set(key, items)
    return out


_NUMBER_CAST = re.compile(r"CAST\((-?)([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?) AS ([A-Z0-9_]+)\)")


def _literal(text: str) -> exp.Expression:
    """:func:`_parse_literal` of a parameter's literal, a tree of its own (the cached parse
    copied), built
    without the parser for the commonest shapes, a plain string (``'it''s'``) and a number
    cast to a type (``CAST(-5 AS BIGINT)``), as the parser builds them: each distinct value
    parsed cost ~0.3 ms, and a statement may bind thousands."""
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'" and \
            "'" not in text[1:-1].replace("''", ""):
        return exp.Literal.string(text[1:-1].replace("''", "'"))
    m = _NUMBER_CAST.fullmatch(text)
    if m is not None:
        cast = _parse_literal(f"CAST(0 AS {m.group(3)})").copy()
        number: exp.Expression = exp.Literal.number(m.group(2))
        if m.group(1):
            number = exp.Neg(this=number)
        cast.set("this", number)
        return cast
    return _parse_literal(text).copy()


@text_cache(maxsize=4096)
def _parse_literal(text: str) -> exp.Expression:
    """A literal's parsed tree, cached by its text (callers copy before use)."""
    return sqlglot.parse_one(text, read=DIALECT)


def _tokens(text: str) -> tuple:
    """DuckDB-dialect tokens of ``text``, cached (a point query's text repeats; tokens are
    only read): the front end's own cache, which already holds the tokens of every
    statement it parsed (``text`` is a statement's numbered text)."""
    return _tokenize(text)


def params_from_batch(batch: pa.RecordBatch | None, row: int = 0) -> list[pa.Scalar]:
    """Parameter values of one row of an ADBC/Flight SQL parameter batch, by position.

    ADBC names the columns "0", "1", ...; other names are accepted positionally.
    """
    if batch is None or batch.num_columns == 0:
        return []
    cols = list(range(batch.num_columns))
    names = batch.schema.names
    if all(n.isdigit() for n in names):
        cols.sort(key=lambda i: int(names[i]))
    out = []
    for i in cols:
        col = batch.column(i)
        if pa.types.is_union(col.type):  # flightsql-dbapi sends dense unions
            out.append(_union_value(col[row]))
        else:
            out.append(col[row])
    return out


def _union_value(s: pa.Scalar) -> pa.Scalar:
    v = s.value
    return v if v is not None else pa.scalar(None)


# -- pinning -------------------------------------------------------------------------


@dataclass
class Pinner:
    """Pins each table once per statement: repeated references share one snapshot."""

    resolve: Resolver
    pins: dict[tuple[str, int | None, str | None], Any] = field(default_factory=dict)

    def pin(self, name: str, version: int | None = None, as_of: str | None = None) -> Any:
        key = (name, version, as_of)
        if key not in self.pins:
            self.pins[key] = self.resolve(name, version, as_of)
        return self.pins[key]


# -- query planning --------------------------------------------------------------------


@dataclass
class Scan:
    relation: str  # the name registered with DuckDB
    table: str
    snapshot: Any
    columns: list[str] | None  # None = all columns
    prune: tuple = ()  # PruneTerm hints for skipping files/row groups (never decide matches)


@dataclass
class FunctionScan:
    """A metadata table function call (``flightsrv_history('t')``) to register as a relation."""

    relation: str
    function: str  # one of validate.METADATA_FUNCTIONS
    table: str | None  # the table it describes (qualifiers stripped); None: the warehouse


@dataclass
class QueryPlan:
    tree: exp.Expression  # rewritten tree (parameters bound as literals)
    scans: list[Scan]
    #: The user's own text with only the table references replaced, when that could be
    #: done exactly; it keeps DuckDB's column naming and semantics and its ``$n``
    #: parameters must be bound natively. None: use ``tree`` (parameters inlined).
    text: str | None = None
    functions: list[FunctionScan] = field(default_factory=list)
    #: (relation, the reference as the user wrote it without its alias, whether it had an
    #: alias) for each relation substituted: what result names and messages show instead
    names: list[tuple[str, str, bool]] = field(default_factory=list)

    @property
    def sql(self) -> str:
        return self.text if self.text is not None else self.tree.sql(DIALECT)

    @property
    def needs_params(self) -> bool:
        return self.text is not None


def metadata_table_name(arg: str, sql: str) -> str:
    """The table a metadata function's argument names: ``t``, ``main.t`` or
    ``flightsrv.main.t`` (double quotes allowed)."""
    try:
        parsed = sqlglot.parse_one(f"SELECT 1 FROM {arg}", read=DIALECT)
        ref = parsed.find(exp.Table)
    except Exception:  # noqa: BLE001 - reported below
        ref = None
    if ref is None or not isinstance(ref.this, exp.Identifier) or ref.args.get("when") \
            or ref.args.get("alias") or len(list(parsed.find_all(exp.Table))) != 1:
        raise SqlError("not a table name", statement=sql, argument=repr(arg))
    validate.normalize_qualified(parsed, sql)
    return ref.name


def _time_travel(table: exp.Table, sql: str) -> tuple[int | None, str | None]:
    when = table.args.get("when")
    if when is None:
        return None, None
    if not isinstance(when, exp.HistoricalData) or str(when.this).upper() != "AT":
        raise error("only AT (VERSION => n) and AT (TIMESTAMP => '...') are supported",
                    sql, table)
    kind = str(when.args.get("kind") or "").upper()
    value = when.expression
    while isinstance(value, (exp.Cast, exp.Paren)):
        value = value.this
    if kind == "VERSION":
        if isinstance(value, exp.Literal) and not value.is_string and value.name.isdigit():
            return int(value.name), None
        raise error("AT (VERSION => n) needs a non-negative integer", sql, table)
    if kind == "TIMESTAMP":
        if isinstance(value, exp.Literal) and value.is_string:
            return None, value.name
        raise error("AT (TIMESTAMP => ...) needs a timestamp string", sql, table)
    raise error(f"AT ({kind} => ...) is not supported; use VERSION or TIMESTAMP", sql, table)


def plan_query(query: exp.Expression, pinner: Pinner, sql: str,
               source: tuple[str, int, int] | None = None, *,
               extra: frozenset[str] = frozenset(), copy: bool = True) -> QueryPlan:
    """Pin and rewrite every table reference in ``query`` (already bound); see module doc.

    ``source`` = (text, start, end): where ``query`` sits in the statement text (its nodes'
    token offsets refer to ``text``). When given, the plan also carries that text with only
    the table references spliced (see :attr:`QueryPlan.text`). ``copy=False``: ``query``
    belongs to the caller's statement alone (a copy it made) and is rewritten in place.
    """
    tree = query.copy() if copy else query
    bound = binder.bind(tree, sql, extra=extra)
    refs, calls = bound.tables, bound.functions
    functions = []
    names = [(f"{RELATION_PREFIX}{i}", shown_reference(t, source), aliased(t))
             for i, t in enumerate(refs)]
    for i, call in enumerate(calls):
        names.append((f"{RELATION_PREFIX}f{i}",
                      call.this.meta.get(validate.SHOWN) or call.this.sql(DIALECT),
                      aliased(call)))
        fn = str(call.this.this).lower()
        target = None if fn in binder.WAREHOUSE_FUNCTIONS else \
            call.this.expressions[0].name if fn == validate.INFORMATION_SCHEMA_FUNCTION else \
            metadata_table_name(call.this.expressions[0].name, sql)
        functions.append(FunctionScan(f"{RELATION_PREFIX}f{i}", fn, target))
        alias = call.args.get("alias") or exp.TableAlias(this=exp.to_identifier(fn))
        call.set("this", exp.to_identifier(functions[-1].relation))
        call.set("alias", alias)
    if calls:
        source = None  # render the tree: the calls are not spliced into the text
    spliced = None
    if source is not None:
        relations = [f"{RELATION_PREFIX}{i}" for i in range(len(refs))]
        spliced = splice_references(source, refs, relations)
    snapshots = []
    for t in refs:
        version, as_of = _time_travel(t, sql)
        snapshots.append(pinner.pin(t.name, version, as_of))
    columns = _projections(tree, refs, [s.schema for s in snapshots])
    terms = _prune_terms(tree, refs, [s.schema for s in snapshots])
    scans = []
    for i, (t, snap) in enumerate(zip(refs, snapshots)):
        relation = f"{RELATION_PREFIX}{i}"
        scans.append(Scan(relation, t.name, snap, columns[i], terms[i]))
    for i, t in enumerate(refs):
        alias = t.args.get("alias")
        if alias is None:
            alias = exp.TableAlias(this=exp.Identifier(this=t.name, quoted=t.this.quoted))
        t.set("this", exp.to_identifier(scans[i].relation))
        t.set("when", None)
        t.set("alias", alias)
    return QueryPlan(tree, scans, spliced, functions, names)


def aliased(t: exp.Expression) -> bool:
    alias = t.args.get("alias")
    return alias is not None and bool(alias.name)


def shown_reference(t: exp.Table, source: tuple[str, int, int] | None) -> str:
    """Table reference ``t`` (without its alias) as DuckDB prints it: its name, the
    ``main.`` / ``flightsrv.main.`` qualifier the user wrote (found in ``source``'s text)
    and its ``AT (...)`` clause."""
    meta = getattr(t.this, "_meta", None) or {}
    parts = []
    start = meta.get(validate.QUALIFIED_START)
    if source is not None and start is not None and "start" in meta:
        try:
            qual = sqlglot.parse_one(f"SELECT 1 FROM {source[0][start:meta['start']]}x",
                                     read=DIALECT).find(exp.Table)
            parts = [p.name for p in qual.parts[:-1]]
        except Exception:  # noqa: BLE001 - the name alone
            parts = []
    shown = ".".join(printed(p) for p in [*parts, t.name])
    when = t.args.get("when")
    if isinstance(when, exp.HistoricalData):  # DuckDB prints AT (KIND => value)
        value = when.expression
        if isinstance(value, exp.Literal):
            value = "'" + value.name.replace("'", "''") + "'" if value.is_string \
                else value.name
        else:
            value = value.sql(DIALECT) if value is not None else ""
        shown += f" AT ({str(when.args.get('kind') or '').upper()} => {value})"
    return shown


def reference_edits(text: str, refs: list[exp.Table], relations: list[str],
                    ) -> list[tuple[int, int, str]] | None:
    """Edits (start, end, replacement) of ``text`` that replace each table reference (name,
    qualifier and any ``AT (...)`` clause) by its relation name, keeping the alias (the
    table's own name becomes the alias when it had none). None when a span is not certain
    (missing token offsets, parameters inside ``AT``): the caller must not splice."""
    if not refs:
        return []  # nothing to replace (the text tokenized when it was parsed)
    try:
        tokens = _tokens(text)
    except Exception:  # noqa: BLE001 - fall back to the tree
        return None
    by_start = {tok.start: i for i, tok in enumerate(tokens)}
    edits: list[tuple[int, int, str]] = []
    for t, rel in zip(refs, relations):
        ident = t.this
        meta = getattr(ident, "_meta", None) or {}
        if "start" not in meta or meta["start"] not in by_start:
            return None
        # ``main.t`` / ``flightsrv.main.t``: the qualifier goes too (validate strips it)
        a, b = meta.get(validate.QUALIFIED_START, meta["start"]), meta["end"] + 1
        if a not in by_start:
            return None
        alias = t.args.get("alias")
        repl = rel if alias is not None and alias.name else f"{rel} AS {ident.sql(DIALECT)}"
        edits.append((a, b, repl))
        when = t.args.get("when")
        if when is not None:
            if any(True for _ in when.find_all(exp.Placeholder)):
                return None
            span = _at_clause_span(tokens, by_start[meta["start"]])
            if span is None:
                return None
            edits.append(span + ("",))
    return sorted(edits)


def splice_references(source: tuple[str, int, int], refs: list[exp.Table],
                      relations: list[str]) -> str | None:
    """``text[start:end]`` with each table reference replaced by its relation name
    (:func:`reference_edits`); None when a span is not certain or falls outside."""
    text, start, end = source
    edits = reference_edits(text, refs, relations)
    if edits is None:
        return None
    out, pos = [], start
    for a, b, repl in edits:
        if not start <= a < b <= end or a < pos:
            return None
        out.append(text[pos:a])
        out.append(repl)
        pos = b
    out.append(text[pos:end])
    return "".join(out)


def _at_clause_span(tokens, i: int) -> tuple[int, int] | None:
    """Offsets of ``AT ( ... )`` within a few tokens after the table name at token ``i``."""
    for j in range(i + 1, min(i + 5, len(tokens) - 1)):
        tok = tokens[j]
        if tok.text.upper() == "AT" and tokens[j + 1].token_type == TokenType.L_PAREN:
            depth = 0
            for k in range(j + 1, len(tokens)):
                tt = tokens[k].token_type
                if tt == TokenType.L_PAREN:
                    depth += 1
                elif tt == TokenType.R_PAREN:
                    depth -= 1
                    if depth == 0:
                        return tok.start, tokens[k].end + 1
            return None
    return None


def query_source(stmt_text: str, stmt_tree: exp.Expression,
                 kind: str) -> tuple[str, int, int] | None:
    """Where the query part of a statement sits in its text: the whole text for a query,
    the part after ``AS`` for CTAS, after the target (and column list) for INSERT."""
    text = stmt_text
    end = len(text.rstrip().rstrip(";"))
    if kind == "query":
        return text, 0, end
    target = stmt_tree.this
    if isinstance(target, exp.Schema):
        target = target.this
    meta = getattr(target.this, "_meta", None) or {}
    if "end" not in meta:
        return None
    try:
        tokens = _tokens(text)
    except Exception:  # noqa: BLE001
        return None
    after = [i for i, tok in enumerate(tokens) if tok.start > meta["end"]]
    if not after:
        return None
    i = after[0]
    if kind == "ctas":
        if tokens[i].token_type != TokenType.ALIAS or i + 1 >= len(tokens):
            return None
        return text, tokens[i + 1].start, end
    if kind == "insert":
        starts = (TokenType.SELECT, TokenType.WITH, TokenType.VALUES, TokenType.FROM)
        if i + 1 < len(tokens) and tokens[i].text.upper() == "BY" and \
                tokens[i + 1].text.upper() == "NAME":
            i += 2  # INSERT INTO t BY NAME <query>
            if i >= len(tokens):
                return None
        if tokens[i].token_type == TokenType.L_PAREN and i + 1 < len(tokens) and \
                tokens[i + 1].token_type not in starts:
            depth = 0
            for k in range(i, len(tokens)):
                if tokens[k].token_type == TokenType.L_PAREN:
                    depth += 1
                elif tokens[k].token_type == TokenType.R_PAREN:
                    depth -= 1
                    if depth == 0:
                        i = k + 1
                        break
            else:
                return None
        if i >= len(tokens):
            return None
        return text, tokens[i].start, end
    return None


# -- projection --------------------------------------------------------------------------


def _alias(t: exp.Table) -> str:
    return (t.alias or t.name).lower()


def _direct_sources(select: exp.Select) -> list[exp.Expression]:
    out = []
    frm = select.args.get("from_")
    if frm is not None:
        out.append(frm.this)
    for j in select.args.get("joins") or []:
        out.append(j.this)
    return out


def _has_star(select: exp.Select) -> bool:
    """Whether a select list item expands to columns (``*``, ``t.*``, and the star filters
    ``* LIKE 'p'``, ``* SIMILAR TO``, ``* GLOB``, ``* EXCLUDE``...): any star but the
    argument of ``count(*)``. A false positive only reads more columns."""
    for e in select.expressions:
        for star in e.find_all(exp.Star):
            parent = star.parent
            if isinstance(parent, exp.Column):
                parent = parent.parent
            if not isinstance(parent, exp.Count):
                return True
    return False


def _projections(tree: exp.Expression, refs: list[exp.Table],
                 schemas: list[pa.Schema]) -> list[list[str] | None]:
    if not refs:
        return []
    ref_ids = {id(t): i for i, t in enumerate(refs)}
    full = [False] * len(refs)
    # constructs whose columns depend on every column of a table, by position or pattern:
    # PIVOT/UNPIVOT, COLUMNS(...), NATURAL joins, positional references (#2)
    everything = any(True for _ in tree.find_all(exp.Pivot, exp.Columns,
                                                 exp.PositionalColumn)) or any(
        (j.args.get("method") or "").upper() == "NATURAL" for j in tree.find_all(exp.Join)
    )
    if everything:
        return [None] * len(refs)
    for select in tree.find_all(exp.Select):
        if _has_star(select):
            for src in _direct_sources(select):
                if id(src) in ref_ids:
                    full[ref_ids[id(src)]] = True
    if isinstance(tree, exp.Merge) and id(tree.args.get("using")) in ref_ids and any(
            isinstance(w.args.get("then"), (exp.Update, exp.Insert))
            and any(True for _ in w.args["then"].find_all(exp.Star))
            for w in (tree.args.get("whens") or exp.Whens()).expressions):
        # MERGE ... UPDATE SET * / INSERT *: every column of a bare source table
        full[ref_ids[id(tree.args["using"])]] = True
    identifiers = {i.name.lower() for i in tree.find_all(exp.Identifier)}
    # a bare CURRENT_USER, CURRENT_DATE, ... is a call to sqlglot, but a column of that
    # name wins in DuckDB: keep such columns (reading one more column is harmless)
    for node in tree.find_all(*KEYWORD_NAMES):
        identifiers |= KEYWORD_NAMES[type(node)]
    bare_columns = {c.name.lower() for c in tree.find_all(exp.Column) if not c.table}
    out: list[list[str] | None] = []
    for i, (t, schema) in enumerate(zip(refs, schemas)):
        names = {n.lower() for n in schema.names}
        alias = t.args.get("alias")
        if full[i] or (_alias(t) in bare_columns and _alias(t) not in names) or (
                alias is not None and alias.columns):
            # SELECT *, DuckDB's whole-row reference ``SELECT t FROM t``, or column aliases
            # ``t AS x(a, b)``, which name the table's columns by position
            out.append(None)
            continue
        out.append([n for n in schema.names if n.lower() in identifiers])
    return out


# -- pruning hints ----------------------------------------------------------------------------

_COMPARISONS = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<",
                exp.LTE: "<="}
_FLIPPED = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}
_INNER_KINDS = {"", "INNER", "CROSS"}


@dataclass(frozen=True)
class PruneTerm:
    """A conjunct ``column op constant(s)`` of the WHERE that reads a reference directly:
    a hint that lets the scan skip files and row groups whose statistics rule it out
    (:mod:`flightsrv.engine.prune`). ``operands`` are DuckDB SQL texts of constants."""

    column: str  # the table's own column name
    op: str  # = <> < <= > >= in between is_null not_null prefix
    operands: tuple[str, ...] = ()
    #: per operand, the index of the bound parameter it is the value of, or -1 for a
    #: constant of the text; None when unknown (a parameter nested inside an operand):
    #: see :func:`rebind_term`
    params: tuple[int, ...] | None = field(default=None, compare=False)
    #: the operands as statistics may use them, when that differs from ``operands``: an
    #: operand that reads the clock (``now() - INTERVAL 1 DAY``) is evaluated before the
    #: statement starts, so statistics get it widened by :data:`CLOCK_SLACK_HOURS` in the
    #: direction that keeps more (:func:`_clock_bound`); ``operands`` themselves, as row
    #: conditions, run in the statement and read its own clock
    bounds: tuple[str, ...] | None = None
    #: whether the term may run as a row condition (below the deletion barrier, on deleted
    #: rows too): false when DuckDB would cast the column's stored values to compare
    rows: bool = True
    #: (template, class) when the WHERE compares a function of the column, not the column
    #: (``CAST(ts AS DATE) = DATE '2026-01-03'``): statistics compare ``template`` applied
    #: to each bound (the function is non-decreasing, so it maps the bounds of a unit's
    #: values to bounds of theirs); such a term is never a row condition (``rows``)
    over: tuple[str, str] | None = None

    @property
    def stat_operands(self) -> tuple[str, ...]:
        """The operands the statistics query compares bounds with."""
        return self.operands if self.bounds is None else self.bounds


#: the types of a ``TIMESTAMP '...'`` constant without a time zone, in every unit: sqlglot
#: reads DuckDB's TIMESTAMP (and DATETIME) as TIMESTAMPNTZ, TIMESTAMP_US as TIMESTAMP
_PLAIN_TIMESTAMPS = (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ,
                     exp.DataType.Type.TIMESTAMP_S, exp.DataType.Type.TIMESTAMP_MS,
                     exp.DataType.Type.TIMESTAMP_NS)


def _constant_class(node: exp.Expression) -> str | None:
    """'num' | 'str' | 'bool' | 'date' | 'timestamp' | 'timestamptz' | None for a constant
    operand we are willing to push (literals, signed numbers, typed literals)."""
    if isinstance(node, exp.Paren):
        return _constant_class(node.this)
    if isinstance(node, exp.Neg):
        inner = node.this
        return "num" if isinstance(inner, exp.Literal) and not inner.is_string else None
    if isinstance(node, exp.Boolean):
        return "bool"
    if isinstance(node, exp.Literal):
        return "str" if node.is_string else "num"
    if isinstance(node, exp.Cast) and _constant_class(node.this) in ("num", "str"):
        to = node.to
        if to.is_type(*exp.DataType.NUMERIC_TYPES):
            return "num"
        if to.is_type(*exp.DataType.TEXT_TYPES):
            return "str"
        if to.is_type(exp.DataType.Type.DATE):
            return "date"
        if to.is_type(exp.DataType.Type.TIMESTAMPTZ):
            return "timestamptz"
        if to.is_type(*_PLAIN_TIMESTAMPS):
            return "timestamp"
    return None


#: how far a clock-relative bound is widened for statistics: the pruner evaluates it a few
#: milliseconds before the statement reads its own transaction time, and local-time steps
#: (DST, a zone's offset change: at most a day) may move a value built from local time
#: (``current_date``, a cast or ``date_trunc`` in the session's zone) back by that much
CLOCK_SLACK_HOURS = 48
#: DuckDB's ``typeof()`` of a constant of each class, checked when the bound is evaluated
_TYPEOF = {"date": "DATE", "timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMP WITH TIME ZONE",
           "num": "BIGINT"}
#: functions DuckDB answers with the transaction's start time (a TIMESTAMPTZ)
_NOW_FUNCTIONS = frozenset({"NOW", "GET_CURRENT_TIMESTAMP", "TRANSACTION_TIMESTAMP"})


#: how deep a clock-relative operand may nest (``now() - INTERVAL 1 DAY`` is 2)
_CLOCK_DEPTH = 32


def _clock_leaf(node: exp.Expression) -> str | None:
    """The class of a call that reads the statement's clock, else None."""
    if isinstance(node, exp.CurrentTimestamp) and not node.args.get("this"):
        return "timestamptz"
    if isinstance(node, exp.Anonymous) and str(node.this).upper() in _NOW_FUNCTIONS \
            and not node.expressions:
        return "timestamptz"
    if isinstance(node, exp.CurrentDate) and not node.args.get("this"):
        return "date"
    if isinstance(node, exp.Localtimestamp) and not node.args.get("this"):
        return "timestamp"
    return None


def _interval_constant(node: exp.Expression) -> bool:
    """``INTERVAL '1' DAY``, ``INTERVAL '1 day'``, ``'1 day'::INTERVAL`` (no column, no
    call: a constant the statement and the pruner read alike)."""
    if isinstance(node, exp.Paren):
        return _interval_constant(node.this)
    if isinstance(node, exp.Interval):
        return isinstance(node.this, exp.Literal)
    return isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.INTERVAL) \
        and isinstance(node.this, exp.Literal) and node.this.is_string


def _integer_constant(node: exp.Expression) -> bool:
    if isinstance(node, exp.Paren):
        return _integer_constant(node.this)
    if isinstance(node, exp.Neg):
        return _integer_constant(node.this)
    return isinstance(node, exp.Literal) and not node.is_string \
        and str(node.this).isdigit()


def _clock_class(node: exp.Expression, depth: int = 0) -> str | None:
    """The class of an operand that is a non-decreasing function of the statement's clock,
    built only of: ``now()``/``current_timestamp``/``get_current_timestamp()``/
    ``transaction_timestamp()`` (TIMESTAMPTZ), ``current_date``/``today()`` (DATE),
    ``localtimestamp`` (TIMESTAMP); ``+``/``-`` a constant interval (a DATE becomes a
    TIMESTAMP, as in DuckDB), a DATE ``+``/``-`` a constant integer; ``date_trunc`` by a
    literal part (a DATE becomes a TIMESTAMP); a cast to DATE, TIMESTAMP or TIMESTAMPTZ;
    ``year()``/``EXTRACT(YEAR FROM ...)`` of one (a BIGINT, plus or minus a constant).
    Local-time steps can make such a function step back (at most a day), which the slack
    of :func:`_clock_bound` covers. None for anything else, and for an operand nested more
    than :data:`_CLOCK_DEPTH` deep (no pruning, never a recursion limit)."""
    if depth > _CLOCK_DEPTH:
        return None
    depth += 1
    if isinstance(node, exp.Paren):
        return _clock_class(node.this, depth)
    leaf = _clock_leaf(node)
    if leaf is not None:
        return leaf
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = node.this, node.expression
        pairs = [(left, right)] + ([(right, left)] if isinstance(node, exp.Add) else [])
        for x, c in pairs:
            k = _clock_class(x, depth)
            if k is None:
                continue
            if _interval_constant(c) and k != "num":
                return "timestamp" if k == "date" else k
            if k in ("date", "num") and _integer_constant(c):
                return k
        return None
    if isinstance(node, exp.Year) or (
            isinstance(node, exp.Extract) and isinstance(node.this, (exp.Var, exp.Literal))
            and str(node.this.this).upper() == "YEAR"):
        arg = node.expression if isinstance(node, exp.Extract) else node.this
        return "num" if _clock_class(arg, depth) is not None else None
    if isinstance(node, exp.TimestampTrunc):
        unit = node.args.get("unit")
        if not isinstance(unit, (exp.Var, exp.Literal)):
            return None
        k = _clock_class(node.this, depth)
        return "timestamp" if k == "date" else k
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast) \
            and _clock_class(node.this, depth) is not None:
        to = node.to
        if to.is_type(exp.DataType.Type.DATE):
            return "date"
        if to.is_type(exp.DataType.Type.TIMESTAMPTZ):
            return "timestamptz"
        if to.is_type(exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ):
            return "timestamp"
    return None


def _clock_pairing(column_class: str, kind: str) -> tuple[bool, bool] | None:
    """How a column of ``column_class`` compares with a clock-relative operand of class
    ``kind``: None when it may not prune, else (``widen``, ``rows``). ``widen``: the
    comparison casts through the session's time zone (TIMESTAMPTZ against a DATE or
    TIMESTAMP), whose local time may step back by up to a day, so the bound is widened by
    the slack once more after it is computed. ``rows``: the term may also run as a row
    condition below the deletion barrier, false when DuckDB casts the column's values
    (a TIMESTAMPTZ or TIMESTAMP constant against a DATE column, a TIMESTAMPTZ one against a
    TIMESTAMP column: a cast of a stored value can fail, which a deleted row must not
    make happen)."""
    if kind == "num":  # year(now()): a number column may be cast to its type
        return (False, False) if column_class == "num" else None
    if column_class == kind or (column_class, kind) == ("timestamp", "date"):
        return False, True
    if column_class == "timestamptz" and kind in ("date", "timestamp"):
        return True, True  # DuckDB casts the constant
    if column_class == "date" and kind == "timestamp":
        return False, False  # a DATE becomes its midnight: monotone, but a value can fail
    if column_class in ("date", "timestamp") and kind == "timestamptz":
        return True, False
    return None


def _clock_bound(node: exp.Expression, kind: str, later: bool, widen: bool) -> str:
    """The statistics operand for the clock-relative ``node`` of class ``kind``: every
    clock read moved :data:`CLOCK_SLACK_HOURS` earlier (a lower bound of the column) or
    ``later`` (an upper bound), and with ``widen`` the result moved as far again, so it
    keeps every unit the statement, starting a moment after the pruner, could match; NULL
    (keep everything) should DuckDB type it other than :func:`_clock_class` says."""
    sign = "+" if later else "-"

    def step(k: str) -> str:
        return f"{sign} {CLOCK_SLACK_HOURS // 24}" if k == "date" \
            else f"{sign} INTERVAL '{CLOCK_SLACK_HOURS}' HOUR"

    def shift(n: exp.Expression) -> exp.Expression:
        leaf = _clock_leaf(n)
        if leaf is None:
            return n
        return sqlglot.parse_one(f"({n.sql(DIALECT)} {step(leaf)})", read=DIALECT)

    text = node.copy().transform(shift).sql(DIALECT)
    if widen:
        text = f"(({text}) {step(kind)})"
    return f"(CASE WHEN typeof({text}) = '{_TYPEOF[kind]}' THEN {text} END)"


def _column_class(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "num"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "str"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz is not None else "timestamp"
    return None


def _comparable(column_class: str, constant_class: str | None) -> bool:
    """Whether DuckDB compares the column with the constant in an order-preserving way:
    same class, a string literal that DuckDB casts to a temporal column's own type, or a
    DATE against a TIMESTAMP column (``ts >= DATE '2026-02-01'``: the date becomes its
    midnight). Never a date or timestamp against a TIMESTAMPTZ column, nor a TIMESTAMPTZ
    against a TIMESTAMP column: those casts go through the time zone, and local time is not
    monotonic in UTC (a DST fall-back repeats an hour). A string literal against a number
    column is cast by DuckDB to the column's type (``id = '77'``; ``'abc'`` fails, in the
    statement as in the statistics query), so it compares as that number would."""
    if constant_class is None:
        return False
    if column_class == constant_class:
        return True
    if column_class == "num" and constant_class == "str":
        return True
    if column_class == "timestamp" and constant_class == "date":
        return True
    return column_class in ("date", "timestamp", "timestamptz") and constant_class == "str"


def _operand_comparable(column_class: str, node: exp.Expression) -> bool:
    """:func:`_comparable` for the operand ``node``: a string against a number column only
    as a plain literal (DuckDB casts a literal to the column's type, but refuses to compare
    a number with a VARCHAR expression such as ``CAST('7' AS VARCHAR)``)."""
    k = _constant_class(node)
    if column_class == "num" and k == "str":
        while isinstance(node, exp.Paren):
            node = node.this
        return isinstance(node, exp.Literal) and node.is_string
    return _comparable(column_class, k)


def _conjuncts(cond: exp.Expression) -> list[exp.Expression]:
    if isinstance(cond, exp.And):
        return list(cond.flatten())
    if isinstance(cond, exp.Paren):
        return _conjuncts(cond.this)
    return [cond]


#: ``date_trunc`` parts a term may truncate a column to (each a non-decreasing function)
_TRUNC_PARTS = frozenset({"MILLENNIUM", "CENTURY", "DECADE", "YEAR", "QUARTER", "MONTH", "WEEK",
                          "DAY", "HOUR", "MINUTE", "SECOND"})


def _column_side(node: exp.Expression) -> exp.Column | None:
    """The column of a prunable column side: the column itself, or a non-decreasing
    function of it whose bounds are that function of the column's bounds (for a DATE or
    TIMESTAMP column, checked in :func:`_make_term`): ``CAST(c AS DATE)``/``c::DATE``/
    ``date(c)``, ``date_trunc('<part>', c)``, ``year(c)``/``EXTRACT(YEAR FROM c)``."""
    if isinstance(node, exp.Column):
        return node
    if _transform_shape(node) is not None:
        return node.expression if isinstance(node, exp.Extract) else node.this
    return None


def _transform_shape(node: exp.Expression) -> tuple[str, str] | None:
    """(template with ``{}`` for the column, result class) of an allowed function of a
    bare column, else None."""
    inner = node.this if isinstance(node, (exp.Cast, exp.Date, exp.TimestampTrunc, exp.Year,
                                           exp.Extract)) else None
    if isinstance(node, exp.Extract):
        inner = node.expression
        part = node.this
        if isinstance(inner, exp.Column) and isinstance(part, (exp.Var, exp.Literal)) \
                and str(part.this).upper() == "YEAR":
            # as the statement spells it: DuckDB's EXTRACT fails where year() does not (a
            # TIMESTAMP_S beyond TIMESTAMP's range), and the statistics query must fail
            # (prune nothing) wherever the statement would
            return "EXTRACT(YEAR FROM {})", "num"
        return None
    if not isinstance(inner, exp.Column):
        return None
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast) \
            and node.to.is_type(exp.DataType.Type.DATE):
        return "CAST({} AS DATE)", "date"
    if isinstance(node, exp.Date) and not node.expressions and not node.args.get("zone"):
        return "CAST({} AS DATE)", "date"
    if isinstance(node, exp.TimestampTrunc) and not node.args.get("zone"):
        unit = node.args.get("unit")
        part = str(unit.this).upper() if isinstance(unit, (exp.Var, exp.Literal)) else ""
        if part in _TRUNC_PARTS:
            return f"date_trunc('{part.lower()}', {{}})", "timestamp"
        return None
    if isinstance(node, exp.Year):
        return "year({})", "num"
    return None


def _side(node: exp.Expression) -> bool:
    return _column_side(node) is not None


def _disjuncts(cond: exp.Expression) -> list[exp.Expression]:
    """The operands of a tree of ORs (and parentheses), in order; without recursion: a
    BI tool's filter can OR thousands of values."""
    out, stack = [], [cond]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Or):
            stack += [node.expression, node.this]
        elif isinstance(node, exp.Paren):
            stack.append(node.this)
        else:
            out.append(node)
    return out


def _listed_disjuncts(cond: exp.Or, owner: Callable | None = None
                      ) -> tuple[exp.Expression, str, list[exp.Expression]] | None:
    """``c = 1 OR c = 2 OR c IN (3, 4)`` (how BI tools spell a multi-select filter) as the
    term ``c IN (1, 2, 3, 4)``: every disjunct an ``=`` or ``IN`` of the same column side,
    so a row can match only when its value is one of the listed constants. ``owner(col)``:
    the table reference a column resolves to in its SELECT (None: not provably one), so
    ``t.c = 1 OR c = 2`` is one column when ``c`` can only be ``t``'s; without it the
    columns must be spelled alike."""
    side, key, operands = None, None, []
    for d in _disjuncts(cond):
        hit = _term(d) if not isinstance(d, exp.Or) else None
        if hit is None or hit[1] not in ("=", "in"):
            return None
        col = _column_side(hit[0])
        # DuckDB's identifiers are case-insensitive, quoted or not
        if owner is not None:
            ref = None if col.args.get("db") or col.args.get("catalog") else owner(col)
            if ref is None:
                return None
            where = (ref,)
        else:
            where = (col.table.lower(), col.db.lower(), col.catalog.lower())
        k = (col.name.lower(), where,
             _transform_shape(hit[0]) if hit[0] is not col else None)
        if side is None:
            side, key = hit[0], k
        elif k != key:
            return None
        operands += hit[2]
    return (side, "in", operands) if side is not None else None


def _pattern_prefix(conj: exp.Expression) -> str | None:
    """The text every match of ``c LIKE 'p...'`` / ``c GLOB 'p...'`` / ``starts_with(c,
    'p')`` starts with: the pattern up to its first wildcard; None for a pattern that is no
    plain string literal of the text (a parameter: a kept plan would keep its prefix), one
    holding a backslash (an escape in some dialects), or an empty prefix."""
    pat = conj.expression
    if not (isinstance(pat, exp.Literal) and pat.is_string) or \
            (pat._meta and PARAM_META in pat.meta):
        return None
    text = pat.this
    if "\\" in text:
        return None
    if isinstance(conj, exp.Like):
        text = re.split(r"[%_]", text, maxsplit=1)[0]
    elif isinstance(conj, exp.Glob):
        text = re.split(r"[*?\[]", text, maxsplit=1)[0]
    return text or None


def _term(conj: exp.Expression, owner: Callable | None = None
          ) -> tuple[exp.Expression, str, list[exp.Expression]] | None:
    """(column side, op, constant operands) when ``conj`` has a prunable shape; the column
    side is a column or an allowed function of one (:func:`_column_side`). ``owner``: see
    :func:`_listed_disjuncts`."""
    for cls, op in _COMPARISONS.items():
        if isinstance(conj, cls):
            left, right = conj.this, conj.expression
            if _side(left) and not _side(right):
                return left, op, [right]
            if _side(right) and not _side(left):
                return right, _FLIPPED[op], [left]
            return None
    if isinstance(conj, exp.Or):
        return _listed_disjuncts(conj, owner)
    if isinstance(conj, (exp.Like, exp.Glob, exp.StartsWith)) and \
            isinstance(conj.this, exp.Column) and not conj.args.get("negate"):
        prefix = _pattern_prefix(conj)
        return (conj.this, "prefix", [exp.Literal.string(prefix)]) if prefix else None
    if isinstance(conj, exp.In) and _side(conj.this):
        if conj.args.get("query") or conj.args.get("unnest") or conj.args.get("field"):
            return None
        return conj.this, "in", list(conj.expressions)
    if isinstance(conj, exp.Between) and _side(conj.this):
        if conj.args.get("symmetric"):
            return None
        return conj.this, "between", [conj.args["low"], conj.args["high"]]
    if isinstance(conj, exp.Is) and isinstance(conj.this, exp.Column) \
            and isinstance(conj.expression, exp.Null):
        return conj.this, "is_null", []
    if isinstance(conj, exp.Not) and isinstance(conj.this, exp.Is) \
            and isinstance(conj.this.this, exp.Column) \
            and isinstance(conj.this.expression, exp.Null):
        return conj.this.this, "not_null", []
    return None


def _make_term(col: exp.Column, op: str, operands: list[exp.Expression],
               schema: pa.Schema, side: exp.Expression | None = None) -> PruneTerm | None:
    """The hint for ``side op operands`` (``side``: ``col`` or an allowed function of it)
    on a table of ``schema``, when DuckDB compares that column (or function) with those
    constants in an order-preserving way; else None."""
    f = {f.name.lower(): f for f in schema}.get(col.name.lower())
    if f is None:
        return None
    cclass = _column_class(f.type)
    if cclass is None or (op == "prefix" and cclass != "str"):
        return None  # LIKE casts any other column to VARCHAR: not its order
    over = None
    if side is not None and side is not col:
        # a function of a DATE or TIMESTAMP column (never TIMESTAMPTZ: local time), compared
        # with constants that do not go through the time zone; statistics only
        shape = _transform_shape(side)
        if shape is None or cclass not in ("date", "timestamp"):
            return None
        over, cclass = shape, shape[1]
    bounds: list[str] | None = None
    rows = over is None
    for i, o in enumerate(operands):
        if _operand_comparable(cclass, o):
            if cclass == "num" and _constant_class(o) == "str":
                # DuckDB casts '77' when it reads a row; one that fails ('abc') must not
                # fail on a deleted row below the barrier: statistics only
                rows = False
            continue
        # an operand that reads the clock bounds the column from one side only (a bound
        # widened by the slack), and only as a lower or upper bound; ``= clock`` as both
        kind = _clock_class(o)
        pairing = _clock_pairing(cclass, kind) if kind is not None else None
        if over is not None and (kind == "timestamptz" or (pairing and pairing[0])):
            pairing = None
        if pairing is None or op not in ("<", "<=", ">", ">=", "between", "=") or \
                any(n._meta and PARAM_META in n.meta for n in o.walk()):
            return None
        if op == "=":  # c = f(now()): c BETWEEN f(earlier) AND f(later) for statistics
            op, operands = "between", [o, o]
            bounds = [_clock_bound(o, kind, False, pairing[0]),
                      _clock_bound(o, kind, True, pairing[0])]
            rows = rows and pairing[1]
            break
        if bounds is None:
            bounds = [_operand_sql(x) for x in operands]
        later = op in ("<", "<=") or (op == "between" and i == 1)
        bounds[i] = _clock_bound(o, kind, later, pairing[0])
        rows = rows and pairing[1]
    return PruneTerm(f.name, op, tuple(_operand_sql(o) for o in operands),
                     _operand_params(operands), None if bounds is None else tuple(bounds),
                     rows, over)


def _operand_params(operands: list[exp.Expression]) -> tuple[int, ...] | None:
    """:attr:`PruneTerm.params` of ``operands``."""
    out = []
    for o in operands:
        k = o.meta.get(PARAM_META) if o._meta else None
        if k is None and any(n._meta and PARAM_META in n.meta for n in o.walk()):
            return None  # a parameter inside an operand (``(?)``, ``CAST(? AS INT)``)
        out.append(-1 if k is None else k)
    return tuple(out)


def rebind_term(term: PruneTerm, values: Sequence[pa.Scalar], schema: pa.Schema
                ) -> PruneTerm | None:
    """The hint ``term`` (planned with other values of the same parameters) gives for
    ``values``: each parameter's operand spelled and checked as :func:`bind_params` and
    :func:`_make_term` would for these values; None when this value makes no hint (a hint
    only skips what cannot match, so a missing one costs reading, never rows). The term
    must carry :attr:`PruneTerm.params`."""
    if term.params is None:
        raise ValueError("a term without parameter sources cannot be rebound")
    if all(k < 0 for k in term.params):
        return term
    cclass = term.over[1] if term.over is not None \
        else _column_class(schema.field(term.column).type)
    operands = []
    bounds = list(term.stat_operands)  # a clock operand keeps its widened bound
    for i, (text, k) in enumerate(zip(term.operands, term.params, strict=True)):
        if k < 0:
            operands.append(text)
            continue
        value = values[k]
        shape = _integer_shape(value.type) if value.is_valid and cclass == "num" else None
        if shape is not None:  # what the lines below give, without parsing the literal
            operands.append(bound := f"{shape[0]}{value.as_py()}{shape[1]}")
            bounds[i] = bound
            continue
        node = _parse_literal(sqltypes.parameter_literal(value, k + 1))
        if cclass is None or not _operand_comparable(cclass, node):
            return None
        operands.append(bound := _operand_sql(node))
        bounds[i] = bound
    return PruneTerm(term.column, term.op, tuple(operands), term.params,
                     None if term.bounds is None else tuple(bounds), term.rows, term.over)


@functools.lru_cache(maxsize=64)
def _integer_shape(t: pa.DataType) -> tuple[str, str] | None:
    """(prefix, suffix) such that a bound integer ``v`` of type ``t`` gives the pruning
    operand ``prefix + str(v) + suffix`` (a "num" constant), as parsing its literal does:
    checked on 12, 67 and (signed types) -12 when first asked; None for other types or
    another shape."""
    if not pa.types.is_integer(t):
        return None
    shapes = set()
    for v in (12, 67) + ((-12,) if pa.types.is_signed_integer(t) else ()):
        node = _parse_literal(sqltypes.parameter_literal(pa.scalar(v, t), 1))
        if _constant_class(node) != "num":
            return None
        text = _operand_sql(node)
        if text.count(str(v)) != 1:
            return None
        shapes.add(tuple(text.split(str(v))))
    return shapes.pop() if len(shapes) == 1 else None


def _column_terms(cond: exp.Expression, owner: Callable | None = None):
    """(column, op, operands, side) of each prunable conjunct of ``cond`` whose column is
    not schema- or catalog-qualified (``side``: the column, or the function of it the
    conjunct compares). ``owner``: see :func:`_listed_disjuncts`."""
    for conj in _conjuncts(cond):
        hit = _term(conj, owner)
        if hit is None:
            continue
        side, op, operands = hit
        col = _column_side(side)
        if not (col.args.get("db") or col.args.get("catalog")):
            yield col, op, operands, side


def dml_prune_terms(cond: exp.Expression | None, target: exp.Table, schema: pa.Schema, *,
                    only_target: bool) -> tuple[PruneTerm, ...]:
    """Pruning hints for the target of a DELETE/UPDATE from its WHERE ``cond``: conjuncts on
    the target's columns (qualified by its alias or name, or unqualified when the statement
    reads no other relation at the top level, ``only_target``)."""
    if cond is None:
        return ()
    def mine(col: exp.Column) -> bool:
        return (col.table.lower() == _alias(target)) if col.table else only_target

    out = []
    for col, op, operands, side in _column_terms(cond, lambda c: "target" if mine(c) else None):
        if mine(col):
            term = _make_term(col, op, operands, schema, side)
            if term is not None:
                out.append(term)
    return tuple(out)


_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


def _operand_sql(node: exp.Expression) -> str:
    """DuckDB SQL text of a pushable constant: a plain number as written (a 1,000-id IN list
    spent most of its planning time in the generator), anything else generated."""
    if isinstance(node, exp.Literal) and not node.is_string and _NUMBER.fullmatch(node.this):
        return node.this
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) \
            and not node.this.is_string and _NUMBER.fullmatch(node.this.this):
        return "-" + node.this.this
    return node.sql(DIALECT, copy=False)


def _prune_terms(tree: exp.Expression, refs: list[exp.Table],
                 schemas: list[pa.Schema]) -> list[tuple[PruneTerm, ...]]:
    ref_ids = {id(t): i for i, t in enumerate(refs)}
    found: list[list[PruneTerm]] = [[] for _ in refs]
    for select in tree.find_all(exp.Select):
        where = select.args.get("where")
        if where is None:
            continue
        joins = select.args.get("joins") or []
        if any((j.args.get("side") or "") or (j.args.get("kind") or "").upper() not in _INNER_KINDS
               or (j.args.get("method") or "") for j in joins):
            continue
        sources = _direct_sources(select)
        direct = [ref_ids[id(s)] for s in sources if id(s) in ref_ids]
        only_refs = len(direct) == len(sources)
        by_alias = {_alias(refs[i]): i for i in direct}

        def owner(col: exp.Column, direct=direct, only_refs=only_refs,
                  by_alias=by_alias) -> int | None:
            if col.table:
                return by_alias.get(col.table.lower())
            if only_refs:
                owners = [i for i in direct
                          if col.name.lower() in {n.lower() for n in schemas[i].names}]
                return owners[0] if len(owners) == 1 else None
            return None

        for col, op, operands, side in _column_terms(where.this, owner):
            ref = owner(col)
            term = _make_term(col, op, operands, schemas[ref], side) \
                if ref is not None else None
            if term is not None:
                found[ref].append(term)
    return [tuple(f) for f in found]
