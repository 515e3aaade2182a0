"""The deletion-mask extension (issue 33): files with deleted rows read by DuckDB's own
Parquet reader with the mask applied inside the scan. The same statements must return the
same rows with the extension on, with it off (the masked Arrow scan) and on plain DuckDB over
the live rows; no statement expression may ever see a deleted row; user SQL can neither call
the mask functions nor load anything; a missing compiler or a tampered file falls back."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap

import duckdb
import pyarrow as pa
import pytest

import flightsrv.engine.duck as duck_engine
import flightsrv.engine.dml as dml

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine import maskext
from flightsrv.errors import SqlError

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])
SMALL_GROUPS = {"row_group_bytes": "4096"}  # row groups of 1024 rows
TOTAL = 12_000


def _deleted(i: int) -> bool:
    # a DV (every 7th of file 0, every 11th of file 2), whole row groups (file 1's first)
    return (i < 3000 and i % 7 == 0) or 3000 <= i < 4024 or (6000 <= i < 9000 and i % 11 == 0)


def _value(i: int) -> str:
    # deleted rows hold a value no INTEGER cast accepts: reading one raises naming it
    return f"gone{i}" if _deleted(i) else str(i)


def _table(wh):
    t = wh.create_table("t", SCHEMA, SMALL_GROUPS)
    for lo in range(0, TOTAL, 3000):
        ids = list(range(lo, lo + 3000))
        t.append(pa.table({"id": ids, "k": [i % 10 for i in ids],
                           "v": [_value(i) for i in ids]}, schema=SCHEMA))
    t.delete("id % 7 = 0 AND id < 3000")
    t.delete("id >= 3000 AND id < 4024")
    t.delete("id % 11 = 0 AND id >= 6000 AND id < 9000")
    return t


def _live() -> pa.Table:
    ids = [i for i in range(TOTAL) if not _deleted(i)]
    return pa.table({"id": ids, "k": [i % 10 for i in ids], "v": [_value(i) for i in ids]},
                    schema=SCHEMA)


def _rows(engine, sql) -> list:
    got = engine.execute_query(sql, Session("s")).reader.read_all()
    return sorted(tuple(r.values()) for r in got.to_pylist())


@contextlib.contextmanager
def _engine_over_table(root: str, name: str, mask_extension: bool):
    """An engine (extension on or off) over a fresh warehouse ``root/name`` holding ``t``
    as :func:`_table` builds it; closed on exit."""
    wh = Warehouse.open(os.path.join(root, name))
    _table(wh)
    e = DuckEngine(wh, mask_extension=mask_extension)
    try:
        yield e
    finally:
        e.close()


QUERIES = [
    "SELECT * FROM t",
    "SELECT count(*) AS n, sum(k) AS sk, min(v) AS mv FROM t",
    "SELECT id, v FROM t WHERE id BETWEEN 2990 AND 4100",
    "SELECT id FROM t WHERE id = 7",  # deleted by the DV
    "SELECT id FROM t WHERE id IN (14, 15, 3500, 6011, 6012, 11999)",
    "SELECT k, count(*) AS n FROM t WHERE id > 100 GROUP BY k",
    "SELECT id FROM t WHERE k = 3 AND id < 7000",
    # the statement's own expressions raise on a deleted row's value
    "SELECT count(*) AS n FROM t WHERE CAST(v AS INTEGER) >= 0",
    "SELECT sum(CAST(v AS INTEGER)) AS s FROM t",
    "SELECT count(*) AS n FROM t WHERE id >= 0 AND CAST(v AS INTEGER) >= 0",
    "SELECT count(*) AS n FROM t WHERE CASE WHEN v LIKE 'gone%' THEN error('saw ' || v) "
    "ELSE true END",
    "SELECT max(CAST(v AS INTEGER)) AS m FROM t WHERE k = 0",
]


def _need_compiler(kind: str = "filter"):
    """The extension of ``kind`` is built here unless this machine has no compiler for it
    at all (then the engine falls back, which the subprocess tests below check); anything
    else that keeps it from loading (for the ``"scan"`` kind: DuckDB's headers not fetched)
    fails the tests."""
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler: the deletion-mask extension cannot be built here")
    if kind == "scan" and shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler: the 'scan' mask extension cannot be built here")


@pytest.fixture(params=maskext.KINDS)
def mask_kind(request):
    """Each extension kind: "scan" (the mask inside DuckDB's Parquet reader, C++) and
    "filter" (the mask function on ``file_row_number``, C API)."""
    _need_compiler(request.param)
    return request.param


@pytest.fixture(params=["grouped", "per-file"])
def group_rows(request, monkeypatch):
    """How the files with deleted rows are read: "grouped", the three files in one
    ``read_parquet`` with one mask slot (the function given ``file_index``), as their size
    makes it by default; "per-file", one ``read_parquet`` and one slot per file (as files
    larger than ``MASK_GROUP_ROWS`` are read)."""
    from flightsrv.engine import relations

    if request.param == "per-file":
        monkeypatch.setattr(relations, "MASK_GROUP_ROWS", 0)
        monkeypatch.setattr(relations, "SCAN_MASK_GROUP_ROWS", 0)
    return request.param


@pytest.fixture
def engines(local_uri, group_rows, mask_kind):
    wh = Warehouse.open(local_uri)
    _table(wh)
    on = DuckEngine(wh, mask_extension=mask_kind)
    off = DuckEngine(wh, mask_extension=False)
    assert on.mask_slots is not None, "the extension must build and load here"
    assert on.mask_slots.kind == mask_kind
    assert off.mask_slots is None
    duck = duckdb.connect()
    duck.register("t", _live())
    try:
        yield on, off, duck
    finally:
        on.close()
        off.close()
        duck.close()


def _loaded_keys(engine, where: str) -> list[int]:
    """For each slot holding masks of files under ``where`` (the slots are the process's),
    how many files it holds."""
    out = []
    for key in engine.mask_slots._by_key:
        files = key if isinstance(key[0], tuple) else (key,)  # a group: one key per file
        if isinstance(files[0][0], str) and where in files[0][0]:
            out.append(len(files))
    return out


@pytest.mark.parametrize("sql", QUERIES)
def test_same_rows_with_the_extension_on_and_off_and_on_plain_duckdb(engines, sql):
    on, off, duck = engines
    want = sorted(duck.execute(sql).fetchall())
    assert _rows(off, sql) == want
    assert _rows(on, sql) == want


def test_the_extension_reads_files_with_deleted_rows(engines, local_uri, group_rows):
    """Without a filter, the files with deleted rows are read by DuckDB with their masks
    (three small files with deletes: one slot holding the three masks; one slot per file
    when each has a ``read_parquet`` of its own), not by the Arrow scan."""
    on, _, _ = engines
    texts = []
    real = duck_engine.run_to_arrow
    with pytest.MonkeyPatch.context() as m:
        m.setattr(duck_engine, "run_to_arrow",
                  lambda cur, text, **k: texts.append(text) or real(cur, text, **k))
        _rows(on, "SELECT count(*) FROM t")
    # the "scan" kind: the reader drops the deleted rows, no mask function is evaluated
    scan = on.mask_slots.kind == "scan"
    assert ("__fsrv_scan(" in texts[-1]) == scan and ("__fsrv_live_" in texts[-1]) != scan, texts
    loaded = _loaded_keys(on, local_uri)
    if group_rows == "grouped":  # (Table.delete's own read may have left a one-file slot)
        assert loaded.count(3) == 1 and sum(loaded) <= 4, loaded
    else:
        assert loaded == [1, 1, 1]
    assert not any(on.mask_slots._pins)  # released when the statement ended


def test_no_free_slot_reads_the_files_by_the_arrow_scan(engines, monkeypatch):
    """When no mask slot can be pinned (every slot pinned, or no room under the byte
    bound), the group's files are read by the masked Arrow scan, with or without a filter
    that prunes: the same rows."""
    on, _, duck = engines
    monkeypatch.setattr(on.mask_slots, "acquire", lambda key, bitmap: None)
    for sql in QUERIES:
        assert _rows(on, sql) == sorted(duck.execute(sql).fetchall()), sql


def test_dml_finds_rows_through_the_masked_read(local_uri, group_rows):
    """DELETE and UPDATE over files that already have deleted rows give the same table with
    either extension kind and with none."""
    _need_compiler("scan")
    results = []
    for flag in ("scan", "filter", False):
        with _engine_over_table(local_uri, str(flag), flag) as e:
            s = Session("s")
            n1 = e.execute_update("DELETE FROM t WHERE k = 5 AND id < 9000", s)
            n2 = e.execute_update("UPDATE t SET v = v || 'u' WHERE k = 4 OR id = 7", s)
            results.append((n1, n2, _rows(e, "SELECT * FROM t")))
    assert results[0] == results[1] == results[2]
    live = [i for i in range(TOTAL) if not _deleted(i)]
    assert results[0][0] == sum(1 for i in live if i % 10 == 5 and i < 9000)


def test_a_listed_point_read_is_one_duckdb_statement_with_its_relation_inline(
        local_uri, group_rows, monkeypatch, mask_kind):
    """A reference whose WHERE lists the values it wants (``id = ?``, a short IN) reads its
    files with deleted rows inside the statement: one DuckDB statement, every such file in
    one ``read_parquet`` with its mask (even files that a scan would read one by one), the
    listed condition below the barrier and the relation bound in the statement's own WITH
    clause, not a view created for it, while those files hold at most
    ``LISTED_IN_SCAN_ROWS`` rows. The prefetch (``LISTED_IN_SCAN`` off, or more rows) runs
    DuckDB twice and returns the same rows; the statement's own failing CAST never sees a
    deleted row either way."""
    from flightsrv.engine import relations

    texts = []
    real = duck_engine.run_to_arrow
    monkeypatch.setattr(duck_engine, "run_to_arrow",
                        lambda cur, text, **k: texts.append(text) or real(cur, text, **k))
    sql = "SELECT id, v FROM t WHERE id = ? AND CAST(v AS INTEGER) >= 0"
    listed = "SELECT id FROM t WHERE id IN (7, 8, 3500, 6006, 6012) AND CAST(v AS INTEGER) > 0"
    own_with = "WITH x AS (SELECT * FROM t WHERE id = 8) SELECT id, v FROM x"
    results = []
    with _engine_over_table(local_uri, group_rows, mask_kind) as e:
        for inline in (True, False, "bound"):
            # "bound": the files with deletes (9,000 rows) hold more rows than the bound
            # allows: the prefetch reads them, as with the in-scan read off
            monkeypatch.setattr(duck_engine, "LISTED_IN_SCAN", bool(inline))
            monkeypatch.setattr(duck_engine, "LISTED_IN_SCAN_ROWS",
                                8_999 if inline == "bound" else 9_000)
            got = []
            for i in (7, 8, 3500, 6006, 6012, 11999):  # deleted: 7, 3500 (a group), 6006
                texts.clear()
                got.append(e.execute_query(sql, Session("s"), pa.record_batch(
                    [pa.array([i])], names=["0"])).reader.read_all().to_pylist())
                if inline is True:
                    assert len(texts) == 1, texts
                    assert texts[0].startswith("WITH __fsrv_r0 AS NOT MATERIALIZED ("), texts
                    # the three files with deletes: one read, one mask (the clean file
                    # has a read of its own when its statistics keep it)
                    # either kind tests the mask on the rows the listed condition keeps
                    # (the "scan" kind's reader filters fastest without a deletion filter)
                    assert texts[0].count("__fsrv_live_") == 1, texts
                    assert "__fsrv_scan(" not in texts[0], texts
                    assert texts[0].count(relations.BARRIER) == 1, texts
                else:
                    assert len(texts) == 2, texts  # the prefetch, then the statement
            got += [_rows(e, listed), _rows(e, own_with)]
            results.append(got)
    assert results[0] == results[1] == results[2]
    assert results[0] == [[], [{"id": 8, "v": "8"}], [], [], [{"id": 6012, "v": "6012"}],
                          [{"id": 11999, "v": "11999"}], [(8,), (6012,)], [(8, "8")]]


def test_user_sql_cannot_call_the_mask_functions_or_load(engines):
    on, _, _ = engines
    for sql in ("SELECT __fsrv_live_0(1)", "SELECT count(*) FROM t WHERE __fsrv_live_1(id)",
                f"LOAD '{maskext.build()}'", "INSTALL httpfs",
                f"LOAD '{maskext.build(kind='scan')}'",
                "SELECT * FROM __fsrv_scan(['/etc/hostname'], fsrv_slot := 0)",
                "SELECT * FROM t, __fsrv_scan([], fsrv_slot := 1)",
                "SELECT * FROM duckdb_functions() WHERE function_name LIKE '__fsrv%'"):
        with pytest.raises(SqlError):
            _rows(on, sql)


def test_footer_is_what_duckdb_reads():
    f = maskext.footer("linux_amd64")
    assert len(f) == 512
    fields = [f[i * 32:(i + 1) * 32].rstrip(b"\0") for i in range(8)][::-1]
    assert fields[:5] == [b"4", b"linux_amd64", b"v1.2.0", b"flightsrv", b"C_STRUCT"]
    assert f[256:] == b"\0" * 256
    f = maskext.footer("linux_amd64", "v2.0.1", abi="CPP")
    fields = [f[i * 32:(i + 1) * 32].rstrip(b"\0") for i in range(8)][::-1]
    assert fields[:5] == [b"4", b"linux_amd64", b"v2.0.1", b"flightsrv", b"CPP"]


def test_cache_directory_must_be_private(tmp_path):
    os.makedirs(tmp_path / "maskext", mode=0o755)
    os.chmod(tmp_path / "maskext", 0o755)
    with pytest.raises(maskext.Unavailable, match="not private"):
        maskext.build(str(tmp_path))


_CHILD = textwrap.dedent("""
    import logging, sys
    import pyarrow as pa
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine, Session
    wh = Warehouse.open(sys.argv[1])
    t = wh.create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": list(range(100))}))
    t.delete("id % 3 = 0")
    for _ in range(2):  # two engines: one log line
        e = DuckEngine(wh)
        n = e.execute_query("SELECT count(*) AS n FROM t", Session("s")).reader.read_all()
        print(e.mask_slots is not None, n.to_pylist()[0]["n"])
        e.close()
""")


def _child(tmp_path, env: dict, kind: str | None = None) -> subprocess.CompletedProcess:
    """The engine of :data:`_CHILD` in a new process with ``env`` (``kind``: the only mask
    extension kind it may use); DuckDB's headers come from this process's cache, so that a
    fresh cache directory does not download them again."""
    full = dict(os.environ)
    full.pop(maskext.ENV, None)
    if kind is not None:
        full[maskext.ENV] = kind
    if shutil.which(full.get("CXX") or "c++") is not None:
        with contextlib.suppress(maskext.Unavailable):  # offline: the child says so itself
            full.setdefault(maskext.INCLUDE_ENV, maskext.headers())
    full.update(env)
    return subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "wh")], env=full,
                          capture_output=True, text=True, timeout=300)


def test_missing_compiler_falls_back_and_says_so_once(tmp_path):
    p = _child(tmp_path, {"CC": str(tmp_path / "no-such-cc"), "CXX": str(tmp_path / "no-c++"),
                          "FLIGHTSRV_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "66", "False", "66"]
    lines = [x for x in p.stderr.splitlines() if "deletion-mask extension unavailable" in x]
    assert len(lines) == 2, p.stderr  # one per kind, once for both engines
    assert "'scan' kind: no C++ compiler" in lines[0] and "'filter' mask extension" in lines[0]
    assert "'filter' kind: no C compiler" in lines[1] and "masked Arrow scan" in lines[1]


def test_missing_duckdb_headers_fall_back_to_the_filter_kind(tmp_path):
    """Without DuckDB's C++ headers (none where ``FLIGHTSRV_DUCKDB_INCLUDE`` says) the
    ``"scan"`` kind cannot be built: the engine says so once and uses the ``"filter"``
    kind; the rows are the same."""
    _need_compiler()
    os.makedirs(tmp_path / "empty")
    p = _child(tmp_path, {maskext.INCLUDE_ENV: str(tmp_path / "empty"),
                          "FLIGHTSRV_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "66", "True", "66"]
    lines = [x for x in p.stderr.splitlines() if "deletion-mask extension unavailable" in x]
    assert len(lines) == 1 and "holds no duckdb.hpp" in lines[0], p.stderr


def test_tampered_extension_is_not_loaded(tmp_path):
    _need_compiler()
    cache = str(tmp_path / "cache")
    path = maskext.build(cache)
    with open(path, "ab") as f:  # a changed file no longer matches its recorded digest
        f.write(b"\0")
    p = _child(tmp_path, {"FLIGHTSRV_CACHE_DIR": cache}, kind="filter")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "66", "False", "66"]
    assert "does not match its digest" in p.stderr
    os.remove(path)  # rebuilt when missing: the extension is used again
    os.remove(path + ".sha256")
    p = _child(tmp_path / "again", {"FLIGHTSRV_CACHE_DIR": cache}, kind="filter")
    assert p.stdout.split() == ["True", "66", "True", "66"], p.stderr


def test_slots_pinned_by_a_statement_are_never_rewritten(tmp_path):
    """A slot is reused, least recently used first, only when no statement pins it; with
    every slot pinned, or no room under the byte bound, there is none (the file is then read
    by the Arrow scan)."""
    _need_compiler()
    code = textwrap.dedent("""
        import ctypes, sys
        import numpy as np
        from flightsrv.engine import maskext
        lib = ctypes.CDLL(maskext.build(sys.argv[1]))
        s = maskext.Slots(lib, 2)
        bm = lambda: maskext.bitmap_of(8, np.array([1]), [])
        a, b = s.acquire("a", bm), s.acquire("b", bm)
        print(a != b, s.acquire("c", bm))
        s.release([a])
        print(s.acquire("c", bm) == a, s.acquire("b", bm) == b)
        # a byte bound: bitmaps of 8 bytes, room for two; a pinned one is never evicted
        s = maskext.Slots(lib, 4, max_bytes=16)
        bm = lambda: maskext.bitmap_of(64, np.array([1]), [])
        a, b = s.acquire("a", bm), s.acquire("b", bm)
        print(s.acquire("c", bm), s.held_bytes)
        s.release([a])
        c = s.acquire("c", bm)
        print(c is not None, s.held_bytes, s.acquire("a", bm))
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "None", "True", "True", "None", "16", "True", "16",
                                "None"]


def _masked_view(local_uri, kind: str = "filter"):
    """(connection, pinned slots, slots): the ``kind`` extension's connection with ``t``'s
    relation as a view whose every file is read by DuckDB's Parquet reader with its mask
    (the three files with deletes in one read and one slot, or one each: ``group_rows``)."""
    from flightsrv.engine import relations

    wh = Warehouse.open(local_uri)
    t = _table(wh)
    con, slots = maskext.connect(kind)
    assert con is not None and slots.kind == kind
    pinned = []

    def bitmap(snap, f):
        ranges = [(f.row_group_offsets[g], f.row_group_rows(g)) for g in f.deleted_row_groups]
        return maskext.bitmap_of(f.rows, snap.deleted_positions(f), ranges)

    def masks(snap, files):
        slot = slots.acquire(("barrier", local_uri, tuple(f.path for f in files)),
                             lambda: bitmap(snap, files[0]) if len(files) == 1
                             else [bitmap(snap, f) for f in files])
        pinned.append(slot)
        return maskext.Mask(slot, kind == "scan")

    rel = relations.build(t.snapshot(), None, "t", masks=masks)
    branches = 1 if relations.MASK_GROUP_ROWS >= 9000 else 3
    assert len(pinned) == branches and not rel.readers  # every file read by read_parquet
    assert rel.body.count(relations.BARRIER) == branches
    con.execute(f"CREATE TEMP VIEW t AS {rel.body}")
    return con, pinned, slots


ORACLES = [
    "SELECT count(*) FROM t WHERE CASE WHEN v LIKE 'gone%' THEN error('saw ' || v) ELSE true END",
    "SELECT count(*) FROM t WHERE id >= 0 AND CAST(v AS INTEGER) >= 0",
    "SELECT count(*) FROM t WHERE k = 3 AND 1 / (CASE WHEN v LIKE 'gone%' THEN 0 ELSE 1 END) = 1"
    " AND CAST(v AS INTEGER) >= 0",
]


@pytest.mark.parametrize("sql", ORACLES)
def test_the_statement_filters_sit_above_a_streaming_barrier_over_the_mask(local_uri, sql,
                                                                            group_rows,
                                                                            mask_kind):
    """Whether DuckDB evaluates a statement's ``error()`` or failing CAST before or after a
    mask in a subquery is its optimizer's choice (2.0.1 keeps the order for these, with or
    without a barrier; nothing promises it). The masked read ends in a 100% SYSTEM sample,
    which DuckDB's optimizer pushes no filter or expression through, so in the plan every
    statement filter is above the sample and the mask below it. The sample is a streaming
    operator (not a LIMIT, whose non-parallel streaming form ran each file's scan on one
    thread), so DuckDB reads each file with all its threads. With the ``"scan"`` kind the
    mask is the reader's own deletion filter: the scan itself is below the barrier."""
    con, pinned, slots = _masked_view(local_uri, mask_kind)
    try:
        plan = con.execute("EXPLAIN " + sql).fetchall()[0][1]
        lines = plan.splitlines()
        user = [i for i, x in enumerate(lines) if "CAST" in x or "error" in x or "CASE" in x]
        barrier = [i for i, x in enumerate(lines) if "Streaming Sample" in x]
        mark = "__FSRV_SCAN" if mask_kind == "scan" else "__fsrv_live_"
        mask = [i for i, x in enumerate(lines) if mark in x.upper() or mark in x]
        assert user and barrier and mask, plan
        assert max(user) < min(barrier) and max(barrier) < min(mask), plan
        assert "Limit" not in plan and "System: 100.0" in plan, plan
        want = [(sum(1 for i in range(TOTAL) if not _deleted(i) and
                      ("k = 3" not in sql or i % 10 == 3)),)]
        assert con.execute(sql).fetchall() == want
    finally:
        slots.release(pinned)
        con.close()


def test_the_barrier_keeps_every_row_and_is_a_streaming_operator(local_uri, group_rows):
    """The 100% sample drops no vector (every live row, at any thread count), and the plan
    holds no LIMIT, only the streaming samples, which run in the scan's parallel pipeline
    (``benchmarks/bench_masked.py`` measures that both threads scan one file; the LIMIT
    barrier left one thread doing about 90% of it)."""
    _need_compiler()
    con, pinned, slots = _masked_view(local_uri)
    try:
        for threads in (1, 2, 4):
            con.execute(f"SET threads = {threads}")
            got = con.execute("SELECT count(*), sum(id) FROM t").fetchall()
            live = [i for i in range(TOTAL) if not _deleted(i)]
            assert got == [(len(live), sum(live))]
        plan = con.execute("EXPLAIN SELECT sum(id) FROM t").fetchall()[0][1]
        assert plan.count("Streaming Sample") == (1 if group_rows == "grouped" else 3) \
            and "Limit" not in plan, plan
    finally:
        slots.release(pinned)
        con.close()


def test_the_mask_function_matches_its_bitmap_for_any_vector(mask_kind):
    """The extension reads eight positions per bitmap byte when a vector's positions are
    consecutive from a byte boundary (a Parquet read's ``file_row_number``, every position
    checked; a 64-row word with no deleted row as a run of live rows) and one at a time
    otherwise; both agree with the bitmap, past its end (live), at a ragged tail, for a
    vector whose ends look consecutive but whose middle is not, for a bitmap with few
    deletes and for an empty one."""
    _need_compiler()
    import numpy as np

    con, slots = maskext.connect(mask_kind)
    assert con is not None and slots.kind == mask_kind
    rows = 10_005  # not a multiple of 8: the last byte is partly used
    rng = np.random.default_rng(3)
    dead = np.sort(rng.choice(rows, 700, replace=False))
    dead = np.union1d(dead, [0, 7, 8, 2047, 2048, rows - 1])
    slot = slots.acquire(("any-vector",), lambda: maskext.bitmap_of(rows, dead, [(4096, 9)]))
    fn = maskext.function(slot)
    gone = set(dead.tolist()) | set(range(4096, 4105))
    try:
        for lo, hi, step in ((0, 20_000, 1), (3, 12_000, 1), (0, 12_000, 3), (8, 9000, 1)):
            got = {p for (p,) in con.execute(
                f"SELECT range FROM range({lo}, {hi}, {step}) WHERE {fn}(range)").fetchall()}
            assert got == {p for p in range(lo, hi, step) if p not in gone}, (lo, hi, step)
        # the ends of a vector as if consecutive, the middle not (two positions swapped)
        swapped = list(range(16))
        swapped[1], swapped[5] = 5, 1
        got = [p for (p,) in con.execute(
            f"SELECT p FROM unnest(?::BIGINT[]) AS u(p) WHERE {fn}(p)", [swapped]).fetchall()]
        assert sorted(got) == [p for p in range(16) if p not in gone]
        shuffled = [int(x) for x in rng.permutation(rows + 50)]
        got = {p for (p,) in con.execute(
            f"SELECT p FROM unnest(?::BIGINT[]) AS u(p) WHERE {fn}(p)", [shuffled]).fetchall()}
        assert got == {p for p in shuffled if p not in gone}
        # few deletes: most 64-row words of the bitmap are zero (read as runs of live rows);
        # an empty bitmap (a file whose deletes are all gone): every position is live
        few = np.array([100, 5000, 5001, 9000])
        for mask, gone_ in (((maskext.bitmap_of(rows, few, [])), set(few.tolist())),
                            ((np.zeros(0, np.uint8), 0), set())):
            other = slots.acquire(("any-vector", len(gone_)), lambda mask=mask: mask)
            try:
                got = {p for (p,) in con.execute(
                    f"SELECT range FROM range(0, 20_000) WHERE "
                    f"{maskext.function(other)}(range)").fetchall()}
                assert got == set(range(20_000)) - gone_
            finally:
                slots.release([other])
        # a slot holding several files' masks, called with (file_index, position): each
        # row is checked against its own file's mask, in vectors of one file and of mixed
        # files alike; a file index the slot holds no mask for is never a live row
        group = slots.acquire(("any-vector", "group"), lambda: [
            maskext.bitmap_of(rows, dead, [(4096, 9)]), maskext.bitmap_of(rows, few, [])])
        fn2 = maskext.function(group)
        gone_by_file = {0: gone, 1: set(few.tolist())}
        try:
            for lo, hi in ((0, 20_000), (5, 3000)):
                for fi in (0, 1, 2):
                    got = {p for (p,) in con.execute(
                        f"SELECT range FROM range({lo}, {hi}) WHERE "
                        f"{fn2}(CAST({fi} AS UBIGINT), range)").fetchall()}
                    assert got == ({p for p in range(lo, hi) if p not in gone_by_file[fi]}
                                   if fi in gone_by_file else set()), (lo, hi, fi)
            mixed = [(int(f), int(p)) for f, p in zip(rng.integers(0, 3, 6000),
                                                      rng.integers(0, rows + 50, 6000))]
            got = con.execute(
                f"SELECT f, p FROM (SELECT unnest(?::UBIGINT[]) AS f, unnest(?::BIGINT[]) AS p) "
                f"WHERE {fn2}(f, p)", [[f for f, _ in mixed], [p for _, p in mixed]]).fetchall()
            assert sorted(got) == sorted((f, p) for f, p in mixed
                                         if f in gone_by_file and p not in gone_by_file[f])
        finally:
            slots.release([group])
    finally:
        slots.release([slot])
        con.close()


def test_update_and_merge_read_matched_rows_by_position_through_duckdb(local_uri, monkeypatch):
    """UPDATE and MERGE read the whole rows they matched by position: with the extension,
    DuckDB's Parquet reader with a one-off mask keeping only those positions (``Snapshot.take``,
    the path without it, is made to fail), through a renamed column and a column added with
    a default; the table ends the same as with the extension off, and the one-off masks are
    freed at once."""
    monkeypatch.setattr(duck_engine, "MASKED_POSITION_READS", True)
    _need_compiler()
    from flightsrv.table import scan

    results = []
    for flag in ("scan", "filter", False):
        with _engine_over_table(local_uri, str(flag), flag) as e:
            s = Session("s")
            e.execute_update("ALTER TABLE t RENAME COLUMN k TO kk", s)
            e.execute_update("ALTER TABLE t ADD COLUMN w BIGINT DEFAULT 7", s)
            with monkeypatch.context() as m:
                if flag:
                    m.setattr(scan.Snapshot, "take", lambda *a, **k: pytest.fail("take"))
                n1 = e.execute_update("UPDATE t SET v = v || 'u', w = w + id WHERE kk = 4 "
                                      "OR id IN (7, 3500, 11999)", s)
                n2 = e.execute_update(
                    "MERGE INTO t USING (SELECT range AS x FROM range(0, 12000, 97)) s "
                    "ON t.id = s.x WHEN MATCHED AND t.kk > 5 THEN UPDATE SET w = 0 "
                    "WHEN MATCHED THEN DELETE", s)
            results.append((n1, n2, _rows(e, "SELECT * FROM t")))
            if flag:
                assert not any(k[0] == "take" for k in e.mask_slots._by_key)
    assert results[0] == results[1] == results[2]
    live = [i for i in range(TOTAL) if not _deleted(i)]
    assert results[0][0] == sum(1 for i in live if i % 10 == 4 or i in (11999,))
    assert results[0][1] == sum(1 for i in live if i % 97 == 0)


def test_update_without_from_reads_its_rows_in_its_find(local_uri, monkeypatch):
    """UPDATE without FROM finds its candidates and reads their whole rows in one DuckDB
    scan (no read by position follows): the same count, the same table afterwards and the
    same history as the find-then-read-by-position path, over files with deleted rows,
    after columns were added (with a default) and renamed; a condition that would fail on a
    deleted row's value does not fail; UPDATE ... FROM still reads by position."""
    _need_compiler()
    from flightsrv.engine import relations
    from flightsrv.table import scan

    reads = []
    real_take, real_group = relations.take_sql, relations.take_group_sql
    monkeypatch.setattr(relations, "take_sql", lambda *a: reads.append(1) or real_take(*a))
    monkeypatch.setattr(relations, "take_group_sql",
                        lambda *a: reads.append(1) or real_group(*a))
    monkeypatch.setattr(scan.Snapshot, "take", lambda *a, **k: pytest.fail("Snapshot.take"))
    statements = [
        "ALTER TABLE t ADD COLUMN w INTEGER DEFAULT 5",
        "ALTER TABLE t RENAME COLUMN k TO kk",
        # every live v casts; a deleted row's v ('gone...') would raise
        "UPDATE t SET v = v || 'u', w = w + kk WHERE CAST(v AS INTEGER) % 97 = 3",
        "UPDATE t AS x SET w = NULL WHERE x.id BETWEEN 2990 AND 3100 OR x.kk = 9",
        "UPDATE t SET kk = -1",
        "UPDATE t SET v = 'none' WHERE id = 3500",  # deleted: no row
    ]
    outcome = {}
    for one_pass in (True, False):
        monkeypatch.setattr(dml, "ONE_PASS_UPDATE", one_pass)
        with _engine_over_table(local_uri, f"one{one_pass}", True) as e:
            s = Session("s")
            counts, after = [], []
            for sql in statements:
                reads.clear()
                counts.append(e.execute_update(sql, s))
                if sql.startswith("UPDATE") and counts[-1]:
                    assert bool(reads) is not one_pass, (sql, reads)
                after.append(_rows(e, "SELECT * FROM t"))
            outcome[one_pass] = (counts, after)
            reads.clear()
            e.execute_update("UPDATE t SET w = 0 FROM (SELECT 11999 AS j) AS s "
                             "WHERE t.id = s.j", s)
            assert reads, "UPDATE ... FROM reads the candidates by position"
    assert outcome[True] == outcome[False]
    counts = outcome[True][0]
    assert counts[2] == sum(1 for i in range(TOTAL) if not _deleted(i) and i % 97 == 3)
    assert counts[5] == 0 and counts[4] == sum(1 for i in range(TOTAL) if not _deleted(i))


def test_one_pass_rows_come_back_in_file_and_position_order():
    """The one-scan find's rows are put in file and position order (as a read by position
    gives them), typed like the table; a row the relation gave twice raises naming the
    table and version instead of being written twice."""
    from flightsrv.errors import CorruptObject

    schema = pa.schema([("x", pa.int32())])
    got = pa.table({"x": pa.array([3, 1, 2], pa.int64()),
                    "__fsrv_file": pa.array([1, 0, 0], pa.uint64()),
                    "__fsrv_pos": [0, 5, 2]})
    found, rows = dml._split_whole(got, schema, ["x"], "t", 3)
    assert found["__fsrv_file"].tolist() == [0, 0, 1]
    assert found["__fsrv_pos"].tolist() == [2, 5, 0]
    assert rows.schema == schema and rows.column("x").to_pylist() == [2, 1, 3]
    twice = got.set_column(2, "__fsrv_pos", pa.array([0, 5, 0]))
    twice = twice.set_column(1, "__fsrv_file", pa.array([1, 0, 1], pa.uint64()))
    with pytest.raises(CorruptObject, match="twice") as e:
        dml._split_whole(twice, schema, ["x"], "t", 3)
    assert e.value.context["table"] == "t" and e.value.context["version"] == 3


def test_reads_by_position_of_several_files_are_one_duckdb_statement(local_uri, monkeypatch):
    """UPDATE's read by position reads the matched rows of every file of one written schema
    with one DuckDB statement (one-off masks of the files in one slot, so that DuckDB reads
    the files in parallel; a file of one row group read alone keeps one thread busy), the
    same rows in the same order as one read per file (``TAKE_GROUP_ROWS`` 1); a grouped
    read that returns rows out of order is put back in order, and one whose counts differ
    from the positions asked for raises naming the file."""
    monkeypatch.setattr(duck_engine, "MASKED_POSITION_READS", True)
    # UPDATE without FROM reads its candidates' rows in its find (the next test); this
    # one is about the read by position that MERGE and UPDATE ... FROM make
    monkeypatch.setattr(dml, "ONE_PASS_UPDATE", False)
    _need_compiler()
    from flightsrv.engine import relations
    from flightsrv.errors import CorruptObject
    from flightsrv.table import scan

    takes = []
    real_take, real_group = relations.take_sql, relations.take_group_sql
    monkeypatch.setattr(relations, "take_sql",
                        lambda *a: takes.append(1) or real_take(*a))
    monkeypatch.setattr(relations, "take_group_sql",
                        lambda snap, files, *a: takes.append(len(files)) or
                        real_group(snap, files, *a))
    monkeypatch.setattr(scan.Snapshot, "take", lambda *a, **k: pytest.fail("take"))
    results = []
    for group in (duck_engine.TAKE_GROUP_ROWS, 1):
        monkeypatch.setattr(duck_engine, "TAKE_GROUP_ROWS", group)
        takes.clear()
        with _engine_over_table(local_uri, str(group), True) as e:
            s = Session("s")
            n = e.execute_update("UPDATE t SET v = v || 'u' WHERE k = 4 OR id = 11999", s)
            results.append((n, _rows(e, "SELECT * FROM t")))
        assert takes == ([4] if group > 1 else [1, 1, 1, 1]), takes
    assert results[0] == results[1]
    assert results[0][0] == sum(1 for i in range(TOTAL)
                                if not _deleted(i) and (i % 10 == 4 or i == 11999))

    class F:
        def __init__(self, path):
            self.path = path

    class Snap:
        class table:
            name = "t"
        version = 3

    run = [F("a"), F("b")]
    positions = {"a": [1, 5], "b": [2]}
    part = pa.table({"x": [20, 11, 15], "__fsrv_fi": pa.array([1, 0, 0], pa.uint64()),
                     "__fsrv_fr": [2, 1, 5]})
    got = DuckEngine._took(Snap, run, positions, part)
    assert got.column_names == ["x"] and got.column("x").to_pylist() == [11, 15, 20]
    with pytest.raises(CorruptObject) as err:
        DuckEngine._took(Snap, run, {"a": [1, 5], "b": [2, 3]}, part)
    assert "b" in str(err.value)


def test_reads_by_position_of_two_engines_in_one_process_stay_apart(local_uri, monkeypatch):
    """Every engine of a process shares the extension's slots: two engines (two
    ``Warehouse`` objects, as two threads of one application open them) updating rows of
    the same file at once each read their own rows by position. The one-off masks were
    keyed by a per-engine counter, so the second engine's read found the first's mask: too
    few rows (the check refused the UPDATE) or, with equal counts, other rows."""
    import threading

    monkeypatch.setattr(duck_engine, "MASKED_POSITION_READS", True)
    _need_compiler()
    wh = Warehouse.open(local_uri)
    _table(wh)
    rounds = 12
    mine = {0: [1, 2, 5], 1: [9, 13, 16, 22]}  # live rows of the first file, disjoint sets
    errors: list = []
    start = threading.Barrier(2)

    def work(k: int) -> None:
        e = DuckEngine(Warehouse.open(local_uri), mask_extension=True)
        s = Session(f"s{k}")
        try:
            start.wait()
            for _ in range(rounds):
                ids = ", ".join(map(str, mine[k]))
                n = e.execute_update(f"UPDATE t SET k = k + 100 WHERE id IN ({ids})", s)
                assert n == len(mine[k]), n
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            e.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in mine]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    got = {r["id"]: r["k"] for r in wh.sql("SELECT id, k FROM t WHERE id < 30").to_pylist()}
    for k, ids in mine.items():
        for i in ids:
            assert got[i] == i % 10 + 100 * rounds, (i, got[i])
    for i, v in got.items():
        if not any(i in ids for ids in mine.values()):
            assert v == i % 10, (i, v)  # no other row changed


def test_compaction_reads_files_with_deleted_rows_through_the_mask(local_uri, monkeypatch):
    """OPTIMIZE through the engine reads each file with deleted rows by DuckDB's reader
    with that file's mask (compaction's own row-group read sees only the clean file), and
    writes the same rows in the same order as with the extension off."""
    monkeypatch.setattr(duck_engine, "MASKED_POSITION_READS", True)
    _need_compiler()
    from flightsrv.table import scan

    seen: list[str] = []
    real = scan.Snapshot.iter_tables

    def spy(self, *a, **k):
        for task, t in real(self, *a, **k):
            seen.append(task.file.path)
            yield task, t

    monkeypatch.setattr(scan.Snapshot, "iter_tables", spy)
    results = []
    for flag in ("scan", "filter", False):
        wh = Warehouse.open(os.path.join(local_uri, str(flag)))
        t = _table(wh)
        with_deletes = {f.path for f in t.snapshot().manifest.data_files
                        if (f.dv is not None and f.dv.cardinality) or f.deleted_row_groups}
        assert len(with_deletes) == 3
        e = DuckEngine(wh, mask_extension=flag)
        try:
            seen.clear()
            e.execute_update("OPTIMIZE t", Session("s"))
            read_here = set(seen)
            snap = t.snapshot()
            assert not any(f.path in with_deletes for f in snap.manifest.data_files)
            results.append(snap.to_table())
            if flag:
                assert read_here and not (read_here & with_deletes), read_here
                assert not any(e.mask_slots._pins)
            else:
                assert with_deletes <= read_here
        finally:
            e.close()
    assert results[0].equals(results[1]) and results[0].equals(results[2])
    assert results[0].column("id").to_pylist() == _live().column("id").to_pylist()


def test_masked_reads_by_position_and_for_compaction_keep_every_type(local_uri, monkeypatch):
    """UPDATE's read by position and OPTIMIZE's read through DuckDB give the same table as
    without the extension for a NOT NULL column, a TIMESTAMPTZ, a DECIMAL with NULLs, a
    list, a struct, a map and a REAL (DuckDB's Arrow output names a list's field and marks
    nullability differently from pyarrow's Parquet read; compaction batches both)."""
    monkeypatch.setattr(duck_engine, "MASKED_POSITION_READS", True)
    _need_compiler()
    import datetime as dt
    import decimal

    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False), ("s", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")), ("dec", pa.decimal128(10, 2)),
        ("l", pa.list_(pa.int32())), ("f", pa.float32()),
        ("m", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("mp", pa.map_(pa.string(), pa.int64()))])
    n = 5000
    t0 = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    data = pa.table({
        "id": list(range(n)), "s": [f"x{i}" for i in range(n)],
        "ts": [t0 + dt.timedelta(seconds=i) for i in range(n)],
        "dec": [None if i % 5 == 0 else decimal.Decimal(i) / 100 for i in range(n)],
        "l": [[i, i + 1] for i in range(n)], "f": [i / 3 for i in range(n)],
        "m": [{"a": i, "b": str(i)} for i in range(n)], "mp": [[("k", i)] for i in range(n)]},
        schema=schema)
    results = []
    for flag in ("scan", "filter", False):
        wh = Warehouse.open(os.path.join(local_uri, str(flag)))
        t = wh.create_table("t", schema)
        t.append(data)
        t.delete("id % 3 = 0")
        e = DuckEngine(wh, mask_extension=flag)
        try:
            s = Session("s")
            n1 = e.execute_update("UPDATE t SET s = s || '!' WHERE id % 7 = 1", s)
            e.execute_update("OPTIMIZE t", s)
            results.append((n1, t.snapshot().to_table()))
        finally:
            e.close()
    assert results[0][0] == results[1][0] == results[2][0] == \
        sum(1 for i in range(n) if i % 7 == 1 and i % 3)
    for other in results[1:]:
        assert results[0][1].equals(other[1])
        assert results[0][1].schema == other[1].schema


