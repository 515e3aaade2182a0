"""Maintenance: compaction (DV-aware, bin-packing, sorting, DV coalescing, carry-over of
concurrent deletes), snapshot expiry, vacuum (grace, dry run, uploads, uncommitted writers),
and table stats. Real stores only (local directory and moto S3 over HTTP)."""

from __future__ import annotations

import datetime as dt
import random
import time

import pyarrow as pa
import pytest
from support import Hook

from flightsrv import Warehouse
from flightsrv.errors import ConfigurationError, VersionNotFound
from flightsrv.runtime import IdSource, ManualClock, Runtime
from flightsrv.table.manifest import manifest_key
from flightsrv.cli.render import result_rows

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.int64()), ("tag", pa.string())])
HOUR_MS = 3_600_000


def rows(lo, hi):
    return pa.table({"id": list(range(lo, hi)), "grp": [(i * 7) % 5 for i in range(lo, hi)],
                     "tag": [f"t{i % 13}" for i in range(lo, hi)]}, schema=SCHEMA)


def live_runtime(seed=5) -> Runtime:
    """A manual clock that starts at the real time, so stores' last-modified times compare."""
    return Runtime(clock=ManualClock(int(time.time() * 1000)), ids=IdSource(random.Random(seed)),
                   rng=random.Random(seed))


def ids(t, **kw):
    return sorted(t.to_table(**kw)["id"].to_pylist())


def referenced(t) -> set[str]:
    """Data files, DV objects and (format 2) manifest chunks of every retained version."""
    out = set()
    for v in t.log.versions():
        m = t.log.load(v)
        for f in m.data_files:
            out.add(f.path)
            if f.dv is not None and f.dv.storage == "object":
                out.add(f.dv.path)
        if hasattr(m.data_files, "chunk_paths"):
            out |= m.data_files.chunk_paths()
    return out


def existing(t) -> set[str]:
    return {m.key for p in ("data/", "tombstone/", "chunks/") for m in t.store.list(p)}


@pytest.fixture
def rt():
    return live_runtime()


def make_table(uri, rt):
    t = Warehouse.open(uri, rt).create_table("t", SCHEMA, {"row_group_bytes": 8 * 1024})
    for i in range(4):
        t.append(rows(i * 2000, (i + 1) * 2000))
    return t


@pytest.fixture
def table(local_uri, rt):
    """Most behaviour is store-independent: the local store keeps the suite fast."""
    return make_table(local_uri, rt)


@pytest.fixture
def table_any(warehouse_uri, rt):
    """The same table on the local store and on S3 (moto) for the storage-sensitive paths."""
    return make_table(warehouse_uri, rt)


# -- compaction ----------------------------------------------------------------------


def test_compact_rewrites_delete_heavy_files_and_packs_small_ones(table):
    table.delete("id < 2000 AND id % 4 = 0")  # 25% of file 0
    table.delete("id >= 2000 AND id < 4000 AND id = 2001")  # 1 row of file 1
    before = ids(table)
    r = table.compact(small_file_threshold=1)  # only the delete-heavy rule applies
    assert r.files_rewritten == 1 and r.reasons and set(r.reasons.values()) == {"deletes"}
    assert r.deleted_rows_purged == 500
    assert ids(table) == before
    head = table.head()
    assert len(head.data_files) == 4 and head.operation == "compact"
    assert sum(1 for f in head.data_files if f.dv is not None) == 1  # file 1 keeps its DV

    r = table.compact()  # all files are small against the default target: one bin
    assert r.files_rewritten == 4 and r.files_added == 1 and r.groups_planned == 1
    assert ids(table) == before
    (only,) = table.head().data_files
    assert only.dv is None and only.rows == len(before) and not only.stats_wide
    assert table.compact().version is None  # nothing left to do: no commit


def test_compact_respects_target_size_and_property_threshold(table):
    table.set_properties(**{"compact.min_deleted_fraction": "0.5"})
    table.delete("id < 2000 AND id % 4 = 0")
    r = table.compact(small_file_threshold=1)
    assert r.version is None and r.files_rewritten == 0  # 25% is under the table's 50%
    size = max(f.size for f in table.head().data_files)
    r = table.compact(target_file_size=int(size * 2.2), small_file_threshold=size + 1)
    # bins of about two files each
    assert r.groups_planned == 2 and r.files_rewritten == 4
    assert ids(table) == sorted(set(range(8000)) - set(range(0, 2000, 4)))


