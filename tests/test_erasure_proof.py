"""Erasure you can prove (issue 16): completeness from any state, verification by re-reading,
keyed fingerprints instead of request text, certificates, deadlines, and the CLI sequence
from the issue run through the real ``flightsrv`` executable."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

from flightsrv import Warehouse
from flightsrv.errors import (
    ConfigurationError,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
    VersionNotFound,
)
from flightsrv.runtime import IdSource, ManualClock, Runtime
from flightsrv.store.base import PutMode
from flightsrv.store.faults import FaultPlan, FaultyStore
from flightsrv.table import certificate, erase
from flightsrv.table import fingerprint as fpr
from flightsrv.table.manifest import manifest_key
from flightsrv.table.writer import DataFileWriter, WriteOptions
from flightsrv.cli.render import result_rows
from support import run_cli

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
SECRET = "zz-alice@example.org"  # sorts last: it is the string column's max


def people(lo, hi, secret_at=None):
    return pa.table({"id": list(range(lo, hi)),
                     "name": [SECRET if i == secret_at else f"n{i}" for i in range(lo, hi)]},
                    schema=SCHEMA)


def runtime(seed=1):
    """A deterministic runtime whose clock starts at the real time, so the store's modification
    times (real) and the table's clock agree about object ages."""
    import random
    import time

    return Runtime(clock=ManualClock(int(time.time() * 1000)), ids=IdSource(random.Random(seed)),
                   rng=random.Random(seed))


def make(uri, seed=1, props=None):
    wh = Warehouse.open(uri, runtime(seed))
    t = wh.create_table("people", SCHEMA, {"compression": "none", **(props or {})})
    for k in range(4):
        t.append(people(k * 1000, (k + 1) * 1000, secret_at=777))
    return t


def stored_bytes(store) -> dict[str, bytes]:
    return {m.key: store.get(m.key)[0] for m in store.list("")}


def holders(store, needle: str) -> list[str]:
    """Every stored object (the warehouse root down) whose raw bytes or decoded Parquet
    contents hold ``needle``."""
    out = []
    for key, raw in stored_bytes(store).items():
        if needle.encode() in raw:
            out.append(key)
        elif key.endswith(".parquet"):
            t = pq.read_table(pa.BufferReader(raw))
            if any(needle in str(v) for c in t.columns for v in c.to_pylist()):
                out.append(key)
    return out


# -- the issue's CLI sequence, through the real executable --------------------------------


def _cli(wh: pathlib.Path, *args) -> subprocess.CompletedProcess:
    """``flightsrv --warehouse WH ARGS`` in its own process (``support.run_cli``: forked from
    a launcher that imported the CLI, or the real executable with FLIGHTSRV_TEST_CLI=exec)."""
    argv = ["--warehouse", str(wh), *args]
    p = run_cli(argv, timeout=120)
    if p is None:
        exe = shutil.which("flightsrv")
        assert exe, "the flightsrv executable is not installed (pip install -e .)"
        p = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120,
                           check=False)
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("purge_first", [True, False], ids=["purge-then-expire", "expire"])
def test_cli_sequence_from_the_issue(tmp_path, purge_first):
    wh = tmp_path / "wh"
    _cli(wh, "table", "create", "people", "--schema", "id:int64,name:string")
    for k in range(4):  # 4 files of 1,000 rows
        pq.write_table(pa.table({"id": list(range(k * 1000, (k + 1) * 1000)),
                                 "name": [f"n{i}" for i in range(k * 1000, (k + 1) * 1000)]}),
                       tmp_path / f"f{k}.parquet")
        _cli(wh, "table", "append", "people", str(tmp_path / f"f{k}.parquet"))
    _cli(wh, "table", "delete", "people", "--where", "name = 'n777'")
    if purge_first:
        out = _cli(wh, "table", "purge", "people").stdout
        assert "old versions still hold bytes" in out and "erased (" not in out
    out = _cli(wh, "table", "purge", "people", "--expire").stdout
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert "erased (verified:" in total and "0 matches" in total, out
    # what the issue found after "erased": versions 0-6 and the old file. Now: only the head
    assert sorted(os.listdir(wh / "people" / "manifest")) == ["v00000000000000000006.json"]
    for path in (wh / "people").rglob("*"):
        if path.suffix == ".parquet":
            assert "n777" not in pq.read_table(path)["name"].to_pylist(), path
        elif path.is_file():
            assert b"n777" not in path.read_bytes(), path
    store = Warehouse.open(str(wh)).table("people").store
    assert holders(store, "n777") == []
    # idempotent: again, nothing to do, verified again, no new certificate
    again = _cli(wh, "table", "purge", "people", "--expire").stdout
    assert "erased (verified:" in again
    listed = _cli(wh, "table", "erasures", "people", "--json").stdout.splitlines()
    certs = [json.loads(x) for x in listed]
    assert certs[-1]["status"] == "erased" and certs[-1]["source"] == "cli"
    assert certs[-1]["verification"]["matches"] == 0
    assert len(certs) == (2 if purge_first else 1)
    status = _cli(wh, "table", "erasure-status", "people").stdout
    assert "no deleted rows are stored" in status and "0 overdue" in status


