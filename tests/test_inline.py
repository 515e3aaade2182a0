"""Data inlining (issue 35, docs/PROTOCOL.md §18): small appends live in the manifest chunks.

- a model test: random appends (Python API and INSERT ... VALUES; small ones inlined, large
  ones not), DELETE / UPDATE / MERGE, flushes, OPTIMIZE and time travel on a table with
  inlining on, compared with plain DuckDB running the same statements on the same rows,
  locally and on S3 (moto);
- the format flag: a version reaching an inlined entry is format 3 (root and chunks), one
  without is format 2, and a reader that knows only format 2 refuses it;
- erasure: a deleted inlined row erased with expire leaves no byte of it in any stored
  object (inlined Parquet bytes decoded too);
- a flush racing a delete never resurrects the deleted row; mirrors refuse inlined rows.
"""

from __future__ import annotations

import base64
import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.runtime import Runtime

SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int32()), ("v", pa.float64()),
                    ("s", pa.string())])
INLINE = {"inline.max_rows": 40, "inline.flush_files": 6, "inline.flush_rows": 150}
PREDICATES = ["g = {k5}", "id % 3 = {k3}", "v < {k}", "s = 's{k4}'", "v IS NULL",
              "id BETWEEN {k} AND {k2}"]


def _pred(i: int, k: int) -> str:
    return PREDICATES[i].format(k=k % 50, k2=k % 50 + 25, k3=k % 3, k4=k % 4, k5=k % 5)


def _rows(start: int, n: int, seed: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "g": [(i * 7 + seed) % 5 for i in ids],
                     "v": [None if i % 11 == 0 else float((i * 13 + seed) % 50) for i in ids],
                     "s": [f"s{(i + seed) % 4}" for i in ids]}, schema=SCHEMA)


def _values_sql(t: pa.Table) -> str:
    def lit(x):
        return "NULL" if x is None else (f"'{x}'" if isinstance(x, str) else repr(x))

    return ", ".join("(" + ", ".join(lit(r[c]) for c in SCHEMA.names) + ")"
                     for r in t.to_pylist())


def _sorted(t: pa.Table) -> list:
    return sorted(tuple(r.values()) for r in t.to_pylist())


op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 30), st.integers(0, 99)),
    st.tuples(st.just("append"), st.integers(41, 120), st.integers(0, 99)),
    st.tuples(st.just("insert"), st.integers(1, 12), st.integers(0, 99)),
    st.tuples(st.just("delete"), st.integers(0, len(PREDICATES) - 1), st.integers(0, 99)),
    st.tuples(st.just("update"), st.integers(0, len(PREDICATES) - 1), st.integers(0, 99)),
    st.tuples(st.just("merge"), st.integers(1, 8), st.integers(0, 99)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("optimize"), st.just(0), st.just(0)),
    st.tuples(st.just("time_travel"), st.integers(0, 10**6), st.just(0)),
)


def run_model(uri: str, ops) -> None:
    wh = Warehouse.open(uri, Runtime.deterministic(35))
    t = wh.create_table("t", SCHEMA, INLINE)
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t (id BIGINT, g INTEGER, v DOUBLE, s VARCHAR)")
    versions: dict[int, list] = {0: []}
    next_id = 0
    inlined_seen = False

    def same(sql_ours: str, sql_ref: str | None = None) -> None:
        got = _sorted(wh.sql(sql_ours))
        want = sorted(ref.execute(sql_ref or sql_ours).fetchall())
        assert got == want, sql_ours

    for kind, a, b in ops:
        if kind in ("append", "insert", "merge"):
            rows = _rows(next_id, a, b)
            next_id += a
        if kind == "append":
            t.append(rows)
            ref.execute("INSERT INTO t SELECT * FROM rows")
        elif kind == "insert":
            sql = f"INSERT INTO t VALUES {_values_sql(rows)}"
            assert wh.sql(sql) == a
            ref.execute(sql)
        elif kind == "merge":  # half the keys exist (updated), half are new (inserted)
            src = _values_sql(rows)
            old = max(0, next_id - 2 * a)
            keys = ", ".join(f"({old + i}, {i})" for i in range(a))
            sql = (f"MERGE INTO t USING (SELECT * FROM (VALUES {keys}) AS k(id, n)) AS k "
                   "ON t.id = k.id WHEN MATCHED THEN UPDATE SET v = k.n, s = 'm'")
            assert wh.sql(sql) == ref.execute(sql).fetchall()[0][0]
            sql = (f"MERGE INTO t USING (SELECT * FROM (VALUES {src}) AS r(id, g, v, s)) AS r "
                   "ON t.id = r.id WHEN NOT MATCHED THEN INSERT VALUES (r.id, r.g, r.v, r.s)")
            assert wh.sql(sql) == ref.execute(sql).fetchall()[0][0]
        elif kind == "delete":
            sql = f"DELETE FROM t WHERE {_pred(a, b)}"
            assert wh.sql(sql) == ref.execute(sql).fetchall()[0][0]
        elif kind == "update":
            sql = f"UPDATE t SET v = coalesce(v, 0) + 1, s = 'u' WHERE {_pred(a, b)}"
            assert wh.sql(sql) == ref.execute(sql).fetchall()[0][0]
        elif kind == "flush":
            t.flush_inlined()
            assert t.head().inline == (0, 0)
        elif kind == "optimize":
            t.compact()
            assert t.head().inline == (0, 0)
        elif kind == "time_travel":
            v = sorted(versions)[a % len(versions)]
            got = _sorted(wh.sql(f"SELECT * FROM t AT (VERSION => {v})"))
            assert got == versions[v], v
            assert _sorted(t.to_table(version=v)) == versions[v]
        head = t.head()
        inlined_seen = inlined_seen or head.inline[0] > 0
        versions[head.version] = sorted(ref.execute("SELECT * FROM t").fetchall())
        same("SELECT * FROM t")
        same("SELECT g, count(*), sum(v), min(s) FROM t GROUP BY g")
        assert t.count_rows() == ref.execute("SELECT count(*) FROM t").fetchall()[0][0]
    return inlined_seen


SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@settings(max_examples=4, **SETTINGS)
@given(st.lists(op, min_size=3, max_size=12))
def test_inline_model_local(tmp_path_factory, ops):
    run_model(str(tmp_path_factory.mktemp("inl") / "wh"), ops)


@pytest.mark.s3
@settings(max_examples=2, **SETTINGS)
@given(st.lists(op, min_size=3, max_size=8))
def test_inline_model_s3(s3_uri_factory, ops):
    run_model(s3_uri_factory(), ops)


def test_inline_fixed_sequence_inlines_and_flushes(tmp_path):
    """A sequence that crosses every path: inlined appends, a delete and an update on
    inlined rows, an automatic flush, a large append, time travel across the flush."""
    ops = [("append", 5, 1), ("insert", 3, 2), ("delete", 1, 4), ("update", 0, 3),
           ("merge", 4, 5), ("append", 100, 6)] + [("append", 2, i) for i in range(8)] + \
          [("time_travel", 1, 0), ("time_travel", 4, 0), ("flush", 0, 0),
           ("time_travel", 6, 0)]
    assert run_model(str(tmp_path / "wh"), ops)


# -- storage layout and format flag ------------------------------------------------------


def _make(uri, **props):
    wh = Warehouse.open(uri, Runtime.deterministic(7))
    return wh, wh.create_table("t", SCHEMA, {**INLINE, **props})


def test_small_appends_write_no_data_object_and_flag_format_3(tmp_path):
    wh, t = _make(str(tmp_path / "wh"))
    t.append(_rows(0, 5, 0))
    t.append(_rows(5, 5, 0))
    assert not list(t.store.list("data/"))  # no Parquet object per commit
    head = t.head()
    assert head.inline == (2, 10)
    root = json.loads(t.store.get(f"manifest/v{head.version:020d}.json")[0])
    assert root["format_version"] == 3 == head.stored_format  # what describe reports
    for m in t.store.list("chunks/"):
        body = json.loads(t.store.get(m.key)[0])
        assert body["format_version"] == (3 if any("inline" in f for f in body["files"])
                                          else 2)
    assert all(f.path.startswith("inline/") for f in head.data_files)
    t.append(_rows(10, 50, 0))  # over inline.max_rows: an ordinary data file
    assert len(list(t.store.list("data/"))) == 1
    t.flush_inlined()
    head = t.head()
    assert head.operation == "flush" and head.inline == (0, 0)
    root = json.loads(t.store.get(f"manifest/v{head.version:020d}.json")[0])
    assert root["format_version"] == 2 == head.stored_format  # a format-2 reader reads it
    assert sorted(t.to_table().column("id").to_pylist()) == list(range(60))