def test_compact_sort_by_clusters_rows_and_keeps_contents(table):
    table.delete("id % 9 = 0")
    before = ids(table)
    r = table.compact(sort_by=["grp", "id"])
    assert r.files_rewritten == 4
    got = table.to_table()
    assert sorted(got["id"].to_pylist()) == before
    pairs = list(zip(got["grp"].to_pylist(), got["id"].to_pylist()))
    assert pairs == sorted(pairs)
    # statistics now prune: a grp equality touches a single file's range
    f = table.head().data_files[0]
    grp = table.head().column_stats(f, "grp")
    assert grp["min"] == 0 and grp["max"] == 4


def test_compact_dry_run_writes_nothing(table):
    table.delete("id % 3 = 0")
    keys, version = existing(table), table.head().version
    r = table.compact(dry_run=True)
    assert r.dry_run and r.files_rewritten == 4 and r.deleted_rows_purged == len(
        range(0, 8000, 3))
    assert existing(table) == keys and table.head().version == version


def test_compact_bad_input_is_a_clear_error(table):
    with pytest.raises(ConfigurationError, match="unknown sort column.*nope"):
        table.compact(sort_by=["nope"])
    with pytest.raises(ConfigurationError, match="min_deleted_fraction=2"):
        table.compact(min_deleted_fraction=2)
    with pytest.raises(ConfigurationError, match="target_file_size"):
        table.compact(target_file_size=0)


def test_compact_coalesces_dv_objects(local_uri, rt):
    t = Warehouse.open(local_uri, rt).create_table("t", SCHEMA)
    for i in range(3):
        t.append(rows(i * 20_000, (i + 1) * 20_000))
    # scattered positions give DVs too large to inline: one tombstone object per delete
    for i in range(3):
        t.delete(f"id >= {i * 20_000} AND id < {(i + 1) * 20_000} AND id % 3 = 0")
    head = t.head()
    assert len({f.dv.path for f in head.data_files if f.dv and f.dv.storage == "object"}) == 3
    before = ids(t)
    r = t.compact(min_deleted_fraction=0.5, small_file_threshold=1)  # rewrite nothing
    assert r.files_rewritten == 0 and r.dvs_coalesced == 3
    assert (r.dv_objects_before, r.dv_objects_after) == (3, 1)
    assert ids(t) == before


def test_concurrent_delete_is_carried_over(table_any):
    """Compaction reads v_R; a delete commits before compaction does: the delete's rows stay
    deleted in the rewritten files (mapped by write order), nothing else changes."""
    table_any.delete("id % 5 = 0")
    rival = Warehouse.open(table_any.warehouse.uri).table("t")
    hook = Hook(lambda: rival.delete("id % 7 = 0 OR id BETWEEN 100 AND 300"))
    r = table_any.compact(progress=hook)
    assert hook.fired and r.groups_committed == 1 and r.groups_aborted == 0
    want = [i for i in range(8000) if i % 5 and i % 7 and not 100 <= i <= 300]
    assert r.deletes_carried_over == sum(1 for i in range(8000) if i % 5 and (
        i % 7 == 0 or 100 <= i <= 300))
    assert ids(table_any) == want
    assert table_any.count_rows() == len(want)
    assert Warehouse.open(table_any.warehouse.uri).table("t").count_rows() == len(want)


def test_concurrent_delete_carried_over_into_sorted_output(table):
    rival = Warehouse.open(table.warehouse.uri).table("t")
    hook = Hook(lambda: rival.delete("tag = 't3'"))
    r = table.compact(sort_by=["tag"], progress=hook)
    assert r.deletes_carried_over == sum(1 for i in range(8000) if i % 13 == 3)
    assert ids(table) == [i for i in range(8000) if i % 13 != 3]
    assert "t3" not in table.to_table()["tag"].to_pylist()