# -- completeness from any state ---------------------------------------------------------


def test_purge_expire_from_the_state_the_issue_left(local_uri):
    t = make(local_uri)
    t.delete("id = 777")
    first = t.purge()
    assert first.status == "pending" and not first.complete and first.retained_versions
    second = t.purge(expire=True)
    assert second.version is None and second.complete, second.verification
    assert second.expired_versions == list(range(first.version))
    assert t.log.versions() == [first.version]
    assert holders(t.warehouse.store, SECRET) == []
    assert t.count_rows() == 3999


def test_metadata_only_delete_at_the_head_is_redacted(local_uri):
    """A delete that dropped a whole file leaves nothing to purge, but its manifest (the head)
    holds the request text and older versions reach the file: a clean head is committed."""
    t = make(local_uri)
    t.delete("id >= 0 AND id < 1000 AND name <> 'x'")  # drops the first file: metadata only
    head = t.head()
    assert "predicate" not in head.summary and not any(f.dv for f in head.data_files)
    # a head written by an older flightsrv, which kept the request text in the summary
    head = t.commit(lambda h: dataclasses.replace(
        h, operation="delete", summary={**h.summary, "predicate": f"name = '{SECRET}'"}))
    r = t.purge(expire=True)
    assert r.complete and r.redacted_version == head.version + 1
    assert t.head().operation == "redact" and t.log.versions() == [head.version + 1]
    assert holders(t.warehouse.store, SECRET) == []
    assert holders(t.warehouse.store, "name <> ") == []


def _empty_a_file_by_dv_delete(local_uri, props=None):
    """A table whose head's chunks keep, behind the root's overlay, the entry of a file a
    plain DV delete emptied (min/max = the deleted value; for an inlined file, its rows)."""
    wh = Warehouse.open(local_uri, runtime(3))
    t = wh.create_table("people", SCHEMA, {"compression": "none", **(props or {})})
    t.append(people(0, 10))
    t.append(pa.table({"id": [99], "name": [SECRET]}, schema=SCHEMA))
    t.delete(f"name = '{SECRET}'")  # removes the whole file: an overlay "removed" entry
    t.append(people(10, 20))  # any later commit: the overlay (and its chunk) stays
    assert t.head().format_version >= 2
    assert holders(t.warehouse.store, SECRET)
    return t


@pytest.mark.parametrize("props", [{}, {"inline.max_rows": "1000"}], ids=["file", "inlined"])
def test_a_file_a_dv_delete_emptied_is_erased_in_one_run(local_uri, props):
    """The head's chunk kept the emptied file's entry (statistics, or the inlined rows):
    the first PURGE ... EXPIRE said pending, the second erased with the bytes still there."""
    t = _empty_a_file_by_dv_delete(local_uri, props)
    assert [i["kind"] for i in t.erasure_status().items] == ["retained"]
    r = t.purge(expire=True, grace=0)
    assert r.complete and r.verification.matches == 0, r.verification
    assert r.redacted_version == t.head().version and t.head().operation == "redact"
    assert holders(t.warehouse.store, SECRET) == []
    assert t.erasure_status().items == []
    assert sorted(t.to_table()["id"].to_pylist()) == list(range(20))
    assert t.purge(expire=True, grace=0).complete  # again: only re-verifies


def test_an_entry_only_the_head_chunk_keeps_is_seen_and_erased(local_uri):
    """Older versions expired and vacuumed first: no version references the emptied file,
    its object is gone, and only the head's chunk holds the deleted value. Erasure status,
    verification and completion must all see it, whatever this run erased."""
    t = _empty_a_file_by_dv_delete(local_uri)
    t.expire_snapshots(retain_last=1)
    t.runtime.clock.advance(60_000)  # the store's times are real; the table's clock manual
    assert t.vacuum(grace=dt.timedelta(0)).objects
    assert len(t.log.versions()) == 1 and holders(t.warehouse.store, SECRET)
    (item,) = t.erasure_status().items
    assert item["kind"] == "retained" and item["remedy"].startswith("PURGE people EXPIRE")
    plain = t.purge()  # no expire: verified, and the entry is a match
    assert plain.status == "pending" and plain.verification.matches >= 1
    assert any(m.get("hidden") for m in plain.verification.manifests)
    r = t.purge(expire=True, grace=0)
    assert r.complete, r.verification
    assert holders(t.warehouse.store, SECRET) == []
    assert t.erasure_status().items == []