def test_inlining_is_off_by_default(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("t", SCHEMA)
    t.append(_rows(0, 3, 0))
    assert t.head().inline == (0, 0) and len(list(t.store.list("data/"))) == 1


def test_a_format_2_reader_refuses_inlined_versions(tmp_path, monkeypatch):
    """What a reader that knows only formats 1 and 2 does with a format-3 root and chunk:
    it refuses them by their format_version (CorruptObject naming the object), never
    reading an ``inline/`` key as an object."""
    import flightsrv.table.chunks as chunks_mod
    import flightsrv.table.manifest as manifest_mod

    wh, t = _make(str(tmp_path / "wh"))
    t.append(_rows(0, 5, 0))
    monkeypatch.setattr(manifest_mod, "INLINE_FORMAT", 2)
    monkeypatch.setattr(chunks_mod, "INLINE_FORMAT", 2)
    old = Warehouse.open(str(tmp_path / "wh")).table  # a fresh reader, no cache
    with pytest.raises(CorruptObject, match="newer than this reader"):
        old("t").to_table(version=1)
    leaf = next(m.key for m in t.store.list("chunks/"))
    from flightsrv.table.chunks import ChunkRef, ChunkStore

    ref = next(r for r in t.head().data_files.refs if r.path == leaf)
    with pytest.raises(CorruptObject, match="newer than this reader"):
        ChunkStore(t.store, "t", cache_chunks=0).parse(t.store.get(leaf)[0],
                                                       ChunkRef.from_json(ref.to_json()))


def test_a_flush_racing_a_delete_never_resurrects_the_row(tmp_path):
    """A delete that commits after the flush read the inlined rows is carried over to the
    flushed Parquet file."""
    uri = str(tmp_path / "wh")
    wh, t = _make(uri, **{"inline.flush_files": 1000})
    for i in range(4):
        t.append(_rows(i * 5, 5, 0))
    rival = Warehouse.open(uri)
    real = t.commit
    fired = []

    def commit_after_rival(mutator, **kw):
        if not fired:
            fired.append(rival.sql("DELETE FROM t WHERE id IN (3, 12)"))
        return real(mutator, **kw)

    t.commit = commit_after_rival
    result = t.flush_inlined()
    t.commit = real
    assert fired == [2] and result.deletes_carried_over == 2
    head = t.head()
    assert head.inline == (0, 0) and head.operation == "flush"
    assert sorted(t.to_table().column("id").to_pylist()) == [
        i for i in range(20) if i not in (3, 12)]


def test_publish_refuses_inlined_versions(tmp_path):
    wh, t = _make(str(tmp_path / "wh"))
    t.append(_rows(0, 5, 0))
    with pytest.raises(ConfigurationError, match="inlined rows"):
        t.publish("delta")
    assert not list(t.store.list("_delta_log/"))


def test_publish_formats_turns_inlining_off(tmp_path):
    wh, t = _make(str(tmp_path / "wh"), **{"publish.formats": "delta"})
    t.append(_rows(0, 5, 0))
    assert t.head().inline == (0, 0)


# -- erasure ---------------------------------------------------------------------------

SECRET = "SECRET-inlined-4711"


def _stored_secret(t) -> list[str]:
    """Keys of stored objects that hold the secret: in their bytes, or in the Parquet bytes
    of an inlined entry they carry (base64, compressed: decoded and read here)."""
    hits = []
    for m in t.store.list(""):
        raw = t.store.get(m.key)[0]
        if SECRET.encode() in raw:
            hits.append(m.key)
            continue
        if not m.key.endswith(".json"):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        entries = list(doc.get("files") or ()) + list(doc.get("overlay") or ())
        for e in entries:
            if "inline" in e:
                table = pq.read_table(pa.BufferReader(base64.b64decode(e["inline"])))
                if SECRET in str(table.to_pylist()):
                    hits.append(m.key)
                    break
    return hits


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_erasing_an_inlined_row_leaves_no_trace(backend, tmp_path, request):
    uri = str(tmp_path / "wh") if backend == "local" else request.getfixturevalue("s3_uri")
    wh, t = _make(uri, **{"compression": "none"})
    t.append(_rows(0, 5, 0))
    secret = pa.table({"id": [100], "g": [1], "v": [1.0], "s": [SECRET]}, schema=SCHEMA)
    t.append(secret)
    t.append(_rows(5, 5, 0))
    assert t.head().inline[0] == 3
    assert _stored_secret(t)  # the test can fail: the value is stored (inlined)
    assert wh.sql(f"DELETE FROM t WHERE s = '{SECRET}'") == 1  # a DV on the inlined file
    assert wh.sql(f"SELECT count(*) FROM t WHERE s = '{SECRET}'").column(0)[0].as_py() == 0
    result = t.purge(expire=True, grace=0)
    assert result.complete, result.to_dict()
    assert _stored_secret(t) == []
    assert sorted(t.to_table().column("id").to_pylist()) == list(range(10))


def test_server_ingest_insert_delete_and_read_inlined_rows(tmp_path):
    """Through a real Flight SQL client: ADBC bulk ingest and INSERT ... VALUES land
    inlined, DELETE and SELECT see them as part of the table, time travel too."""
    from _server_harness import WRITER, adbc, start

    server, engine, wh, uri = start(tmp_path)
    try:
        t = wh.create_table("ev", SCHEMA, INLINE)
        conn = adbc(uri, WRITER)
        with conn.cursor() as cur:
            assert cur.adbc_ingest("ev", _rows(0, 5, 0), mode="append") == 5
            cur.execute(f"INSERT INTO ev VALUES {_values_sql(_rows(5, 3, 0))}")
            assert t.head().inline == (2, 8) and not list(t.store.list("data/"))
            v = t.head().version
            cur.execute("DELETE FROM ev WHERE id IN (1, 6)")
            assert cur.rowcount == 2
            cur.execute("SELECT count(*), sum(id) FROM ev")
            assert cur.fetchone() == (6, sum(range(8)) - 7)
            cur.execute(f"SELECT count(*) FROM ev AT (VERSION => {v})")
            assert cur.fetchone() == (8,)
            cur.execute("OPTIMIZE ev")
            cur.fetchall()
        assert t.head().inline == (0, 0)
        assert sorted(t.to_table().column("id").to_pylist()) == [0, 2, 3, 4, 5, 7]
        conn.close()
    finally:
        server.shutdown()
        engine.close()


def test_flush_expire_and_vacuum_reclaim_inlined_bytes(tmp_path):
    """After a flush, expiring the versions before it and a vacuum leave no stored object
    that holds an inlined entry: the chunks that held them are garbage like any other."""
    wh = Warehouse.open(str(tmp_path / "wh"))  # the real clock: vacuum compares object ages
    t = wh.create_table("t", SCHEMA, {**INLINE, "inline.flush_files": 1000})
    for i in range(6):
        t.append(_rows(i * 3, 3, 0))
    t.flush_inlined()
    holding = [m.key for m in t.store.list("chunks/") if b'"inline":"' in t.store.get(m.key)[0]]
    assert holding  # the test can fail: older chunks hold inlined bytes
    t.expire_snapshots(retain_last=1)
    t.vacuum(grace=0)
    assert [m.key for m in t.store.list("") if b'"inline":"' in t.store.get(m.key)[0]] == []
    assert sorted(t.to_table().column("id").to_pylist()) == list(range(18))


def test_partitioned_inlined_appends_split_and_flush_per_partition(tmp_path):
    """A partitioned table inlines one entry per partition value of an append, each with
    its partition value (pruned by it), and a flush writes one file per partition."""
    wh = Warehouse.open(str(tmp_path / "wh"), Runtime.deterministic(9))
    t = wh.create_table("t", SCHEMA, {**INLINE, "inline.flush_files": 1000},
                        partition_by=["g"])
    t.append(_rows(0, 10, 0))
    t.append(_rows(10, 10, 0))
    head = t.head()
    assert head.inline[0] == 10 and all(f.partition for f in head.data_files)
    gone = [i for i in range(20) if (i * 7) % 5 == 2 and i > 5]  # g = 2 AND id > 5
    assert len(gone) == 3 and wh.sql("DELETE FROM t WHERE g = 2 AND id > 5") == 3
    want = sorted(set(range(20)) - set(gone))
    assert sorted(wh.sql("SELECT id FROM t").column(0).to_pylist()) == want
    assert wh.sql("SELECT count(*) FROM t WHERE g = 2").column(0)[0].as_py() == 1
    t.flush_inlined()
    head = t.head()
    assert head.inline == (0, 0) and len(head.data_files) == 5
    assert {f.partition for f in head.data_files} == {(g,) for g in range(5)}
    assert sorted(t.to_table().column("id").to_pylist()) == want


def test_cli_table_flush(tmp_path):
    """``flightsrv table flush T``: the explicit way to flush from the command line."""
    from test_cli import run

    wh, t = _make(str(tmp_path / "wh"), **{"inline.flush_files": 1000})
    t.append(_rows(0, 4, 0))
    t.append(_rows(4, 4, 0))
    proc = run("--warehouse", tmp_path / "wh", "table", "flush", "t", "--format", "jsonl")
    assert proc.returncode == 0, proc.stderr
    values = {r["metric"]: r["value"] for r in map(json.loads, proc.stdout.splitlines())}
    assert values["files_rewritten"] == 2 and values["files_added"] == 1
    head = Warehouse.open(str(tmp_path / "wh")).table("t").head()
    assert head.operation == "flush" and head.inline == (0, 0)