def test_concurrent_large_dv_carried_over_as_object(local_uri, rt):
    t = Warehouse.open(local_uri, rt).create_table("t", SCHEMA)
    t.append(rows(0, 30_000))
    t.append(rows(30_000, 31_000))
    rival = Warehouse.open(local_uri).table("t")
    hook = Hook(lambda: rival.delete("id % 3 = 1"))
    r = t.compact(progress=hook)
    assert r.deletes_carried_over == len(range(1, 31_000, 3))
    (out,) = t.head().data_files
    assert out.dv is not None and out.dv.storage == "object" and out.stats_wide
    assert ids(t) == [i for i in range(31_000) if i % 3 != 1]


def test_concurrent_whole_file_delete_is_carried_over(table):
    """A delete that removes every row of an input while compaction runs drops that file
    from the head, and says so (``files_emptied``): compaction commits anyway, the file's
    rows deleted in its output, instead of aborting the group (under steady single-row
    updates every group lost a file that way, and compaction never committed)."""
    size = max(f.size for f in table.head().data_files)
    first = table.head().data_files[0].path
    rival = Warehouse.open(table.warehouse.uri).table("t")
    hook = Hook(lambda: rival.delete("id < 2000 OR id = 5000"))  # file 0 entirely
    r = table.compact(target_file_size=int(size * 2.2), small_file_threshold=size + 1,
                      progress=hook)
    assert hook.fired
    emptied = [table.log.load(v).summary.get("files_emptied")
               for v in range(table.head().version + 1)]
    assert [e for e in emptied if e] == [[first]]
    assert r.groups_planned == 2 and r.groups_aborted == 0 and r.groups_committed == 2
    assert r.deletes_carried_over == 2001
    want = [i for i in range(2000, 8000) if i != 5000]
    assert ids(table) == want
    assert Warehouse.open(table.warehouse.uri).table("t").count_rows() == len(want)
    table.compact()
    assert ids(table) == want


def test_concurrent_rewrite_of_an_input_aborts_only_that_group(table):
    """An input another compaction rewrote (its rows moved to a new file, listed as emptied
    by nobody) aborts the group that read it: carrying it over would keep its rows twice
    (or write an erased row's bytes again, for a splice); the other group commits."""
    size = max(f.size for f in table.head().data_files)
    first = table.head().data_files[0].path
    rival = Warehouse.open(table.warehouse.uri).table("t")

    def rewrite_first():
        rival.delete("id = 1")
        rival.compact(min_deleted_fraction=0.0, small_file_threshold=1)

    hook = Hook(rewrite_first)
    r = table.compact(target_file_size=int(size * 2.2), small_file_threshold=size + 1,
                      progress=hook)
    assert hook.fired
    assert first not in {f.path for f in table.head().data_files}
    assert r.groups_aborted >= 1
    assert ids(table) == [i for i in range(8000) if i != 1]


def test_append_during_compaction_survives(table):
    rival = Warehouse.open(table.warehouse.uri).table("t")
    hook = Hook(lambda: rival.append(rows(50_000, 50_010)))
    table.compact(progress=hook)
    assert ids(table) == list(range(8000)) + list(range(50_000, 50_010))
    assert len(table.head().data_files) == 2  # the output plus the untouched new file


def test_optimize_alias(table):
    table.delete("id % 2 = 0")
    assert table.optimize().files_rewritten == 4
    assert ids(table) == list(range(1, 8000, 2))


# -- expiry ----------------------------------------------------------------------------


def test_expire_retain_last_and_time_travel_error(table_any):
    table_any.delete("id < 10")
    head = table_any.head().version  # 0 create, 1-4 appends, 5 delete
    r = table_any.expire_snapshots(retain_last=2)
    assert r.expired_versions == list(range(head - 1)) and r.oldest_retained == head - 1
    assert table_any.log.versions() == [head - 1, head]
    assert ids(table_any, version=head - 1) == list(range(8000))
    with pytest.raises(VersionNotFound) as info:
        table_any.snapshot(version=1)
    assert f"oldest_retained={head - 1}" in str(info.value)
    # another process (no cache) sees the same
    other = Warehouse.open(table_any.warehouse.uri).table("t")
    with pytest.raises(VersionNotFound, match=f"oldest_retained={head - 1}"):
        other.to_table(version=0)
    assert ids(other) == list(range(10, 8000))