def test_a_statement_kind_is_not_request_text(local_uri):
    """A SQL DELETE records ``"statement": "delete"`` (its kind): no redact version for it,
    and a redact version that is committed is named in the CLI's total row."""
    t = make(local_uri)
    assert t.warehouse.sql("DELETE FROM people WHERE id = 5") == 1  # 1 of 1,000 rows
    assert t.head().summary.get("statement") == "delete"
    t.purge()
    assert t.warehouse.sql(  # a MERGE that only inserts: nothing for a purge to do
        "MERGE INTO people USING (SELECT 5000 AS id, 'n5000' AS name) s ON people.id = s.id "
        "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.name)") == 1
    head = t.head()
    assert head.summary.get("statement") == "merge"
    r = t.purge(expire=True, grace=0)  # nothing to purge: the head stays
    assert r.complete and r.redacted_version is None, r.verification
    assert t.head().version == head.version and t.head().operation != "redact"
    # a head that does hold request text is redacted, and the total row says so
    t.commit(lambda h: dataclasses.replace(
        h, operation="delete", summary={**h.summary, "statement": f"DELETE ... '{SECRET}'"}))
    r = t.purge(expire=True, grace=0)
    assert r.complete and r.redacted_version == t.head().version
    total = result_rows(r)[-1]
    assert total["kind"] == "total" and f"redact version {r.redacted_version}" in total["object"]


def test_stale_bounds_leave_the_manifests(local_uri):
    t = make(local_uri)
    def st(m, f, col):
        return m.column_stats(f, col)

    head = t.head()
    f = next(f for f in head.data_files if st(head, f, "id")["min"] == 0)
    assert st(head, f, "name")["max"] == SECRET  # the erased value is a manifest bound
    t.delete("id = 777")
    head = t.head()
    assert st(head, head.files_by_path()[f.path], "name")["max"] == SECRET  # DV keeps it
    r = t.purge(expire=True)
    assert r.complete
    head = t.head()
    new = next(x for x in head.data_files if st(head, x, "id")["min"] == 0)
    assert st(head, new, "name")["max"] != SECRET and not new.stats_wide
    raw = t.store.get(manifest_key(t.head().version))[0]
    assert SECRET.encode() not in raw
    # nor in any manifest chunk still stored (format 2 keeps file statistics there)
    for meta in t.store.list("chunks/"):
        assert SECRET.encode() not in t.store.get(meta.key)[0], meta.key


def test_failed_runs_then_purge_expire_converges(local_uri):
    """Purges that fail at every possible write leave the table consistent; a later
    purge(expire=True) reaches the erased state, and only then says so."""
    t = make(local_uri)
    t.delete("id = 777")
    t.delete("id % 100 = 3")
    want = sorted(t.to_table(columns=["id"])["id"].to_pylist())
    for n in range(1, 12):
        store = FaultyStore(t.warehouse.store, FaultPlan(seed=n, fail_before_p=0.0))
        fails = {"n": 0}

        def hook(op, key, n=n, fails=fails):
            fails["n"] += 1
            if fails["n"] == n:
                raise StoreError("injected", op=op, key=key)

        store.plan.before_write = hook
        wh = Warehouse(store, runtime(100 + n))
        try:
            r = wh.table("people").purge(expire=True, grace=0)
        except StoreError:
            pass
        else:
            assert r.complete  # a run that returned normally says only what it verified
        assert sorted(t.to_table(columns=["id"])["id"].to_pylist()) == want
    r = t.purge(expire=True, grace=0)
    assert r.complete, r.verification.pending
    assert holders(t.warehouse.store, SECRET) == []
    assert sorted(t.to_table(columns=["id"])["id"].to_pylist()) == want


def test_young_orphan_is_reported_not_called_erased(local_uri):
    """A failed compaction's output holding the row is unreferenced and young: it may be a write
    in flight, so the erasure leaves it and says "pending"; with grace 0 it goes."""
    t = make(local_uri)
    snap = t.snapshot()
    w = DataFileWriter(t.store, snap.schema, t.runtime, WriteOptions(), snap.version + 1)
    (orphan,) = w.write(people(0, 1000, secret_at=777).to_batches())  # never committed
    t.delete("id = 777")
    r = t.purge(expire=True)
    assert r.status == "pending" and not r.complete
    assert [p["object"] for p in r.verification.pending] == [orphan.path]
    assert t.store.head(orphan.path)
    cert = t.erasures()[-1]
    assert cert["status"] == "pending" and cert["verification"]["pending"][0]["object"] == \
        orphan.path
    r = t.purge(expire=True, grace=0)
    assert r.complete and orphan.path in r.deleted_objects
    assert holders(t.warehouse.store, SECRET) == []