def test_the_reader_filter_keeps_exactly_the_live_rows_of_any_layout(tmp_path):
    """The ``"scan"`` kind's deletion filter (DuckDB calls it per vector with the vector's
    first position in its file, so vectors start wherever row groups do) against the bitmap,
    for random files: any row count, any row-group size (vectors starting off a 64-row
    bitmap word), deleted runs across word and group boundaries, whole groups, single rows,
    nothing, everything; several files in one read; a pushed-down filter on top. Counted,
    summed and listed with their virtual columns, compared with numpy."""
    _need_compiler("scan")
    import numpy as np
    import pyarrow.parquet as pq
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    con, slots = maskext.connect("scan")
    assert con is not None and slots.kind == "scan"
    made = [0]

    layout = st.tuples(st.integers(0, 6000), st.integers(1, 3000),
                       st.lists(st.tuples(st.integers(0, 6000), st.integers(1, 700)),
                                max_size=6),
                       st.sampled_from(["runs", "sparse", "none", "all"]), st.integers(0, 99))

    @settings(max_examples=30, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(layout, min_size=1, max_size=3))
    def check(files):
        paths, deads, bitmaps = [], [], []
        base = 0
        for rows, group, runs, mode, seed in files:
            made[0] += 1
            ids = np.arange(base, base + rows, dtype=np.int64)
            base += rows
            path = str(tmp_path / f"f{made[0]}.parquet")
            pq.write_table(pa.table({"id": ids}), path, row_group_size=group)
            dead = np.zeros(rows, dtype=bool)
            if mode == "all":
                dead[:] = True
            elif mode == "runs":
                for start, length in runs:
                    dead[start:start + length] = True
            elif mode == "sparse":
                rng = np.random.default_rng(seed)
                dead[rng.random(rows) < 0.01 * (1 + seed % 10)] = True
            paths.append(path)
            deads.append((ids, dead))
            bitmaps.append(maskext.bitmap_of(rows, np.flatnonzero(dead), []) if dead.any()
                           else (np.zeros(0, np.uint8), 0))
        slot = slots.acquire(("any-layout", made[0]), lambda: bitmaps)
        try:
            call = (f"__fsrv_scan([{', '.join(repr(p) for p in paths)}], "
                    f"fsrv_slot := {slot})")
            live = [(int(i), fi, int(i - ids[0]) if len(ids) else 0)
                    for fi, (ids, dead) in enumerate(deads) for i in ids[~dead]]
            got = con.execute(f"SELECT id, file_index, file_row_number FROM {call} "
                              "ORDER BY id").fetchall()
            assert got == live
            assert con.execute(f"SELECT count(*) FROM {call}").fetchone()[0] == len(live)
            want = sorted(i for i, _, _ in live if i % 7 == 3)
            assert [i for (i,) in con.execute(
                f"SELECT id FROM {call} WHERE id % 7 = 3 ORDER BY id").fetchall()] == want
        finally:
            slots.drop(slot)

    try:
        check()
    finally:
        con.close()
