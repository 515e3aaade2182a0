"""Issue 14: every retained flightsrv version readable as Delta Lake and as Iceberg v3, DVs
included, by the real readers (deltalake's DV-aware ``scan()``, pyiceberg ``StaticTable``),
local and on S3 (moto). DuckDB 1.5.5's ``delta_scan`` / ``iceberg_scan``, and every kind of
commit, are in the reader matrix (tests/test_interop_matrix.py).

The table (``flightsrv.testing.interop.scenario``): appends, inline and object DV deletes,
metadata-only deletes (whole row groups, a whole file), a splice, a compaction, then an
expiry; a publish midway and one at the end, so both the first and incremental publishes
are read.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading

import fastavro
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import ConfigurationError, SqlError
from flightsrv.table.deletes import decode_blob
from flightsrv.table.mirror import publisher as mirror_publish
from flightsrv.table.mirror.dvs import un_z85
from flightsrv.testing.interop import (
    canonical,
    delta_rows,
    iceberg_rows,
    scenario,
)


def _location(t) -> str:
    return f"{t.warehouse.uri.rstrip('/')}/{t.name}"


def _reader_path(t) -> str:
    """The Delta table path a reader opens: a plain path locally, the s3:// URI on S3."""
    loc = _location(t)
    return loc.removeprefix("file://")


def _assert_all_versions(t, result) -> list[int]:
    versions = t.log.versions()
    for v in versions:
        want = canonical(t.to_table(version=v))
        assert canonical(delta_rows(_reader_path(t), v)) == want, f"delta version {v}"
        assert canonical(iceberg_rows(result.locations["iceberg"], v)) == want, \
            f"iceberg snapshot of version {v}"
    return versions