def test_rows_deleted_after_the_purge_planned_keep_it_pending(local_uri):
    t = make(local_uri)
    t.delete("id = 777")
    inner = t.warehouse.store
    fired = []

    def hook(op, key):  # a DV delete lands just before the purge's commit
        if "manifest/v" in key and not fired:
            fired.append(key)
            Warehouse(inner, runtime(9)).table("people").delete("id = 3500")

    racer = Warehouse(FaultyStore(inner, FaultPlan(before_write=hook)), runtime(8))
    r = racer.table("people").purge(expire=True, grace=0)
    assert fired and r.status == "pending"
    assert any("deleted after this purge planned" in p["reason"] for p in r.verification.pending)
    assert t.purge(expire=True, grace=0).complete


def test_unknown_prefix_is_not_checked_so_not_erased(local_uri):
    t = make(local_uri)
    t.delete("id = 777")
    t.store.put("_other_engine/00000000000000000000.json", b"{}")
    r = t.purge(expire=True, grace=0)
    assert r.status == "pending"
    assert any(p["object"].startswith("_other_engine/") for p in r.verification.pending)


def test_mirror_naming_an_erased_file_is_a_match(local_uri):
    """Mirror prefixes are known (docs/INTEROP.md §7): a Delta commit that adds an erased
    file (with its statistics) is a match, not an unknown object."""
    import json

    t = make(local_uri)
    t.delete("id = 777")
    victim = next(f for f in t.head().data_files if f.dv is not None)
    add = {"add": {"path": victim.path, "partitionValues": {}, "size": victim.size,
                   "modificationTime": 0, "dataChange": True}}
    t.store.put("_delta_log/00000000000000000000.json", json.dumps(add).encode())
    r = t.purge()  # no expire: nothing is swept, the verification reports what it read
    assert r.status == "pending"
    hits = [m for m in r.verification.mirrors if m["matches"]]
    assert [m["key"] for m in hits] == ["_delta_log/00000000000000000000.json"]
    assert hits[0]["references"] == [victim.path]
    assert not [p for p in r.verification.pending if p["object"].startswith("_delta_log/")]
    # with expire, expiry republishes the mirror from flightsrv's versions (the foreign
    # commit is not ours: the log starts over) and the erasure completes
    r = t.purge(expire=True, grace=0)
    assert r.status == "erased", r.verification.pending
    assert not [m for m in r.verification.mirrors if m["matches"]]


def test_concurrent_reader_pinned_to_an_old_version(local_uri):
    """A reader that pinned a version before the erasure expired it gets its rows or
    ObjectNotFound, never rows of another version (docs/ERASURE.md)."""
    t = make(local_uri)
    t.delete("id = 777")
    old = t.snapshot()
    want = sorted(old.to_table(columns=["id"])["id"].to_pylist())
    got: dict = {}
    started = threading.Event()

    def read():
        started.set()
        try:
            got["ids"] = sorted(old.to_table(columns=["id"])["id"].to_pylist())
        except ObjectNotFound as exc:
            got["error"] = exc

    th = threading.Thread(target=read)
    th.start()
    started.wait()
    r = t.purge(expire=True, grace=0)
    th.join()
    assert r.complete
    assert got.get("ids") == want or isinstance(got.get("error"), ObjectNotFound)
    with pytest.raises(ObjectNotFound):  # after the erasure the pinned files are gone
        old.to_table(columns=["id"])
    with pytest.raises(VersionNotFound):
        t.snapshot(version=old.version)


# -- fingerprints -------------------------------------------------------------------------


def test_fingerprint_matches_equal_requests_and_hides_the_value(local_uri):
    wh = Warehouse.open(local_uri, runtime(3))
    a = fpr.fingerprint(wh, f"name = '{SECRET}'")
    assert fpr.is_fingerprint(a) and SECRET not in a
    assert fpr.fingerprint(wh, f"NAME='{SECRET}'") == a  # canonical text
    assert fpr.fingerprint(wh, f"name = '{SECRET.upper()}'") != a  # literals exact
    assert fpr.fingerprint(wh, "name = 'bob'") != a
    wh2 = Warehouse.open(local_uri + "2", runtime(3))
    wh2.erasure_key = b"k" * 32
    other = fpr.fingerprint(wh2, f"name = '{SECRET}'")
    assert other != a and other.split(":")[1] != a.split(":")[1]  # the key id shows it