def test_expire_older_than_keeps_young_versions(table, rt):
    rt.clock.advance(10 * HOUR_MS)
    cut = rt.clock.now()
    table.delete("id = 1")
    table.delete("id = 2")
    r = table.expire_snapshots(older_than=cut, retain_last=1)
    v = table.head().version
    assert table.log.versions() == [v - 1, v] and r.oldest_retained == v - 1
    r = table.expire_snapshots(older_than=dt.timedelta(hours=100), retain_last=1)
    assert r.expired_versions == []  # nothing is 100 hours old
    assert table.expire_snapshots(retain_last=1).expired_versions == [v - 1]
    assert table.log.versions() == [v]


def test_expire_never_drops_head_or_pointer_target(table):
    with pytest.raises(ConfigurationError, match="retain_last"):
        table.expire_snapshots(retain_last=0)
    # a lagging pointer (writer died before moving it) is moved before anything is deleted
    _, etag = table.log.read_pointer()
    from flightsrv.store.base import PutMode
    from flightsrv.table.manifest import POINTER_KEY, Pointer
    head = table.head()
    table.store.put(POINTER_KEY, Pointer(1, head.table_uuid, "lagging").to_json(),
                    mode=PutMode.IF_MATCH, etag=etag)
    table.expire_snapshots(retain_last=1)
    assert table.log.read_pointer()[0].version == head.version
    fresh = Warehouse.open(table.warehouse.uri).table("t")
    assert fresh.head().version == head.version and ids(fresh) == list(range(8000))


def test_expire_dry_run_deletes_nothing(table):
    before = table.log.versions()
    r = table.expire_snapshots(retain_last=1, dry_run=True)
    assert r.expired_versions == before[:-1] and table.log.versions() == before


# -- vacuum ----------------------------------------------------------------------------


def test_vacuum_removes_only_unreferenced_old_objects(table_any, rt):
    table_any.delete("id % 2 = 0")
    table_any.compact()
    table_any.expire_snapshots(retain_last=1)
    orphans = existing(table_any) - referenced(table_any)
    # the compacted inputs, and the manifest chunks only expired versions referenced
    assert len({k for k in orphans if k.startswith("data/")}) == 4
    assert table_any.vacuum().deleted_objects == 0  # default grace: 7 days
    rt.clock.advance(HOUR_MS)
    dry = table_any.vacuum(grace=dt.timedelta(minutes=30), dry_run=True)
    assert {o["key"] for o in dry.objects} == orphans and existing(table_any) >= orphans
    assert all(o["size"] > 0 for o in dry.objects) and result_rows(dry)[0]["would_delete"]
    r = table_any.vacuum(grace=dt.timedelta(minutes=30))
    assert r.deleted_objects == len(orphans)
    assert r.deleted_bytes == sum(o["size"] for o in dry.objects)
    assert existing(table_any) == referenced(table_any)
    assert ids(table_any) == list(range(1, 8000, 2))


def test_sql_vacuum_retain_versions_dry_run_reports_what_the_real_run_deletes(tmp_path):
    """``VACUUM t RETAIN n VERSIONS ... DRY RUN`` expired nothing (right) and then vacuumed
    as if every version were still retained, so it reported no object, while the real run
    deleted the compacted inputs and the chunks only the expired versions referenced."""
    import json

    from test_cli import run as cli

    wh = tmp_path / "wh"
    for sql in ["CREATE TABLE s AS SELECT i AS id FROM range(10) t(i)",
                "INSERT INTO s VALUES (10)", "OPTIMIZE s",
                "ALTER TABLE s SET (vacuum.allow_short_grace = true)"]:
        proc = cli("--warehouse", wh, "sql", sql)
        assert proc.returncode == 0, proc.stderr

    def report(sql):
        proc = cli("--warehouse", wh, "sql", sql, "--format", "jsonl")
        assert proc.returncode == 0, proc.stderr
        return {(r["operation"], r["metric"]): r["value"]
                for r in map(json.loads, proc.stdout.splitlines())}

    files = {p for p in (wh / "s").rglob("*") if p.is_file()}
    dry = report("VACUUM s RETAIN 1 VERSIONS RETAIN 0 HOURS DRY RUN")
    assert {p for p in (wh / "s").rglob("*") if p.is_file()} == files  # nothing changed
    done = report("VACUUM s RETAIN 1 VERSIONS RETAIN 0 HOURS")
    assert dry[("expire", "expired_versions")] == done[("expire", "expired_versions")]
    assert int(done[("vacuum", "deleted_objects")]) > 0
    for metric in ["deleted_objects", "deleted_bytes", "oldest_retained",
                   "referenced_objects"]:
        assert dry[("vacuum", metric)] == done[("vacuum", metric)], metric
    keys = sorted(o["key"] for o in json.loads(done[("vacuum", "objects")]))
    assert sorted(o["key"] for o in json.loads(dry[("vacuum", "objects")])) == keys