@pytest.fixture
def published(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t = scenario(wh)
    result = t.publish("all")
    return wh, t, result


def test_every_version_readable_in_both_formats(published):
    wh, t, result = published
    versions = _assert_all_versions(t, result)
    assert versions == list(range(11))
    # both mirrors hold exactly the retained versions
    assert result.mirror_versions == {"delta": (0, 10), "iceberg": (0, 10)}
    # publishing again writes nothing new
    again = t.publish("all")
    assert again.published == {"delta": [], "iceberg": []}


def test_expiry_removes_versions_from_mirrors(published):
    wh, t, result = published
    exp = t.expire_snapshots(retain_last=4)
    assert exp.expired_versions == list(range(7))
    assert set(exp.mirrors) == {"delta", "iceberg"}
    latest = t.publish("all")
    assert latest.mirror_versions == {"delta": (7, 10), "iceberg": (7, 10)}
    assert _assert_all_versions(t, latest) == [7, 8, 9, 10]
    with pytest.raises(Exception):
        delta_rows(_reader_path(t), 6)
    from pyiceberg.table import StaticTable

    from flightsrv.testing.interop import iceberg_properties

    st = StaticTable.from_metadata(latest.locations["iceberg"],
                                   properties=iceberg_properties(latest.locations["iceberg"]))
    assert sorted(s.snapshot_id for s in st.metadata.snapshots) == [8, 9, 10, 11]
    # vacuum deletes mirror objects only expired versions used, and the mirrors still read
    gone = t.vacuum(grace=0)
    kinds = {o["kind"] for o in gone.objects}
    assert "metadata" in kinds  # manifests and lists of expired snapshots
    assert _assert_all_versions(t, latest) == [7, 8, 9, 10]


def test_delta_descriptors_point_at_our_dv_bytes(local_uri):
    t = scenario(Warehouse.open(local_uri), publish_midway=False)
    t.publish("delta")
    store = t.store
    found = {"p": 0, "i": 0, "own": 0}
    for v in range(11):
        raw, _ = store.get(f"_delta_log/{v:020d}.json")
        for line in raw.decode().splitlines():
            add = json.loads(line).get("add")
            if not add or "deletionVector" not in add:
                continue
            dv = add["deletionVector"]
            f = t.log.load(v).files_by_path()[add["path"]]
            if dv["storageType"] == "p" and "/tombstone/" in dv["pathOrInlineDv"]:
                # our object, our offset, Delta's size = our framed length - 8
                assert dv["pathOrInlineDv"].endswith(f.dv.path)
                assert (dv["offset"], dv["sizeInBytes"]) == (f.dv.offset, f.dv.length - 8)
                found["p"] += 1
            elif dv["storageType"] == "i":
                blob = base64.b64decode(f.dv.data) if not f.deleted_row_groups else None
                payload = un_z85(dv["pathOrInlineDv"])[:dv["sizeInBytes"]]
                if blob is not None:
                    assert payload == blob[4:-4]  # magic + bitmap, no length, no CRC
                found["i"] += 1
            else:
                assert "/_delta_dv/" in dv["pathOrInlineDv"]  # a union with row groups
                found["own"] += 1
            assert dv["cardinality"] == f.deleted_rows
    assert found["p"] and found["i"] and found["own"], found


def test_iceberg_puffin_holds_our_blobs(local_uri):
    t = scenario(Warehouse.open(local_uri), publish_midway=False)
    result = t.publish("iceberg")
    meta = json.loads(open(result.locations["iceberg"][len("file://"):]).read())
    assert meta["format-version"] == 3
    assert [s["snapshot-id"] for s in meta["snapshots"]] == [v + 1 for v in range(11)]
    snap = next(s for s in meta["snapshots"] if s["summary"]["flightsrv.version"] == "5")
    head5 = t.log.load(5)
    lst = list(fastavro.reader(open(snap["manifest-list"][len("file://"):], "rb")))
    checked = 0
    for mf in lst:
        if mf["content"] != 1:
            continue
        for e in fastavro.reader(open(mf["manifest_path"][len("file://"):], "rb")):
            df = e["data_file"]
            assert df["file_format"] == "PUFFIN"
            path = df["referenced_data_file"].split("/t/", 1)[1]
            f = head5.files_by_path()[path]
            with open(df["file_path"][len("file://"):], "rb") as fh:
                fh.seek(df["content_offset"])
                blob = fh.read(df["content_size_in_bytes"])
            assert len(decode_blob(blob, where="test")) == f.dv.cardinality == \
                df["record_count"]
            if f.dv.storage == "object":
                raw, _ = t.store.get(f.dv.path)
                assert blob == raw[f.dv.offset:f.dv.offset + f.dv.length]
            checked += 1
    assert checked == 3


def test_delta_reader_rejects_flipped_crc(local_uri):
    """The Delta reader verifies the bytes we point it at: flip our DV's CRC and it fails."""
    t = scenario(Warehouse.open(local_uri), publish_midway=False)
    t.publish("delta")
    v = 5
    f = next(f for f in t.log.load(v).data_files if f.dv and f.dv.storage == "object")
    assert len(delta_rows(_reader_path(t), v)) == t.count_rows(version=v)
    path = t.store.local_path(f.dv.path)
    with open(path, "r+b") as fh:
        fh.seek(f.dv.offset + f.dv.length - 1)
        last = fh.read(1)
        fh.seek(f.dv.offset + f.dv.length - 1)
        fh.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(Exception) as info:
        delta_rows(_reader_path(t), v)
    assert "crc" in str(info.value).lower() or "checksum" in str(info.value).lower()


def test_publish_formats_property_publishes_every_commit(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    wh.sql("CREATE TABLE p (id BIGINT, s VARCHAR)")
    t = wh.table("p")
    t.set_properties(**{"publish.formats": "delta, iceberg"})
    assert t.properties["publish.formats"] == "delta,iceberg"
    wh.sql("INSERT INTO p SELECT i, 's' || i FROM range(100) t(i)")
    wh.sql("DELETE FROM p WHERE id % 10 = 0")
    assert mirror_publish.wait_idle(60)
    head = t.head().version
    res = t.publish("all")  # nothing left to do: the hook already published the head
    assert res.published == {"delta": [], "iceberg": []}
    assert res.mirror_versions["delta"][1] == res.mirror_versions["iceberg"][1] == head
    assert _assert_all_versions(t, res)


def test_publish_failure_never_fails_the_commit(local_uri, caplog):
    wh = Warehouse.open(local_uri)
    t = wh.create_table("u", pa.schema([("id", pa.int64()), ("h", pa.uint64())]),
                        properties={"publish.formats": "all"})
    m = t.append(pa.table({"id": [1, 2], "h": pa.array([1, 2**63], pa.uint64())}))
    assert mirror_publish.wait_idle(60)
    assert m is not None and t.count_rows() == 2  # committed; the mirror refused uint64
    assert any("publish after commit failed" in r.message for r in caplog.records)
    with pytest.raises(ConfigurationError, match="column=h"):
        t.publish("iceberg")


def test_unknown_format_property_is_refused(local_uri):
    wh = Warehouse.open(local_uri)
    t = wh.create_table("q", pa.schema([("id", pa.int64())]))
    with pytest.raises(ConfigurationError, match="publish.formats"):
        t.set_properties(**{"publish.formats": "orc"})


def test_racing_publishers_leave_a_valid_mirror(warehouse_uri):
    """Four publishers, each with its own warehouse handle, race on one table."""
    t0 = scenario(Warehouse.open(warehouse_uri), publish_midway=False)
    errors = []

    def run():
        try:
            Warehouse.open(warehouse_uri).table("t").publish("all")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    result = t0.publish("all")
    assert result.published == {"delta": [], "iceberg": []}
    _assert_all_versions(t0, result)


def test_a_publisher_behind_the_mirror_leaves_it_whole(local_uri, monkeypatch):
    """A publisher that read the head before another publisher got further finds the
    mirror ahead of its head: the mirror is up to date for it. It dropped the Delta log and
    rewrote it up to its older head (readers met a log without version 0, and versions the
    other published meanwhile went missing for good) and moved Iceberg's current snapshot
    back (found in session 29 by a publish loop beside writers)."""
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", pa.schema([("id", pa.int64())]))
    for k in range(4):
        t.append(pa.table({"id": pa.array([k], pa.int64())}))
    stale = t.log.load(2)  # what the slow publisher read as the head
    first = t.publish("all")  # the other publisher: up to version 4
    assert first.published["delta"] == [0, 1, 2, 3, 4]
    delta_before = sorted(m.key for m in t.store.list("_delta_log/"))
    monkeypatch.setattr(type(t.log), "head", lambda self: stale)
    result = t.publish("all")
    monkeypatch.undo()
    assert result.reset == [] and result.published == {"delta": [], "iceberg": []}
    assert sorted(m.key for m in t.store.list("_delta_log/")) == delta_before
    assert result.mirror_versions == {"delta": (0, 4), "iceberg": (0, 4)}
    _assert_all_versions(t, first)


def test_sql_publish_statement(local_uri):
    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE s (id BIGINT)")
    wh.sql("INSERT INTO s VALUES (1), (2), (3)")
    out = wh.sql("PUBLISH s FORMAT delta")
    rows = {r["metric"]: r["value"] for r in out.to_pylist()}
    assert json.loads(rows["published"]) == {"delta": [0, 1]}
    out = wh.sql("PUBLISH s")
    rows = {r["metric"]: r["value"] for r in out.to_pylist()}
    assert json.loads(rows["published"]) == {"delta": [], "iceberg": [0, 1]}
    with pytest.raises(SqlError, match="PUBLISH t \\[FORMAT delta\\|iceberg\\|all\\]"):
        wh.sql("PUBLISH s FORMAT orc")


def test_purge_with_expire_leaves_no_erased_rows_in_mirrors(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t = scenario(wh, properties={"publish.formats": "all"})
    assert mirror_publish.wait_idle(60)
    t.delete("grp = 3")
    assert mirror_publish.wait_idle(60)
    res = t.purge(expire=True, grace=0)
    assert mirror_publish.wait_idle(60)
    assert res.status == "erased", res.verification.pending
    assert res.verification.mirrors, "the verification read the mirror objects"
    assert not [p for p in res.verification.pending if "prefix" in p["reason"]]
    final = t.publish("all")
    _assert_all_versions(t, final)
    # no mirror object makes a reader read a replaced file
    erased = {o.key for o in res.objects if o.kind != "dv"}
    for meta in t.store.list(""):
        if mirror_publish.is_mirror_key(meta.key):
            assert not (mirror_publish.object_refs(t, meta.key) & erased), meta.key


def test_types_map_to_both_formats(local_uri):
    import datetime as dt
    import decimal

    wh = Warehouse.open(local_uri)
    schema = pa.schema([
        ("id", pa.int64()), ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()),
        ("f32", pa.float32()), ("dec", pa.decimal128(12, 3)), ("bin", pa.binary()),
        ("ts", pa.timestamp("us")), ("lst", pa.list_(pa.int32())),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("mp", pa.map_(pa.string(), pa.int64()))])
    t = wh.create_table("ty", schema)
    rows = pa.table({
        "id": [1, 2, 3], "i8": [1, -2, 3], "i16": [300, 2, -3], "i32": [7, 8, 9],
        "f32": [1.5, 2.5, None], "dec": [decimal.Decimal("1.250"), None,
                                         decimal.Decimal("-3.001")],
        "bin": [b"a", b"", None], "ts": [dt.datetime(2026, 1, 1, 12), None,
                                         dt.datetime(1999, 12, 31)],
        "lst": [[1, 2], [], None], "st": [{"a": 1, "b": "x"}, None, {"a": 3, "b": None}],
        "mp": [[("k", 1)], None, []]}, schema=schema)
    t.append(rows)
    t.delete("id = 2")
    result = t.publish("all")
    want = canonical(t.to_table())
    got_delta = canonical(delta_rows(_reader_path(t), t.head().version))
    got_ice = canonical(iceberg_rows(result.locations["iceberg"], t.head().version))
    for got in (got_delta, got_ice):
        assert [r["id"] for r in got] == [1, 3]
        for g, w in zip(got, want):
            for k in w:
                gv, wv = g[k], w[k]
                if k == "mp":
                    gv, wv = dict(gv or []), dict(wv or [])
                assert gv == wv, (k, gv, wv)


def test_drop_removes_mirrors_and_a_new_incarnation_starts_over(local_uri):
    wh = Warehouse.open(local_uri)
    t = wh.create_table("d", pa.schema([("id", pa.int64())]),
                        properties={"publish.formats": "all"})
    t.append(pa.table({"id": [1, 2, 3]}))
    assert mirror_publish.wait_idle(60)
    assert set(mirror_publish.mirrors_present(t)) == {"delta", "iceberg"}
    wh.drop_table("d")
    assert mirror_publish.wait_idle(60)
    assert mirror_publish.mirrors_present(t) == []  # a dropped table has no mirrors
    t2 = wh.create_table("d", pa.schema([("id", pa.int64()), ("x", pa.string())]))
    t2.append(pa.table({"id": [7], "x": ["a"]}))
    res = t2.publish("all")
    first = t2.head().version - 1  # the CREATE of the new incarnation
    assert res.mirror_versions == {"delta": (first, first + 1), "iceberg": (first, first + 1)}
    for v in (first, first + 1):
        want = canonical(t2.to_table(version=v)) if v > first else []
        assert canonical(delta_rows(_reader_path(t2), v)) == want
        assert canonical(iceberg_rows(res.locations["iceberg"], v)) == want
    with pytest.raises(Exception):
        delta_rows(_reader_path(t2), first - 1)  # the old incarnation is not published


def test_a_retained_versions_unsupported_type_is_named_with_its_version(local_uri):
    """A column created as type null (CTAS of NULL) and given a type later: the head maps,
    a retained version does not; the refusal names that version and the way past it (it
    named the type the column no longer has, and no version: session 29)."""
    from flightsrv.table.mirror.types import UnsupportedForMirror

    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE nn AS SELECT 1::BIGINT AS id, NULL AS x")
    wh.sql("ALTER TABLE nn ALTER COLUMN x TYPE INTEGER")
    with pytest.raises(UnsupportedForMirror, match="retained version 0") as ei:
        wh.table("nn").publish("iceberg")
    assert ei.value.context["version"] == 0 and ei.value.context["column"] == "x"
    assert mirror_publish.mirrors_present(wh.table("nn")) == []


def test_create_or_replace_removes_the_replaced_tables_mirrors(local_uri):
    """CREATE OR REPLACE of a table that published mirrors: the replaced rows leave them
    (they stayed readable as the Delta and Iceberg heads until someone ran PUBLISH: session
    29); a new table that publishes starts its mirrors over, one that does not has none."""
    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE r (id BIGINT, secret VARCHAR)")
    wh.sql("ALTER TABLE r SET (publish.formats = 'all')")
    wh.sql("INSERT INTO r VALUES (1, 'old-secret')")
    assert mirror_publish.wait_idle(60)
    t = wh.table("r")
    assert set(mirror_publish.mirrors_present(t)) == {"delta", "iceberg"}
    wh.sql("CREATE OR REPLACE TABLE r (id BIGINT)")
    assert mirror_publish.wait_idle(60)
    assert mirror_publish.mirrors_present(t) == []
    wh.sql("CREATE OR REPLACE TABLE r (id BIGINT, v VARCHAR)")
    wh.sql("ALTER TABLE r SET (publish.formats = 'delta')")
    wh.sql("INSERT INTO r VALUES (2, 'new')")
    assert mirror_publish.wait_idle(60)
    assert mirror_publish.mirrors_present(t) == ["delta"]
    head = t.head().version
    assert canonical(delta_rows(_reader_path(t), head)) == [{"id": 2, "v": "new"}]


@pytest.mark.parametrize("typ,values", [
    (pa.timestamp("ns"), [dt.datetime(2026, 1, 1, 3), None]),
    (pa.timestamp("ns", tz="UTC"), [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), None]),
    (pa.time64("us"), [dt.time(1, 2, 3), None]),
    (pa.binary(4), [b"abcd", None]),
])
def test_iceberg_only_types(local_uri, typ, values):
    """Iceberg v3 has nanosecond timestamps, time and fixed; Delta refuses them by name."""
    from flightsrv.table.mirror.types import UnsupportedForMirror

    t = Warehouse.open(local_uri).create_table("o", pa.schema([("id", pa.int64()),
                                                               ("v", typ)]))
    t.append(pa.table({"id": [1, 2], "v": pa.array(values, typ)}))
    res = t.publish("iceberg")
    assert canonical(iceberg_rows(res.locations["iceberg"], t.head().version)) == \
        canonical(t.to_table())
    with pytest.raises(UnsupportedForMirror, match="column=v"):
        t.publish("delta")
    assert mirror_publish.mirrors_present(t) == ["iceberg"]  # nothing written for Delta


def test_mirrors_follow_renames_and_drops(local_uri):
    """Format 2 schema changes in the mirrors: a renamed column is read from the files' own
    (physical) column name, a dropped column disappears, an added one reads NULL in old
    files, for every retained version, by deltalake and pyiceberg."""
    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE evolving (id BIGINT, a VARCHAR, b DOUBLE)")
    wh.sql("INSERT INTO evolving VALUES (1, 'x', 1.5), (2, 'y', 2.5)")
    wh.sql("ALTER TABLE evolving RENAME COLUMN a TO label")
    wh.sql("INSERT INTO evolving VALUES (3, 'z', 3.5)")
    wh.sql("ALTER TABLE evolving DROP COLUMN b")
    wh.sql("ALTER TABLE evolving ADD COLUMN c INTEGER")
    wh.sql("INSERT INTO evolving VALUES (4, 'w', 7)")
    wh.sql("DELETE FROM evolving WHERE id = 2")
    t = wh.table("evolving")._table if hasattr(wh.table("evolving"), "_table") \
        else wh.table("evolving")
    result = t.publish("all")
    _assert_all_versions(t, result)


def test_delta_features_continue_from_an_older_mirror(local_uri):
    """A Delta log published before flightsrv recorded the features it declares (no
    ``commitInfo.flightsrv.features``) declared ``columnMapping`` and ``deletionVectors`` from
    its first version; a later publish continues with them (a declared feature stays)."""
    from flightsrv.store.base import PutMode
    from flightsrv.table.mirror.delta import DeltaMirror, commit_key

    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE o (id BIGINT)")
    wh.sql("INSERT INTO o VALUES (1)")
    t = wh.table("o")
    t = getattr(t, "_table", t)
    t.publish("delta")
    dm = DeltaMirror(t)
    assert dm.declared(1) == set()  # nothing needed yet: protocol 1 / 2
    raw, _ = t.store.get(commit_key(1))
    actions = [json.loads(line) for line in raw.decode().splitlines()]
    for a in actions:
        a.get("commitInfo", {}).get("flightsrv", {}).pop("features", None)
    t.store.put(commit_key(1), "".join(json.dumps(a) + "\n" for a in actions).encode(),
                mode=PutMode.OVERWRITE)
    wh.sql("INSERT INTO o VALUES (2)")
    t.publish("delta")
    assert dm.declared(2) == {"columnMapping", "deletionVectors"}
    assert canonical(delta_rows(_reader_path(t), 2)) == canonical(t.to_table())


def test_dates_delta_cannot_spell_publish_without_their_bounds(local_uri):
    """DuckDB holds dates Delta's ``yyyy-MM-dd`` bounds cannot spell (``infinity``, years BC);
    both formats publish them, the rows read back the same, and Delta's statistics leave
    out only the bounds it cannot write (was: OverflowError from PUBLISH)."""
    wh = Warehouse.open(local_uri)
    wh.sql("CREATE TABLE d (id BIGINT, d DATE)")
    wh.sql("INSERT INTO d VALUES (1, DATE 'infinity'), (2, DATE '0044-03-15 (BC)'), "
           "(3, DATE '2020-01-01')")
    wh.sql("INSERT INTO d VALUES (4, DATE '2021-06-01'), (5, DATE '2021-01-01')")
    t = wh.table("d")
    result = t.publish("all")

    def days(table):  # Python's date cannot hold these; compare the day numbers
        return canonical(table.select(["id", "d"]).cast(
            pa.schema([("id", pa.int64()), ("d", pa.int32())])))

    for v in t.log.versions():
        want = days(t.to_table(version=v))
        assert days(delta_rows(_reader_path(t), v)) == want, v
        assert days(iceberg_rows(result.locations["iceberg"], v)) == want, v
    assert {r["id"]: r["d"] for r in want}[1] == 2**31 - 1
    stats = []
    for meta in t.store.list("_delta_log/"):
        if meta.key.endswith(".json"):
            for line in t.store.get(meta.key)[0].decode().splitlines():
                if '"add"' in line:
                    stats.append(json.loads(json.loads(line)["add"]["stats"]))
    by_rows = {s["numRecords"]: s for s in stats}
    assert "d" not in by_rows[3]["minValues"] and "d" not in by_rows[3]["maxValues"]
    assert by_rows[3]["minValues"]["id"] == 1
    assert by_rows[2]["minValues"]["d"] == "2021-01-01"
    assert by_rows[2]["maxValues"]["d"] == "2021-06-01"
