"""Model-based test: random sequences of append, delete, concurrent delete, CREATE OR REPLACE
(alone and racing a delete) and time travel against a plain in-memory reference, on the local
store and on S3 (moto)."""

from __future__ import annotations

import contextlib
import itertools
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import VersionNotFound
from flightsrv.runtime import Runtime

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.int64()), ("val", pa.float64()),
                    ("tag", pa.string())])

# predicate templates: (sql, python reference)
PREDICATES = [
    (lambda k: f"grp = {k % 7}", lambda k: lambda r: r["grp"] == k % 7),
    (lambda k: f"id % 5 = {k % 5}", lambda k: lambda r: r["id"] % 5 == k % 5),
    (lambda k: f"val < {k % 100}", lambda k: lambda r: r["val"] < k % 100),
    (lambda k: f"id BETWEEN {k} AND {k + 40}", lambda k: lambda r: k <= r["id"] <= k + 40),
    (lambda k: f"tag = 't{k % 3}' OR grp > 5",
     lambda k: lambda r: r["tag"] == f"t{k % 3}" or r["grp"] > 5),
    (lambda k: f"NOT (id < {k * 3})", lambda k: lambda r: not r["id"] < k * 3),
]

op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 300), st.integers(0, 10**6)),
    st.tuples(st.just("delete"), st.integers(0, len(PREDICATES) - 1), st.integers(0, 400)),
    st.tuples(st.just("concurrent_delete"), st.tuples(st.integers(0, len(PREDICATES) - 1),
                                                      st.integers(0, 400)),
              st.tuples(st.integers(0, len(PREDICATES) - 1), st.integers(0, 400))),
    st.tuples(st.just("time_travel"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("replace"), st.integers(0, 200), st.integers(0, 10**6)),
    st.tuples(st.just("replace_during_delete"), st.tuples(st.integers(0, 200),
                                                          st.integers(0, 10**6)),
              st.tuples(st.integers(0, len(PREDICATES) - 1), st.integers(0, 400))),
)


def make_rows(start: int, n: int, seed: int) -> list[dict]:
    return [{"id": i, "grp": (i * 31 + seed) % 9, "val": float((i * 7 + seed) % 101),
             "tag": f"t{(i + seed) % 4}"} for i in range(start, start + n)]


def check(table, model_rows, version=None):
    got = table.to_table(version=version).to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == sorted(model_rows, key=lambda r: r["id"])
    assert table.count_rows(version=version) == len(model_rows)


@contextlib.contextmanager
def rival_before_commit(table, rival):
    """While active, ``table``'s first commit runs ``rival()`` (another writer) right
    before it; the list it yields holds what ``rival`` returned, if it ran."""
    real_commit = table.commit
    fired: list = []

    def commit_after_rival(mutator, **kw):
        if not fired:
            fired.append(rival())
        return real_commit(mutator, **kw)

    table.commit = commit_after_rival
    try:
        yield fired
    finally:
        table.commit = real_commit


def run_model(uri: str, ops) -> None:
    wh = Warehouse.open(uri, Runtime.deterministic(11))
    table = wh.create_table("m", SCHEMA, {"row_group_bytes": 2048})
    rival = Warehouse.open(uri).table("m")
    rows: list[dict] = []
    history = {0: []}
    born = 0  # the first version of the current table (time travel never crosses a replace)
    next_id = itertools.count()

    def fresh(n, seed):
        ids = [next(next_id) for _ in range(n)]
        return make_rows(ids[0], n, seed) if ids else []

    for o in ops:
        kind = o[0]
        if kind == "append":
            n, seed = o[1], o[2]
            start = next(next_id)
            for _ in range(n - 1):
                next(next_id)
            new = make_rows(start, n, seed)
            table.append(pa.Table.from_pylist(new, schema=SCHEMA))
            rows = rows + new
        elif kind == "delete":
            sql_of, py_of = PREDICATES[o[1]]
            match = py_of(o[2])
            expected = [r for r in rows if match(r)]
            before = table.head().version
            assert table.delete(sql_of(o[2])) == len(expected)
            rows = [r for r in rows if not match(r)]
            if not expected:
                assert table.head().version == before  # nothing matched: no commit
        elif kind == "concurrent_delete":
            (pa_i, ka), (pb_i, kb) = o[1], o[2]
            match_a = PREDICATES[pa_i][1](ka)
            match_b = PREDICATES[pb_i][1](kb)
            with rival_before_commit(table, lambda: rival.delete(PREDICATES[pb_i][0](kb))
                                     ) as fired:
                n_a = table.delete(PREDICATES[pa_i][0](ka))
            if not fired:  # A matched nothing, so it never reached its commit
                match_b = lambda r: False  # noqa: E731
            b_rows = [r for r in rows if match_b(r)]
            a_rows = [r for r in rows if match_a(r) and not match_b(r)]
            if fired:
                assert fired[0] == len(b_rows)
            assert n_a == len(a_rows)
            rows = [r for r in rows if not match_a(r) and not match_b(r)]
        elif kind == "replace":
            rows = fresh(o[1], o[2])
            wh.create_table("m", SCHEMA, {"row_group_bytes": 2048}, replace=True,
                            data=pa.Table.from_pylist(rows, schema=SCHEMA))
            born = table.head().version
        elif kind == "replace_during_delete":
            (n, seed), (p_i, k) = o[1], o[2]
            new = fresh(n, seed)
            with rival_before_commit(table, lambda: Warehouse.open(uri).create_table(
                    "m", SCHEMA, replace=True,
                    data=pa.Table.from_pylist(new, schema=SCHEMA))) as fired:
                n_del = table.delete(PREDICATES[p_i][0](k))
            match = PREDICATES[p_i][1](k)
            if fired:  # the delete ran again on the new table: it never touches the old
                born = next(v for v in range(table.head().version, -1, -1)
                            if table.log.load(v).operation == "replace")
                rows = new
            assert n_del == len([r for r in rows if match(r)])
            rows = [r for r in rows if not match(r)]
        elif kind == "time_travel":
            v = o[1] % (table.head().version + 1)
            if v < born:
                with pytest.raises(VersionNotFound):
                    table.to_table(version=v)
            elif v in history:
                check(table, history[v], version=v)
        head = table.head().version
        history[head] = rows
        check(table, rows)


settings_ = settings(max_examples=int(__import__("os").environ.get("FLIGHTSRV_MODEL_EXAMPLES",
                                                                  "15")),
                     deadline=None,
                     derandomize=__import__("os").environ.get("FLIGHTSRV_MODEL_RANDOM") is None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@settings_
@given(st.lists(op, min_size=1, max_size=10))
def test_model_local(tmp_path_factory, ops):
    run_model(str(tmp_path_factory.mktemp("model") / "wh"), ops)


@settings(settings_, max_examples=max(5, settings_.max_examples // 3))
@given(st.lists(op, min_size=1, max_size=8))
def test_model_s3(s3_uri, ops):
    run_model(f"{s3_uri}/{uuid.uuid4().hex[:8]}", ops)