def test_vacuum_keeps_history_of_retained_versions(table, rt):
    table.delete("id % 2 = 0")
    table.compact()
    rt.clock.advance(HOUR_MS)
    assert table.vacuum(grace=0).deleted_objects == 0  # v0..v6 still retained
    assert ids(table, version=4) == list(range(8000))


def test_vacuum_with_uncommitted_writer(table_any, rt):
    """A writer uploaded files but has not committed: vacuum inside the grace period keeps
    them and the commit succeeds and reads back; past the grace period they would go."""
    files, _, _ = table_any.write_files(rows(90_000, 90_100))
    rt.clock.advance(10 * 60_000)  # 10 minutes between upload and commit
    r = table_any.vacuum(grace=dt.timedelta(hours=1))
    assert r.deleted_objects == 0 and r.kept_young == 1
    table_any.commit_files(files)
    assert ids(table_any)[-100:] == list(range(90_000, 90_100))
    # the grace period is what protects it: an older uncommitted upload is removed
    late, _, _ = table_any.write_files(rows(95_000, 95_001))
    rt.clock.advance(2 * HOUR_MS)
    r = table_any.vacuum(grace=dt.timedelta(hours=1))
    assert [o["key"] for o in r.objects] == [late[0].path]


def test_vacuum_aborts_stale_multipart_uploads(table_any, rt):
    upload = table_any.store.create_multipart("data/2020/01/01/00/abandoned.parquet")
    if table_any.store.local_path("x") is not None:
        # moto lists every upload as initiated on 2010-11-10 (a fixed string in its
        # response template), so the "young upload is kept" half only runs locally
        assert table_any.vacuum(grace=dt.timedelta(hours=1)).uploads == []
    rt.clock.advance(2 * HOUR_MS)
    r = table_any.vacuum(grace=dt.timedelta(hours=1))
    assert [u["upload_id"] for u in r.uploads] == [upload]
    assert list(table_any.store.list_multipart("")) == []


def test_vacuum_bad_grace(table):
    with pytest.raises(ConfigurationError, match="grace"):
        table.vacuum(grace=-1)
    with pytest.raises(ConfigurationError, match="grace"):
        table.vacuum(grace="soon")


# -- stats -----------------------------------------------------------------------------


def test_stats_and_recommendation(table, rt):
    s = table.stats()
    assert (s.files, s.total_rows, s.live_rows, s.deleted_fraction) == (4, 8000, 8000, 0.0)
    assert s.version_count == 5 and s.oldest_retained_version == 0
    assert s.recommendation == "compact"  # four small files
    table.delete("id % 4 = 0")
    s = table.stats()
    assert s.deleted_rows == 2000 and s.deleted_fraction == 0.25 and s.dv_count == 4
    assert any("25%" in r["reason"] or "10%" in r["reason"] for r in s.reasons)
    table.compact()
    table.expire_snapshots(retain_last=1)
    s = table.stats()
    # the 4 compacted inputs and the manifest chunks only expired versions referenced
    assert s.orphan_objects == len(existing(table) - referenced(table)) >= 4
    assert s.orphan_bytes > 0 and s.recommendation == "vacuum"
    rt.clock.advance(HOUR_MS)
    table.vacuum(grace=0)
    s = table.stats()
    assert (s.recommendation, s.orphan_objects, s.files, s.dv_count) == ("nothing", 0, 1, 0)
    d = s.to_dict()
    assert d["live_rows"] == 6000 and {r["metric"] for r in result_rows(s)} >= {"orphan_bytes"}


def test_manifest_keys_left_alone_by_vacuum(table, rt):
    rt.clock.advance(HOUR_MS)
    table.vacuum(grace=0)
    assert all(table.log.try_load(v) is not None for v in range(5))
    assert table.store.head(manifest_key(0)).size > 0
