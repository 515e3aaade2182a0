"""The canonical text a DELETE/UPDATE predicate is fingerprinted as must not change: the
fingerprints are recorded in manifests and certificates and matched later through
``fingerprint(wh, "name = 'x'")``. ``canonical_predicate_tree`` builds its private copy and
normalises identifiers in one pass; this checks it against the two-step reference it replaced
(``normalize_identifiers(tree.copy(), dialect="duckdb").sql(dialect="duckdb")``), on a table
of predicates and on generated ones, and that the given tree is left unchanged."""

from __future__ import annotations

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from flightsrv.errors import SqlError
from flightsrv.sql.statements import parse_statement
from flightsrv.table.fingerprint import canonical_predicate, canonical_predicate_tree


def _reference(tree: exp.Expression) -> str:
    return normalize_identifiers(tree.copy(), dialect="duckdb").sql(dialect="duckdb")


def _snapshot(tree: exp.Expression):
    """Everything about ``tree`` the new function could change by mistake."""
    return [(type(n).__name__, repr(n.args.get("this")) if not isinstance(
        n.args.get("this"), exp.Expression) else "", n.args.get("quoted"), n.comments,
        dict(n._meta) if n._meta is not None else None, n.parent is not None)
        for n in tree.walk()]


def _trees(pred: str):
    """The predicate as sqlglot parses it alone, and as the engine holds it: the WHERE of a
    parsed DELETE with its parentheses stripped (``DuckEngine._fingerprint``)."""
    yield sqlglot.parse_one(pred, read="duckdb")
    try:
        stmt = parse_statement(f"DELETE FROM t WHERE {pred}")
    except SqlError:  # the engine refuses it (e.g. a three-part column): never fingerprinted
        return
    cond = stmt.tree.args["where"].this
    while isinstance(cond, exp.Paren):
        cond = cond.this
    yield cond


def _check(pred: str) -> None:
    for tree in _trees(pred):
        before = _snapshot(tree)
        got = canonical_predicate_tree(tree)
        assert got == _reference(tree), pred
        assert _snapshot(tree) == before, f"tree changed: {pred}"
        assert canonical_predicate_tree(tree) == got


PREDICATES = [
    "id = 1",
    "ID = 1",
    "Id=1 AND Name='x'",
    '"Id" = 1',
    '"MixedCase" = \'A\'',
    '"with space" = 1',
    '"quo""ted" = \'it\'\'s\'',
    "name = 'O''Brien'",
    "name = 'MiXeD ''Case'''",
    "name = E'a\\nb'",
    "name LIKE '%x%' ESCAPE '\\'",
    "s.f = 1",
    "S.F = 1",
    '"S"."F" = 1',
    "s.f.g = 'x'",
    "s['Field'] = 1",
    "struct_extract(S, 'F') = 2",
    "lower(Name) = 'x'",
    "LOWER(UPPER(trim(Name))) = 'x'",
    "coalesce(A, B, 0) > 3",
    "My_Func(X) = 1",
    "length(CAST(Payload AS VARCHAR)) > 3",
    "CAST(Id AS BIGINT) = 5",
    "Id::VARCHAR = '5'",
    "TRY_CAST(Name AS INT) IS NULL",
    "event_time >= TIMESTAMP '2026-01-01 00:00:00'",
    "d = DATE '2026-01-01'",
    "ts > NOW() - INTERVAL 1 DAY",
    "Id IN (1, 2, 3)",
    "Id NOT IN (1, -2, 3.5, 1e3)",
    "Name IN ('a', 'B', 'it''s')",
    "id IN (" + ", ".join(str(i) for i in range(0, 3000, 3)) + ")",
    "Id IN (SELECT Id FROM Subjects)",
    "Id IN (SELECT S.Id FROM Subjects AS S WHERE S.Flag)",
    "EXISTS (SELECT 1 FROM Other o WHERE o.ID = T.Id)",
    "Id BETWEEN 1 AND 10",
    "NOT (Id = 1 OR Name IS NOT NULL)",
    "CASE WHEN A > 1 THEN B ELSE C END = 'x'",
    "a IS DISTINCT FROM B",
    "list_contains(Tags, 'X')",
    "[1, 2, 3] = Arr",
    "{'A': 1, 'b': Col} = s",
    "Id % 100 = 7",
    "x / Y > 2",
    "a // B = 1",
    "a || B = 'ab'",
    "regexp_matches(Name, '^A.*')",
    "Id = $1",
    "Id = 1 /* a comment */",
    "Id /* sqlglot.meta case_sensitive */ = 1",
    "(Id = 1)",
    "((Id = 1) AND (Name = 'x'))",
    "Id = 1 OR Id = 2 OR Id = 3",
    "date_trunc('day', Ts) = DATE '2026-01-01'",
    "strftime(Ts, '%Y') = '2026'",
    "Value > 1.5 AND Value < 2.5e10",
    "b = TRUE AND c IS NOT FALSE",
    "x = NULL",
    "\"ÄÖü\" = 'ÄÖü'",
    "Ärger = 1",
    "Über.Feld = 1",
    "COLUMNS('A.*') > 1",
    "a.* IS NOT NULL",
    "len(list_filter(Arr, X -> X > 1)) > 0",
    "sum(x) OVER (PARTITION BY Y) > 1",
]


