"""Automatic maintenance (docs/MAINTENANCE.md §Automatic maintenance): the policy, writers'
``maintain=True``, and the server's background worker through real clients (ADBC): it
compacts small commits, keeps every row and every delete (a delete racing the compaction,
injected by wrapping the store, stays deleted), does nothing when the table property is
off, shows its work in /metrics and SHOW HISTORY, and survives its own failures.

The worker is driven without sleeps: a long interval, and ``tick_now()`` +
``wait_ticks(1)`` (or, for the ``flightsrv serve`` process, a short interval and a wait on
a /metrics condition with a generous timeout)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
import warnings

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from prometheus_client.parser import text_string_to_metric_families

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.errors import StoreError
from flightsrv.server.app import start_in_thread
from flightsrv.server.config import ServerConfig
from flightsrv.server.metrics import MetricsHttpServer
from flightsrv.store.faults import FaultPlan, FaultyStore
from flightsrv.store.local import LocalStore
from flightsrv.table.maintenance.auto import AutoPolicy, CompactSmallFiles, due_tasks
from flightsrv.table.maintenance.scheduler import THREAD_NAME

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def batch(lo, n=10):
    return pa.table({"id": list(range(lo, lo + n)), "v": [f"r{i}" for i in range(lo, lo + n)]},
                    schema=SCHEMA)


def small_table(uri, commits, **props):
    t = Warehouse.open(uri).create_table("t", SCHEMA, properties=props or None)
    for i in range(commits):
        t.append(batch(i * 10))
    return t


# -- the policy and writers ------------------------------------------------------------


def test_policy_counts_small_files_against_the_threshold(local_uri):
    t = small_table(local_uri, 15)
    assert due_tasks(t, t.head()) == []  # 15 < 16 (the default)
    t.append(batch(150))
    ((task, reason),) = due_tasks(t, t.head())
    assert task.name == "compact_small_files" and "16 small files" in reason
    t.set_properties(auto_compact=False)
    assert due_tasks(t, t.head()) == []
    t.set_properties(auto_compact=True, **{"auto_compact.min_small_files": 17})
    assert due_tasks(t, t.head()) == []


def test_budget_takes_the_smallest_files_first(local_uri):
    t = small_table(local_uri, 4)
    t.append(pa.table({"id": list(range(1000, 3000)),
                       "v": [f"longer value {i}" * 3 for i in range(2000)]}, schema=SCHEMA))
    sizes = sorted(f.size for f in t.head().data_files)
    budget = sum(sizes[:4])  # the four 10-row files, not the big one
    t.set_properties(**{"auto_compact.min_small_files": 2, "auto_compact.max_bytes": budget})
    (out,) = t.maintain()
    assert out.files_rewritten == 4 and out.files_added == 1
    assert sorted(f.size for f in t.head().data_files)[-1] == sizes[-1]  # big one untouched
    assert sorted(t.to_table()["id"].to_pylist()) == list(range(40)) + list(range(1000, 3000))


def test_runs_are_size_tiered_so_a_merged_file_is_not_rewritten_by_every_run(local_uri):
    """A file earlier runs merged (still "small") waits while the newer small files add up
    to less than half its size; the newer ones merge among themselves (the old rule took
    every small file in every run, so a stream of tiny commits rewrote the growing merged
    file again and again)."""
    t = small_table(local_uri, 0)
    t.append(pa.table({"id": list(range(10_000, 30_000)),
                       "v": [f"an earlier run's merged rows {i}" for i in range(20_000)]},
                      schema=SCHEMA))
    (big,) = t.head().data_files
    for i in range(16):
        t.append(batch(i * 10))
    tiny = sum(f.size for f in t.head().data_files if f.path != big.path)
    assert big.size > 2 * tiny  # the premise: the merged file is a tier of its own
    (out,) = t.maintain()
    assert out.files_rewritten == 16 and out.files_added == 1
    assert big.path in {f.path for f in t.head().data_files} and len(t.head().data_files) == 2
    assert sorted(t.to_table()["id"].to_pylist()) == list(range(160)) + list(range(10_000,
                                                                                   30_000))


def test_tier_takes_files_of_about_one_size():
    from flightsrv.table.maintenance.auto import tier

    assert tier([100] * 16, 1 << 20) == [100] * 16
    assert tier([100] * 16 + [10_000], 1 << 20) == [100] * 16  # 10,000 > 2 x 1,600
    assert tier([100] * 16 + [3_000], 1 << 20) == [100] * 16 + [3_000]  # <= 2 x 1,600
    assert tier([100, 100, 100], 250) == [100, 100]  # the budget
    assert tier([5, 1_000], 1 << 20) == [5]  # one file: nothing to merge


def test_writer_maintain_true_compacts_at_the_threshold(local_uri):
    t = small_table(local_uri, 15)
    assert t.append(batch(150), maintain=False) is not None
    assert len(t.head().data_files) == 16  # off unless asked
    t.append(batch(160), maintain=True)
    head = t.head()
    assert len(head.data_files) == 1 and head.operation == "compact"
    assert head.summary["trigger"] == "auto" and head.summary["task"] == "compact_small_files"
    assert sorted(t.to_table()["id"].to_pylist()) == list(range(170))


def test_dv_coalescing_task(local_uri):
    t = Warehouse.open(local_uri).create_table("t", SCHEMA)
    for i in range(4):
        t.append(pa.table({"id": list(range(i * 4000, (i + 1) * 4000)),
                           "v": ["x"] * 4000}, schema=SCHEMA))
    for i in range(4):  # one DV object per delete (large enough not to be inlined)
        t.delete(f"id >= {i * 4000} AND id < {i * 4000 + 3000} AND id % 2 = 0")
    objects = {f.dv_object for f in t.head().data_files if f.dv_object}
    assert len(objects) == 4
    t.set_properties(**{"auto_compact.min_dv_objects": 4})
    (out,) = t.maintain()
    assert out.task == "coalesce_dvs" and out.dvs_coalesced == 4
    assert len({f.dv_object for f in t.head().data_files if f.dv_object}) == 1
    assert t.count_rows() == 16000 - 4 * 1500


def test_spark_writer_option_maintain(local_uri):
    """The data source's writer (driven here without a Spark session: ``write`` on Arrow
    batches, then ``commit``): option maintain=true runs one pass after an append."""
    from pyspark.sql import types as T

    from flightsrv.spark.datasource import FlightsrvWriter

    small_table(local_uri, 15)
    spark_schema = T.StructType([T.StructField("id", T.LongType()),
                                 T.StructField("v", T.StringType())])

    def job(lo, **options):
        w = FlightsrvWriter({"path": f"{local_uri}/t", **options}, spark_schema, False)
        w.commit([w.write(iter(batch(lo).to_batches()))])

    job(150)  # the 16th small file, no option: nothing but the append
    t = Warehouse.open(local_uri).table("t")
    assert t.head().operation == "spark_append" and len(t.head().data_files) == 16
    job(160, maintain="true")
    head = t.head()
    assert head.operation == "compact" and head.summary["trigger"] == "auto"
    assert sorted(t.to_table()["id"].to_pylist()) == list(range(170))


# -- the server's worker ---------------------------------------------------------------


class Server:
    """An in-process server over ``store`` with the worker on (ticks only on demand)."""

    def __init__(self, path, store=None, uri=None, **config):
        self.wh = Warehouse.open(uri) if uri else Warehouse(store or LocalStore(str(path)))
        self.engine = DuckEngine(self.wh)
        # no interval tick and no commit-driven wake: the tests tick the worker themselves
        cfg = ServerConfig(**{"maintenance_interval_s": 3600, "maintenance_yield_s": 0,
                              "maintenance_wake_commits": 0, **config})
        self.server, port = start_in_thread(self.engine, config=cfg, auto_maintenance=True)
        self.uri = f"grpc://127.0.0.1:{port}"
        self.http = MetricsHttpServer(self.server.metrics, lambda: (True, "ready"), 0)

    def tick(self):
        sched = self.server.maintenance
        sched.tick_now()
        assert sched.wait_ticks(1, timeout=120), "the maintenance worker did not tick"

    def sql(self, *statements):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(self.uri)
        out = None
        with conn, conn.cursor() as cur:
            for s in statements:
                cur.execute(s)
                out = cur.fetchall() if cur.description else cur.rowcount
        return out

    def metrics(self) -> dict:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.http.port}/metrics",
                                      timeout=10).read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(body) for s in fam.samples}

    def close(self):
        self.http.close()
        self.server.shutdown()
        self.engine.close()


@pytest.fixture
def served(tmp_path):
    made = []

    def make(store=None, uri=None, **config):
        s = Server(tmp_path / "wh", store, uri, **config)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def m(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def insert_commits(srv, n, table="t"):
    srv.sql(f"CREATE TABLE {table} (id BIGINT, v VARCHAR)",
            *[f"INSERT INTO {table} SELECT range + {i * 10}, 'r' || (range + {i * 10}) "
              f"FROM range(10)" for i in range(n)])


def test_worker_compacts_small_commits_rows_unchanged_metrics_and_history(served,
                                                                          warehouse_uri):
    srv = served(uri=warehouse_uri)
    insert_commits(srv, 20)
    before = srv.sql("SELECT id, v FROM t ORDER BY id")
    assert len(srv.wh.table("t").head().data_files) == 20
    srv.tick()
    head = srv.wh.table("t").head()
    assert len(head.data_files) == 1 and head.summary["trigger"] == "auto"
    assert srv.sql("SELECT id, v FROM t ORDER BY id") == before
    newest = srv.sql("SHOW HISTORY t")[0]  # version, created_at, operation, ..., summary
    version, op, summary = newest[0], newest[2], newest[-1]
    assert op == "compact" and version == head.version
    s = json.loads(summary)
    assert s["trigger"] == "auto" and s["task"] == "compact_small_files"
    got = srv.metrics()
    task = "compact_small_files"
    assert m(got, "flightsrv_maintenance_runs_total", task=task, status="ok") == 1
    assert m(got, "flightsrv_maintenance_files_compacted_total", task=task) == 20
    assert m(got, "flightsrv_maintenance_files_written_total", task=task) == 1
    assert m(got, "flightsrv_maintenance_bytes_read_total", task=task) == sum(
        f.size for f in srv.wh.table("t").log.load(head.version - 1).data_files)
    assert m(got, "flightsrv_maintenance_bytes_written_total", task=task) == head.data_files[
        0].size
    assert m(got, "flightsrv_maintenance_seconds_total", task=task) > 0
    assert m(got, "flightsrv_maintenance_ticks_total") >= 1
    assert m(got, "flightsrv_commits_total", table="t", operation="compact") == 1
    # nothing new: the next tick looks at nothing and commits nothing
    srv.tick()
    assert srv.wh.table("t").head().version == head.version


def test_property_off_nothing_happens(served):
    srv = served()
    srv.sql("CREATE TABLE t (id BIGINT, v VARCHAR)", "ALTER TABLE t SET (auto_compact = false)")
    assert srv.wh.table("t").properties["auto_compact"] == "false"
    srv.sql(*[f"INSERT INTO t VALUES ({i}, 'x')" for i in range(20)])
    version = srv.wh.table("t").head().version
    srv.tick()
    srv.tick()
    assert srv.wh.table("t").head().version == version
    assert len(srv.wh.table("t").head().data_files) == 20
    got = srv.metrics()
    assert not [k for k in got if k[0] == "flightsrv_maintenance_runs_total"]
    assert m(got, "flightsrv_maintenance_ticks_total") >= 2


def test_alter_table_set_properties_through_sql(served):
    """``ALTER TABLE t SET (...)`` / ``SET TBLPROPERTIES (...)`` set table properties in one
    commit, checked against the registry; NULL removes one."""
    import adbc_driver_manager

    srv = served()
    srv.sql("CREATE TABLE t (id BIGINT)",
            "ALTER TABLE t SET (auto_compact.min_small_files = 4, auto_compact.max_bytes = "
            "'1MiB', user.owner = 'crm')")
    t = srv.wh.table("t")
    assert t.head().operation == "set_properties"
    assert {k: v for k, v in t.properties.items()} == {
        "auto_compact.min_small_files": "4", "auto_compact.max_bytes": "1048576",
        "user.owner": "crm"}
    srv.sql("ALTER TABLE t SET TBLPROPERTIES ('auto_compact' = 'off', 'user.owner' = NULL)")
    assert t.properties == {"auto_compact.min_small_files": "4",
                            "auto_compact.max_bytes": "1048576", "auto_compact": "false"}
    for bad, words in (("ALTER TABLE t SET (auto_compct = true)", "unknown table property"),
                       ("ALTER TABLE t SET (auto_compact.min_small_files = 1)", "at least 2"),
                       ("ALTER TABLE t SET (auto_compact = now())", "must be a literal")):
        with pytest.raises(adbc_driver_manager.ProgrammingError, match=words):
            srv.sql(bad)
    version = t.head().version
    srv.sql(*[f"INSERT INTO t VALUES ({i})" for i in range(4)])
    srv.tick()
    assert t.head().version == version + 4  # auto_compact is off
    srv.sql("ALTER TABLE t SET (auto_compact = NULL)")  # back to the default: on
    srv.tick()
    assert t.head().operation == "compact" and t.count_rows() == 4


def test_delete_racing_the_compaction_stays_deleted(served, tmp_path):
    """The worker's first data-file write runs a DELETE through ADBC (after compaction read
    its version, before it commits): the deleted rows stay deleted, the rest is kept."""
    state = {"fired": False, "deleted": None}
    srv_box = {}

    def before_write(op, key):
        if state["fired"] or threading.current_thread().name != THREAD_NAME:
            return
        state["fired"] = True
        state["deleted"] = srv_box["srv"].sql("DELETE FROM t WHERE id % 10 = 3 OR id = 57")

    store = FaultyStore(LocalStore(str(tmp_path / "wh")),
                        FaultPlan(key_pattern=r"/data/", before_write=before_write))
    srv = srv_box["srv"] = served(store)
    insert_commits(srv, 20)
    srv.tick()
    assert state["fired"] and state["deleted"] == 21
    head = srv.wh.table("t").head()
    assert head.operation == "compact" and head.summary["deletes_carried_over"] == 21
    assert len(head.data_files) == 1
    want = [i for i in range(200) if i % 10 != 3 and i != 57]
    assert [r[0] for r in srv.sql("SELECT id FROM t ORDER BY id")] == want
    assert srv.sql("SELECT count(*) FROM t WHERE id = 57 OR id % 10 = 3") == [(0,)]
    # another process (no cache) reads the same
    assert sorted(Warehouse.open(str(tmp_path / "wh")).table("t").to_table()["id"]
                  .to_pylist()) == want


def test_failures_are_logged_counted_and_do_not_stop_the_server(served, tmp_path, caplog):
    failing = {"on": True}

    def before_write(op, key):
        if failing["on"] and threading.current_thread().name == THREAD_NAME:
            raise StoreError("injected failure", key=key)

    store = FaultyStore(LocalStore(str(tmp_path / "wh")),
                        FaultPlan(key_pattern=r"/data/", before_write=before_write))
    srv = served(store)
    insert_commits(srv, 20)
    with caplog.at_level(logging.WARNING, logger="flightsrv.maintenance"):
        srv.tick()
    failed = [r for r in caplog.records if r.getMessage() == "auto maintenance failed"]
    assert failed and failed[0].fields["table"] == "t"
    assert failed[0].fields["error_class"] == "StoreError"
    assert "Traceback" not in failed[0].fields["error"]
    task = "compact_small_files"
    got = srv.metrics()
    assert m(got, "flightsrv_maintenance_failures_total", task=task) == 1
    assert m(got, "flightsrv_maintenance_runs_total", task=task, status="failed") == 1
    # the server and the worker go on
    assert srv.sql("SELECT count(*) FROM t") == [(200,)]
    assert srv.server.maintenance._thread.is_alive()
    failing["on"] = False
    for _ in range(5):  # the table is retried after its back-off (3 ticks)
        srv.tick()
        if srv.wh.table("t").head().operation == "compact":
            break
    assert srv.wh.table("t").head().operation == "compact"
    assert srv.sql("SELECT count(*), sum(id) FROM t") == [(200, sum(range(200)))]
    assert m(srv.metrics(), "flightsrv_maintenance_runs_total", task=task, status="ok") == 1


def test_a_broken_table_stops_no_other_table_maintenance(served, tmp_path, caplog):
    """A table whose head reads but whose manifest chunks do not (damaged storage) is
    skipped with a warning naming it; the tables after it are maintained in the same tick."""
    srv = served()
    other = Warehouse.open(str(tmp_path / "wh"))  # no commit events: found by the sweep
    other.create_table("aaa", SCHEMA).append(batch(0))
    zzz = other.create_table("zzz", SCHEMA)
    for i in range(20):
        zzz.append(batch(i * 10))
    srv.server.maintenance._dirty.clear()
    damaged = list((tmp_path / "wh" / "aaa" / "chunks").rglob("*.json"))
    assert damaged
    for path in damaged:
        path.write_bytes(b"{not json")
    with caplog.at_level(logging.WARNING, logger="flightsrv.maintenance"):
        srv.tick()
    assert srv.wh.table("zzz").head().operation == "compact"
    skipped = [r for r in caplog.records
               if r.getMessage() == "auto maintenance skipped a table"]
    assert skipped and skipped[0].fields["table"] == "aaa"
    assert skipped[0].fields["error_class"] == "CorruptObject"
    assert srv.sql("SELECT count(*) FROM zzz") == [(200,)]


def test_worker_finds_writes_of_other_processes(served, tmp_path):
    """A Spark job or another server commits without this process's commit events: the
    round-robin sweep finds the table at the next tick."""
    srv = served()
    other = small_table(str(tmp_path / "wh"), 16)  # another Warehouse: no shared events
    srv.server.maintenance._dirty.clear()
    srv.tick()
    assert other.head().operation == "compact"
    assert sorted(other.to_table()["id"].to_pylist()) == list(range(160))


def test_commits_wake_the_worker_before_the_interval(served):
    """A stream of small commits is compacted while its files are few: 16 commits to a
    table wake the worker (an hour's interval never would); 3 more do not."""
    srv = served(maintenance_wake_commits=16)
    sched = srv.server.maintenance
    ticks0 = sched.ticks
    insert_commits(srv, 16)  # CREATE TABLE and 16 INSERTs: 16 small files

    def compacted():
        return sched.ticks > ticks0 and srv.wh.table("t").head().operation == "compact"

    deadline = time.monotonic() + 60
    while not compacted() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert compacted(), "16 commits did not wake the worker"
    before = sched.ticks
    srv.sql(*[f"INSERT INTO t VALUES ({1000 + i}, 'x')" for i in range(3)])
    time.sleep(1.0)
    assert sched.ticks == before  # 3 commits: no early tick
    assert srv.sql("SELECT count(*) FROM t") == [(163,)]


def test_worker_yields_to_running_statements(served):
    srv = served(maintenance_yield_s=30)
    insert_commits(srv, 16)
    busy = {"on": True}
    srv.server.maintenance.busy = lambda: busy["on"]
    sched = srv.server.maintenance
    sched.tick_now()
    time.sleep(0.5)  # the worker is waiting for an idle moment, not compacting
    assert srv.wh.table("t").head().operation != "compact"
    busy["on"] = False
    assert sched.wait_ticks(1, timeout=60)
    assert srv.wh.table("t").head().operation == "compact"


def test_worker_runs_anyway_after_yielding_its_longest(served):
    srv = served(maintenance_yield_s=0.2)
    insert_commits(srv, 16)
    srv.server.maintenance.busy = lambda: True  # a server that is never idle
    srv.tick()
    assert srv.wh.table("t").head().operation == "compact"


def test_policy_defaults_are_documented():
    import pathlib

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "MAINTENANCE.md").read_text()
    p = AutoPolicy.of(_manifest_with({}))
    assert p.enabled and p.min_small_files == 16 and p.max_bytes == 64 * 1024 ** 2
    for text in ("`auto_compact`", "`auto_compact.min_small_files`", "| 16 |", "64MiB",
                 "--no-auto-maintenance", "--maintenance-interval"):
        assert text in doc, text
    assert CompactSmallFiles.name in doc


def _manifest_with(props):
    class _M:
        properties = props

    return _M()


def test_serve_flags_in_help_and_off_switch(tmp_path):
    from test_serve_cli import Served

    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "flightsrv.cli", "serve", "--help"],
                         capture_output=True, text=True, check=True).stdout
    text = " ".join(out.split())
    assert "--no-auto-maintenance" in text and "(default: the worker runs)" in text
    assert re.search(r"--maintenance-interval SECONDS .*\(default: 5\.0\)", text)
    assert "(default: 32MiB)" in text
    assert re.search(r"--maintenance-wake-commits N .*\(default: 16\)", text)
    started = {}
    for flags in ((), ("--no-auto-maintenance",)):
        srv = Served(str(tmp_path / "wh"), "--no-demo", "--maintenance-interval", "0.5", *flags)
        try:
            assert srv.stop() == 0
        finally:
            srv.kill()
        started[flags] = [e for e in srv.events if e.get("event") == "maintenance_start"]
    assert started[()][0]["interval_s"] == 0.5 and started[()][0]["bytes_per_s"] == 32 << 20
    assert started[()][0]["wake_commits"] == 16
    assert started[("--no-auto-maintenance",)] == []