def test_warehouse_key_is_created_once_under_a_race(warehouse_uri, monkeypatch):
    monkeypatch.delenv(fpr.ENV_KEY, raising=False)
    monkeypatch.delenv(fpr.ENV_KEY_FILE, raising=False)
    base = Warehouse.open(warehouse_uri, runtime(4)).store
    results, barrier = [], threading.Barrier(6)

    def create(i):
        wh = Warehouse(base, runtime(40 + i))
        barrier.wait()
        results.append(fpr.key_for(wh))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len({k.secret for k in results}) == 1 and results[0].source == "warehouse"
    raw = base.get(fpr.KEY_OBJECT)[0]
    assert json.loads(raw)["key_id"] == results[0].key_id
    assert repr(results[0]).count(results[0].secret.hex()) == 0  # never printed


def test_environment_key_wins_and_no_key_object_is_written(local_uri, monkeypatch):
    monkeypatch.setenv(fpr.ENV_KEY, "ab" * 32)
    t = make(local_uri)
    t.delete("id = 777", mode="splice")
    with pytest.raises(ObjectNotFound):
        t.warehouse.store.head(fpr.KEY_OBJECT)
    key = fpr.key_for(t.warehouse)
    assert key.source == "env" and key.secret == bytes.fromhex("ab" * 32)
    assert t.head().summary["request_fingerprint"].split(":")[1] == key.key_id
    monkeypatch.setenv(fpr.ENV_KEY, "short")
    with pytest.raises(ConfigurationError):
        fpr.key_for(t.warehouse)


def test_erasure_writes_no_literal_anywhere(warehouse_uri):
    """Manifests, certificates and data written by erasures hold none of the request's
    literal values, and after the erasure no stored object does."""
    t = make(warehouse_uri)
    before = set(stored_bytes(t.warehouse.store))
    n = t.delete(f"name = '{SECRET}' OR name = 'n3001'", mode="splice", expire=True, grace=0)
    assert n == 2 and n.result.complete
    written = set(stored_bytes(t.warehouse.store)) - before
    assert any(k.startswith("people/_erasures/") for k in written)
    assert any(k.startswith("people/manifest/") for k in written)
    for needle in (SECRET, "n3001", "alice"):
        assert holders(t.warehouse.store, needle) == [], needle
    cert = t.erasures()[-1]
    assert cert["request_fingerprint"] == fpr.fingerprint(
        t.warehouse, f"name = '{SECRET}' OR name = 'n3001'")
    assert cert["rows_removed"] == 2 and cert["operation"] == "splice_delete"


# -- certificates -------------------------------------------------------------------------


def test_certificate_records_the_erasure(local_uri):
    t = make(local_uri)
    t.delete("id = 777")  # the request being purged later
    fp_delete = fpr.fingerprint(t.warehouse, "id = 777")
    r = t.purge(expire=True, grace=0)
    assert r.complete and r.certificate and r.certificate.startswith("_erasures/")
    cert = certificate.read(t, r.certificate[len("_erasures/"):-len(".json")])
    assert cert == t.erasures()[-1]
    assert cert["table"] == "people" and cert["operation"] == "purge"
    assert cert["covers"] == [fp_delete]  # the delete whose row this purge removed
    assert cert["versions"]["committed"] == r.version and cert["versions"]["after"] == r.version
    assert cert["versions"]["expired"] == list(range(r.version))
    assert cert["rows_removed"] == 1 and len(cert["objects_rewritten"]) == 1
    old = cert["objects_rewritten"][0]["old"]
    assert old in cert["objects_deleted"] and old in cert["verification"]["erased_absent"]
    ver = cert["verification"]
    assert ver["matches"] == 0 and ver["pending"] == [] and cert["status"] == "erased"
    assert [m["key"] for m in ver["manifests"]] == [manifest_key(r.version)]
    assert all(m["matches"] == 0 for m in ver["manifests"])
    assert cert["started_at_ms"] <= cert["committed_at_ms"] <= cert["verified_at_ms"]
    # written once: a second create of the same id is refused by the store
    with pytest.raises(PreconditionFailed):
        certificate.write(t, cert)
    # vacuum and expiry never touch certificates
    t.expire_snapshots(retain_last=1)
    t.vacuum(grace=dt.timedelta(0))
    assert [c["id"] for c in t.erasures()] == [cert["id"]]


