"""Concurrent writers in separate processes, and crash injection at every protocol step."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.runtime import Runtime
from flightsrv.store import open_store
from flightsrv.store.faults import FaultPlan, FaultyStore
from flightsrv.table.manifest import version_of_key
from support import worker_processes

SCHEMA = pa.schema([("writer", pa.int64()), ("seq", pa.int64())])


def _append_worker(uri: str, writer: int, n: int, env: dict) -> int:
    os.environ.update(env)
    t = Warehouse.open(uri).table("t")
    for seq in range(n):
        t.append(pa.table({"writer": [writer], "seq": [seq]}, schema=SCHEMA))
    return n


def _eight_writers(backend, tmp_path, request, per_writer: int):
    uri = str(tmp_path / "wh") if backend == "local" else request.getfixturevalue("s3_uri")
    env = request.getfixturevalue("subprocess_env") if backend == "s3" else {}
    Warehouse.open(uri).create_table("t", SCHEMA)
    total = 8 * per_writer
    with worker_processes().Pool(8) as pool:
        done = pool.starmap(_append_worker, [(uri, w, per_writer, env) for w in range(8)])
    assert sum(done) == total
    t = Warehouse.open(uri).table("t")
    head = t.head()
    assert head.version == total  # create + one version per append, none lost, none doubled
    got = t.to_table()
    assert sorted(zip(got["writer"].to_pylist(), got["seq"].to_pylist())) == sorted(
        (w, s) for w in range(8) for s in range(per_writer))
    assert [v for v in t.log.versions()] == list(range(total + 1))


@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_eight_writer_processes_append(backend, tmp_path, request):
    # on S3 every conflict is several requests to one locked test server: 5 appends a
    # writer (40 racing commits) race as hard, at two thirds of the CPU
    _eight_writers(backend, tmp_path, request, per_writer=8 if backend == "local" else 5)


@pytest.mark.slow
@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_eight_writer_processes_append_many(backend, tmp_path, request):
    _eight_writers(backend, tmp_path, request, per_writer=25)


def _crash_worker(uri: str, env: dict, crash_at: int | None, crash_after: int | None) -> None:
    os.environ.update(env)
    plan = FaultPlan(key_pattern=r"^(?!_flightsrv_selfcheck)", crash_at=crash_at,
                     crash_after=crash_after)
    store = FaultyStore(open_store(uri), plan)
    wh = Warehouse(store, Runtime())
    t = wh.table("t")
    t.append(pa.table({"writer": [1, 2, 3], "seq": [10, 11, 12]}, schema=SCHEMA))
    t.delete("seq = 0")


def _referenced(t) -> set[str]:
    refs = set()
    for v in t.log.versions():
        m = t.log.load(v)
        refs |= m.referenced_keys()  # data files, DV objects and (format 2) manifest chunks
        for f in m.data_files:
            refs.add(f.path)
            if f.dv is not None and f.dv.storage == "object":
                refs.add(f.dv.path)
    return refs


@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_crash_at_every_step_leaves_a_consistent_table(backend, tmp_path, request):
    """A writer killed before or after each of its writes never corrupts the table."""
    env = request.getfixturevalue("subprocess_env") if backend == "s3" else {}
    ctx = worker_processes()
    # append: data file, manifest chunk, manifest root, pointer; delete (inline DV, kept in
    # the root's overlay): root, pointer = 6 writes
    for step in range(1, 7):
        for mode in ("before", "after"):
            uri = (str(tmp_path / f"wh{step}{mode}") if backend == "local"
                   else request.getfixturevalue("s3_uri") + f"-{step}{mode}")
            t = Warehouse.open(uri).create_table("t", SCHEMA)
            t.append(pa.table({"writer": [0, 0], "seq": [0, 1]}, schema=SCHEMA))
            p = ctx.Process(target=_crash_worker, args=(
                uri, env, step if mode == "before" else None, step if mode == "after" else None))
            p.start()
            p.join(120)
            assert p.exitcode in (98, 99), f"step {step} {mode}: exit {p.exitcode}"
            fresh = Warehouse.open(uri).table("t")
            got = sorted(fresh.to_table()["seq"].to_pylist())
            # the table is at some committed version, and its contents are that version's
            assert got in ([0, 1], [0, 1, 10, 11, 12], [1, 10, 11, 12]), (step, mode, got)
            versions = fresh.log.versions()
            assert versions == list(range(len(versions)))
            refs = _referenced(fresh)
            store = open_store(uri)
            leftovers = [m.key for m in store.list("t/")
                         if m.key[2:] not in refs and version_of_key(m.key) is None
                         and not m.key.endswith("_latest_manifest")]
            # orphans of the crashed commit (vacuum's): data files, DV objects, and the
            # manifest chunks written before a root that never landed
            assert all(k.startswith(("t/data/", "t/tombstone/", "t/chunks/"))
                       for k in leftovers), leftovers
            # and the table still takes writes
            fresh.append(pa.table({"writer": [9], "seq": [99]}, schema=SCHEMA))
            assert 99 in fresh.to_table()["seq"].to_pylist()