@pytest.mark.parametrize("pred", PREDICATES)
def test_canonical_text_unchanged(pred):
    _check(pred)


def test_matches_the_text_path_for_plain_predicates():
    """``fingerprint(wh, text)`` canonicalises from text: the engine's tree path must give
    the same text for the predicates an operator would type."""
    for pred in ["name = 'alice@example.org'", "NAME='alice@example.org'",
                 '"Name" = \'x\'', "id IN (1, 2, 3)", "s.F = 1 AND lower(N) = 'x'"]:
        for tree in _trees(pred):
            assert canonical_predicate_tree(tree) == canonical_predicate(pred)


# -- generated predicates ------------------------------------------------------------------

_letters = st.sampled_from(list("abcXYZ_é"))
_word = st.text(_letters, min_size=1, max_size=6).filter(lambda w: not w[0].isdigit())


@st.composite
def _ident(draw):
    word = draw(_word)
    kind = draw(st.sampled_from(["plain", "quoted", "upper", "quoted_inner"]))
    if kind == "quoted":
        return f'"{word}"'
    if kind == "upper":
        return word.upper()
    if kind == "quoted_inner":
        return f'"{word}""{word.upper()}"'
    return word


@st.composite
def _column(draw):
    parts = draw(st.lists(_ident(), min_size=1, max_size=3))
    col = ".".join(parts)
    if draw(st.booleans()):
        col += f"['{draw(_word)}']"
    return col


_string = st.text(st.sampled_from(list("aB'x% é\\")), max_size=6).map(
    lambda s: "'" + s.replace("'", "''") + "'")
_number = st.one_of(st.integers(-10**6, 10**6).map(str),
                    st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"))
_literal = st.one_of(_string, _number, st.just("NULL"), st.just("TRUE"))
_type = st.sampled_from(["INT", "BIGINT", "VARCHAR", "DOUBLE", "DATE", "DECIMAL(10, 2)"])


def _value(children):
    return st.one_of(
        _literal,
        _column(),
        st.tuples(st.sampled_from(["lower", "UPPER", "coalesce", "My_Fn", "abs", "length"]),
                  st.lists(children, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(children, _type).map(lambda t: f"CAST({t[0]} AS {t[1]})"),
        st.tuples(children, _type).map(lambda t: f"({t[0]})::{t[1]}"),
        st.tuples(children, st.sampled_from(["+", "-", "*", "%", "||"]), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
    )


_values = st.recursive(st.one_of(_literal, _column()), _value, max_leaves=6)


@st.composite
def _atom(draw):
    left = draw(_values)
    shape = draw(st.sampled_from(["cmp", "in", "between", "isnull", "like", "sub"]))
    if shape == "cmp":
        op = draw(st.sampled_from(["=", "<>", "<", ">=", "!="]))
        return f"{left} {op} {draw(_values)}"
    if shape == "in":
        items = draw(st.lists(_literal, min_size=1, max_size=8))
        neg = "NOT " if draw(st.booleans()) else ""
        return f"{left} {neg}IN ({', '.join(items)})"
    if shape == "between":
        return f"{left} BETWEEN {draw(_literal)} AND {draw(_literal)}"
    if shape == "isnull":
        return f"{left} IS {'NOT ' if draw(st.booleans()) else ''}NULL"
    if shape == "like":
        return f"{left} LIKE {draw(_string)}"
    return f"{left} IN (SELECT {draw(_column())} FROM {draw(_ident())})"


_predicates = st.recursive(
    _atom(),
    lambda kids: st.one_of(
        st.tuples(kids, st.sampled_from(["AND", "OR"]), kids).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        kids.map(lambda k: f"NOT ({k})"),
    ),
    max_leaves=5,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_predicates)
def test_generated_predicates(pred):
    try:
        trees = list(_trees(pred))
    except Exception:  # noqa: BLE001 - text sqlglot cannot parse: nothing to compare
        return
    for tree in trees:
        before = _snapshot(tree)
        assert canonical_predicate_tree(tree) == _reference(tree), pred
        assert _snapshot(tree) == before


def test_private_copy_shares_no_mutable_meta():
    """A meta value that is not a scalar (``dot_parts`` lists, ...) is deep-copied: the
    generator may change its copy, never the caller's tree."""
    from flightsrv.table.fingerprint import _normalized_copy

    tree = sqlglot.parse_one("A.B = 1", read="duckdb")
    col = tree.find(exp.Column)
    col.meta["dot_parts"] = ["A", "B"]
    copy = _normalized_copy(tree)
    got = copy.find(exp.Column)
    assert got.meta["dot_parts"] == ["A", "B"]
    assert got.meta["dot_parts"] is not col.meta["dot_parts"]
    assert copy.find(exp.Identifier).meta is not tree.find(exp.Identifier).meta
    assert canonical_predicate_tree(tree) == _reference(tree) == "a.b = 1"