def test_an_unreadable_certificate_is_listed_not_fatal(tmp_path):
    """A certificate overwritten with ``[1,2]`` made SHOW ERASURES and ``table erasures``
    fail as a whole (INTERNAL): the others are listed, the bad one is a row marked
    unreadable that names its key."""
    wh_path = tmp_path / "wh"
    t = make(str(wh_path))
    t.delete("id = 777")
    good = t.purge(certificate=True).certificate
    bad = t.purge(certificate=True).certificate
    t.store.put(bad, b"[1,2]", mode=PutMode.OVERWRITE)
    certs = t.erasures()
    assert [c["status"] for c in certs] == ["pending", "unreadable"]
    assert certs[0]["id"] in good and certs[1]["key"] == bad
    assert bad in certs[1]["error"] and "does not parse" in certs[1]["error"]
    rows = t.warehouse.sql("SHOW ERASURES people").to_pylist()
    assert [(r["status"], r["operation"]) for r in rows] == [
        ("pending", "purge"), ("unreadable", "unknown")]
    assert json.loads(rows[1]["certificate"])["key"] == bad
    p = _cli(wh_path, "table", "erasures", "people")
    assert "unreadable" in p.stdout and "pending" in p.stdout
    assert f"people/{bad}" in p.stderr and "does not parse" in p.stderr
    listed = _cli(wh_path, "table", "erasures", "people", "--json").stdout.splitlines()
    assert [json.loads(x)["status"] for x in listed] == ["pending", "unreadable"]


def test_no_op_erasure_writes_no_certificate_unless_asked(local_uri):
    t = make(local_uri)
    assert t.purge(expire=True).certificate is None  # nothing to do, nothing changed
    r = t.purge(expire=True, certificate=True)
    assert r.complete and r.certificate and t.erasures()[-1]["rows_removed"] == 0


# -- splice_positions ---------------------------------------------------------------------


def test_splice_positions_contract(local_uri):
    wh = Warehouse.open(local_uri, runtime(5))
    t = wh.create_table("people", SCHEMA, {"compression": "none", "row_group_bytes": 1024})
    t.append(people(0, 6000))
    t.append(people(6000, 7000))
    t.delete("id = 1025")  # dead row in the group the plan touches: erased too
    snap = t.snapshot()
    f = snap.manifest.data_files[0]
    assert f.row_groups >= 4 and f.row_group_offsets[1] == 1024
    t.delete("id = 5000")  # deleted after the plan's snapshot: carried over as a DV
    with pytest.raises(ConfigurationError):
        erase.splice_positions(t, snap, {"data/nope.parquet": BitMap64([1])})
    with pytest.raises(ConfigurationError):
        erase.splice_positions(t, snap, {f.path: BitMap64([f.rows])})
    r = erase.splice_positions(t, snap, {f.path: BitMap64([1024, 1026])})
    assert r.rows_deleted == 2 and r.rows_removed == 3  # 1024, 1026 and the dead 1025
    nf = t.head().data_files[0]
    assert nf.rows == 5997 and nf.dv.cardinality == 1  # 5000 carried as a DV
    ids = t.to_table(columns=["id"])["id"].to_pylist()
    assert {1024, 1025, 1026, 5000} & set(ids) == set() and len(ids) == 6996
    # a plan on a snapshot whose file was rewritten since: StalePlan, nothing written
    listed = {m.key for m in t.store.list("data/")}
    with pytest.raises(erase.StalePlan):
        erase.splice_positions(t, snap, {f.path: BitMap64([5])})
    assert {m.key for m in t.store.list("data/")} == listed
    # erase_positions re-plans on a new snapshot
    calls = []

    def find(s):
        calls.append(s.version)
        g = next(x for x in s.manifest.data_files
                 if s.manifest.column_stats(x, "id")["min"] == 6000)
        return {g.path: BitMap64([7])}

    r = erase.erase_positions(t, find, fingerprint="hmac-sha256:" + "0" * 16 + ":" + "0" * 64)
    assert r.rows_deleted == 1 and 6007 not in t.to_table(columns=["id"])["id"].to_pylist()
    assert t.head().summary["request_fingerprint"].startswith("hmac-sha256:")


