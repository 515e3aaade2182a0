"""One execution of a statement too large for the text caches (over 64 KiB, issue 32) reads
its text once per pass: sqlglot tokenizes it once (not once per classifier, parser and
planner pass) and its tree is copied once (for the planner to rewrite), while no cache
keeps the text or anything made from it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sqlglot import exp

from flightsrv import Warehouse
from flightsrv import runtime
from flightsrv.engine import DuckEngine, Session, duck, guard
from flightsrv.sql import lexer, plan, statements

BIG = ("SELECT count(*) AS c FROM people WHERE id IN ("
       + ", ".join(str(i) for i in range(15_000)) + ")")
CACHES = [duck._parse, guard._verify_cached, statements._tokenize, plan._parse_literal]


@pytest.fixture
def engine(tmp_path):
    w = Warehouse.open(str(tmp_path / "wh"))
    t = w.create_table("people", pa.schema([("id", pa.int64()), ("name", pa.string())]))
    t.append(pa.table({"id": pa.array(range(100), pa.int64()),
                       "name": [f"n{i}" for i in range(100)]}))
    e = DuckEngine(w, mask_extension=False)
    yield e
    e.close()


@pytest.fixture
def counts(monkeypatch):
    n = {"tokenize": 0, "copy": 0}
    tokenize, copy = lexer.tokenize, exp.Expression.copy

    def counted_tokenize(text):
        n["tokenize"] += len(text) > 64 << 10
        return tokenize(text)

    def counted_copy(self):
        n["copy"] += 1
        return copy(self)

    monkeypatch.setattr(lexer, "tokenize", counted_tokenize)
    monkeypatch.setattr(exp.Expression, "copy", counted_copy)
    return n


def test_a_large_statement_is_tokenized_and_copied_once_per_execution(engine, counts):
    assert len(BIG) > 64 << 10
    before = [c.cache_chars() for c in CACHES]
    for _ in range(2):  # nothing kept between executions: the second does the same work
        counts.update(tokenize=0, copy=0)
        rows = engine.execute_query(BIG, Session("s")).reader.read_all().to_pylist()
        assert rows == [{"c": 100}]
        assert counts == {"tokenize": 1, "copy": 1}
        assert runtime._statement_memo.get() is None  # the memo died with the execution
    assert [c.cache_chars() for c in CACHES] == before


def test_one_statement_computes_an_uncached_call_once_and_keeps_nothing():
    calls = []

    @runtime.text_cache(maxsize=4, max_key_chars=8)
    def length(text):
        calls.append(text)
        return len(text)

    long = "x" * 9
    assert length(long) == length(long) == 9
    assert len(calls) == 2  # too long to cache: computed each time
    with runtime.one_statement():
        with runtime.one_statement():
            assert length(long) == 9
        assert length(long) == 9
    assert len(calls) == 3  # once within the block, nested blocks included
    assert length(long) == 9 and len(calls) == 4 and length.cache_chars() == 0