def test_splice_positions_refuses_positions_that_are_not_rows(local_uri):
    """A position of 2**63 or more wrapped to a negative int64 and passed the past-the-end
    check ("row group out of range ... group=-1"); a negative one raised OverflowError."""
    wh = Warehouse.open(local_uri, runtime(6))
    t = wh.create_table("people", SCHEMA, {"compression": "none"})
    t.append(people(0, 100))
    snap = t.snapshot()
    f = snap.manifest.data_files[0]
    for bad in ([5, 2**63], [2**64 - 1], BitMap64([2**63 + 1]), [100]):
        with pytest.raises(ConfigurationError, match="row past the end of the file") as e:
            erase.splice_positions(t, snap, {f.path: bad})
        assert e.value.context["object"] == f.path and e.value.context["table"] == "people"
        assert e.value.context["position"] == max(bad)
    for bad in ([-1], [3, -5], ["7"]):
        with pytest.raises(ConfigurationError, match="not a row number") as e:
            erase.splice_positions(t, snap, {f.path: bad})
        assert e.value.context["object"] == f.path
        assert e.value.context["position"] == next(x for x in bad if not isinstance(x, int)
                                                   or x < 0)
    assert t.head().version == snap.version and t.count_rows() == 100
    assert [m.key for m in t.store.list("data/")] == [f.path]


def test_work_that_committed_is_not_reported_failed_over_an_unreadable_old_version(tmp_path):
    """An old (not head) manifest that does not parse: compact, OPTIMIZE, a splice delete
    and PURGE committed, then failed with CorruptObject from their post-commit report (exit
    1 in the CLI), inviting a duplicate retry. The work is reported done; what could not be
    read is a warning (compaction: erasures_overdue unknown) or a pending item (erasure)."""
    wh_path = tmp_path / "wh"
    t = Warehouse.open(str(wh_path)).create_table("t", SCHEMA)
    for k in range(3):
        t.append(people(k * 10, k * 10 + 10))
    t.store.put(manifest_key(1), b'{"bad', mode=PutMode.OVERWRITE)
    t = Warehouse.open(str(wh_path)).table("t")  # no cached copy of version 1
    r = t.compact(min_deleted_fraction=0.5)
    assert r.version == 4 and r.erasures_overdue is None
    (w,) = r.warnings
    assert "manifest does not parse" in w and "t/manifest/v00000000000000000001.json" in w
    rows = {x["metric"]: x["value"] for x in result_rows(r)}
    assert rows["erasures past deadline"] == "unknown (see warning)" and rows["warning"] == w
    # SQL OPTIMIZE: the same result, as rows
    for k in range(3):
        t.append(people(100 + k, 101 + k))
    out = {x["metric"]: x["value"] for x in t.warehouse.sql("OPTIMIZE t").to_pylist()}
    assert out["version"] == "8" and "manifest does not parse" in out["warnings"]
    # a splice delete commits; its completion is pending, naming the object
    n = t.delete("id = 5", mode="splice", expire=True, grace=0)
    assert n == 1 and n.result.version == t.head().version and n.result.status == "pending"
    pending = {p["object"]: p for p in n.result.verification.pending}
    assert "does not parse" in pending["manifest/v00000000000000000001.json"]["reason"]
    assert 5 not in t.to_table()["id"].to_pylist()
    assert t.log.versions()[0] == 0  # nothing was expired past an unreadable version
    t.delete("id = 6")
    p = t.purge(expire=True)
    assert p.version == t.head().version and p.status == "pending"
    # the CLI: exit 0, the warning on its rows
    for k in range(2):
        t.append(people(200 + k, 201 + k))
    proc = _cli(wh_path, "table", "compact", "t")
    assert "unknown (see warning)" in proc.stdout and "does not parse" in proc.stdout
    assert t.head().operation == "compact"


# -- deadlines ----------------------------------------------------------------------------


def test_erasure_status_ages_and_deadlines(local_uri):
    t = make(local_uri, props={"erasure.deadline": "7d"})
    t.delete("id = 777")
    st = t.erasure_status()
    (item,) = st.items
    assert item["kind"] == "dv" and item["rows"] == 1 and not item["overdue"]
    assert item["remedy"] == "PURGE people"
    t.runtime.clock.advance(8 * 86_400_000)
    assert [i["kind"] for i in t.erasure_status().overdue] == ["dv"]
    # VACUUM and OPTIMIZE report it
    vac = t.vacuum(grace=dt.timedelta(days=30))
    assert [o["kind"] for o in vac.erasures_overdue] == ["dv"]
    assert any(r.get("kind") == "erasures past deadline" for r in result_rows(vac))
    opt = t.compact(min_deleted_fraction=0.5)  # nothing to rewrite; still reports
    assert opt.erasures_overdue and any(r["metric"] == "erasures past deadline"
                                        for r in result_rows(opt))
    # a purge without expire: the bytes move to retained versions
    t.purge()
    kinds = {i["kind"] for i in t.erasure_status().items}
    assert kinds == {"retained"}
    assert t.purge(expire=True, grace=0).complete
    assert t.erasure_status().items == []
    assert t.vacuum(grace=dt.timedelta(days=30)).erasures_overdue == []


def test_a_row_deleted_after_a_compaction_is_listed_in_the_files_compacted(local_uri):
    """Insert, compact, then delete: the compaction's input files (retained by the older
    versions) keep a copy of the deleted row. erasure-status listed only the head file;
    every file that holds the row's bytes must be listed, and PURGE ... EXPIRE clears all."""
    t = make(local_uri, props={"erasure.deadline": "1d"})
    inputs = {f.path for f in t.head().data_files}
    t.compact(min_deleted_fraction=0.0, target_file_size=1 << 30)
    assert not inputs & {f.path for f in t.head().data_files}
    assert t.erasure_status().items == []  # nothing deleted yet: a compaction only moves
    t.delete("id = 777")
    st = t.erasure_status()
    stored = {k.split("/", 1)[1] for k in holders(t.warehouse.store, SECRET)
              if k.startswith("people/data/")}  # the data files holding the row
    assert len(stored) >= 2  # the head file and a compacted input
    listed = {i["object"] for i in st.items}
    assert stored <= listed, stored - listed
    retained = [i for i in st.items if i["kind"] == "retained"]
    assert {i["object"] for i in retained} == inputs
    assert all(i["rows"] is None and "PURGE people EXPIRE" in i["remedy"] for i in retained)
    t.runtime.clock.advance(2 * 86_400_000)
    assert {i["object"] for i in t.erasure_status().overdue} == listed
    assert t.purge(expire=True, grace=0).complete
    assert t.erasure_status().items == [] and holders(t.warehouse.store, SECRET) == []


def test_expired_manifest_leaves_an_unreferenced_object(local_uri):
    t = make(local_uri)
    t.delete("id = 777")
    old = {f.path for f in t.head().data_files}
    t.compact(min_deleted_fraction=0.0)
    t.expire_snapshots(retain_last=1)  # no vacuum: the old files are unreferenced but stored
    st = t.erasure_status()
    assert {i["object"] for i in st.items} == old
    assert {i["kind"] for i in st.items} == {"unreferenced"}
    assert st.items[0]["rows"] is None and "VACUUM" in st.items[0]["remedy"]
    assert t.purge(expire=True, grace=0).complete
    assert holders(t.warehouse.store, SECRET) == []


def test_bad_deadline_property_is_a_clear_error(local_uri):
    with pytest.raises(ConfigurationError, match="erasure.deadline"):
        make(local_uri, props={"erasure.deadline": "soon"})  # refused before anything is stored
    t = make(local_uri, props={"erasure.deadline": "12h"})
    assert t.erasure_status().deadline_ms == 12 * 3600 * 1000
    # weeks, as every duration docs/CLI.md describes; a bare number is days
    for value, ms in (("2w", 14 * 86_400_000), ("3", 3 * 86_400_000)):
        t.set_properties(**{"erasure.deadline": value})
        assert t.erasure_status().deadline_ms == ms


# -- SQL ----------------------------------------------------------------------------------


def test_purge_expire_and_show_erasures_through_flight_sql(tmp_path):
    import warnings

    from adbc_driver_flightsql import dbapi

    from flightsrv.engine.duck import DuckEngine
    from flightsrv.server import start_in_thread

    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("p", SCHEMA, {"compression": "none"})
    t.append(people(0, 1000, secret_at=5))
    engine = DuckEngine(wh)
    server, port = start_in_thread(engine)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(f"grpc://127.0.0.1:{port}")
        with conn, conn.cursor() as cur:
            cur.execute(f"DELETE FROM p WHERE name = '{SECRET}'")
            cur.execute("PURGE p EXPIRE")
            rep = {r["metric"]: r["value"] for r in cur.fetch_arrow_table().to_pylist()}
            assert rep["status"] == "erased" and rep["certificate"].startswith("_erasures/")
            cur.execute("SHOW ERASURES p")
            rows = cur.fetch_arrow_table().to_pylist()
            assert len(rows) == 1 and rows[0]["status"] == "erased"
            assert rows[0]["operation"] == "purge" and rows[0]["matches"] == 0
            assert json.loads(rows[0]["certificate"])["source"] == "sql"
            cur.execute("SELECT count(*) AS n FROM flightsrv_erasures('p') WHERE rows_removed = 1")
            assert cur.fetch_arrow_table().to_pylist() == [{"n": 1}]
    finally:
        server.shutdown()
        engine.close()
    assert holders(wh.store, SECRET) == []


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
