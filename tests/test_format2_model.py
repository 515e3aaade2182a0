"""Model test of table format 2 (issue 15): random sequences of appends, deletes (SQL DELETE
and Table.delete), schema changes (add with and without DEFAULT, rename, drop, widen),
partition-spec changes, compactions, expiries and time travel, against an in-memory
reference, on a local directory and on S3 (moto).

The reference keeps, for every committed version, the column names of that version and its
rows. After every step the head is read back; after every schema or partitioning change every
retained version is read back (time travel), so old files are read by field id under each
version's schema: renamed columns come back under their new names, dropped ones are gone,
widened ones are cast, added ones hold their default.

The default run is a few small examples per backend; ``-m slow`` (or FLIGHTSRV_SLOW=1) runs
the large variant.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightsrv import Warehouse

BASE = dt.datetime(2024, 1, 1)

#: the types a new column may take, and the type each widens to
ADD_TYPES = {"int32": pa.int32(), "float32": pa.float32(), "string": pa.string(),
             "int16": pa.int16()}
SQL_TYPES = {"int32": "INTEGER", "float32": "REAL", "string": "VARCHAR", "int16": "SMALLINT"}
WIDER = {pa.int16(): pa.int32(), pa.int32(): pa.int64(), pa.float32(): pa.float64()}
SPECS = [[], ["day(ts)"], ["bucket(4, id)"], ["truncate(8, id)", "month(ts)"],
         ["hour(ts)", "bucket(3, id)"]]


def _value(t: pa.DataType, row_id: int, salt: int):
    """A deterministic value of type ``t`` for a row (exact in float32: halves)."""
    if pa.types.is_integer(t):
        return (row_id * 7 + salt) % 101 - 50
    if pa.types.is_floating(t):
        return ((row_id * 3 + salt) % 64) / 2
    return f"s{row_id}-{salt}"


class Model:
    """The reference: columns (name, field key, type, default) and rows by field key."""

    def __init__(self):
        # fixed columns: id (never dropped, never renamed) and ts (partition source)
        self.columns = [["id", "id", pa.int64(), None], ["ts", "ts", pa.timestamp("us"), None],
                        ["v", "v", pa.int32(), None]]
        self.rows: list[dict] = []
        self.next_id = 0
        self.next_key = 0
        self.versions: dict[int, tuple[list[str], list[tuple]]] = {}

    def names(self) -> list[str]:
        return [c[0] for c in self.columns]

    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c[0], c[2]) for c in self.columns])

    def expected(self) -> tuple[list[str], list[tuple]]:
        keys = [c[1] for c in self.columns]
        return self.names(), sorted(tuple(r.get(k) for k in keys) for r in self.rows)

    def record(self, version: int) -> None:
        self.versions[version] = self.expected()


def _read(t, version=None):
    got = t.to_table(version=version)
    rows = sorted(tuple(r[n] for n in got.column_names) for r in got.to_pylist())
    return got.column_names, rows


def _check(t, model: Model, version: int | None = None):
    want = model.versions[version] if version is not None else model.expected()
    names, rows = _read(t, version)
    assert names == want[0], f"version {version}: columns {names} != {want[0]}"
    assert rows == want[1], f"version {version}: rows differ"


op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 12)),
    st.tuples(st.just("delete_sql"), st.integers(2, 5), st.integers(0, 4)),
    st.tuples(st.just("delete_api"), st.integers(0, 40)),
    st.tuples(st.just("erase"), st.integers(3, 7)),
    st.tuples(st.just("add"), st.sampled_from(sorted(ADD_TYPES)), st.booleans()),
    st.tuples(st.just("rename"), st.integers(0, 10)),
    st.tuples(st.just("drop"), st.integers(0, 10)),
    st.tuples(st.just("widen"), st.integers(0, 10)),
    st.tuples(st.just("partition"), st.integers(0, len(SPECS) - 1)),
    st.tuples(st.just("compact")),
    st.tuples(st.just("expire"), st.integers(1, 4)),
)


def run_model(uri: str, ops: list) -> None:
    wh = Warehouse.open(uri)
    model = Model()
    t = wh.create_table("m", model.schema(), partition_by=["day(ts)"])
    model.record(t.head().version)
    for step in ops:
        kind = step[0]
        schema_change = False
        if kind == "append":
            n = step[1]
            ids = list(range(model.next_id, model.next_id + n))
            model.next_id += n
            new = []
            for i in ids:
                row = {"id": i, "ts": BASE + dt.timedelta(hours=7 * i)}
                for name, key, typ, _ in model.columns[2:]:
                    row[key] = _value(typ, i, len(key))
                new.append(row)
            data = pa.table({c[0]: pa.array([r[c[1]] for r in new], c[2])
                             for c in model.columns})
            t.append(data)
            model.rows += new
        elif kind == "delete_sql":
            m, r = step[1], step[2] % step[1]
            wh.sql(f"DELETE FROM m WHERE id % {m} = {r}")
            model.rows = [x for x in model.rows if x["id"] % m != r]
        elif kind == "delete_api":
            cut = step[1]
            t.delete(f"id < {cut} AND id % 2 = 0")
            model.rows = [x for x in model.rows if not (x["id"] < cut and x["id"] % 2 == 0)]
        elif kind == "erase":  # physical erasure: spliced or rewritten files
            m = step[1]
            t.delete(f"id % {m} = 2", mode="splice")
            model.rows = [x for x in model.rows if x["id"] % m != 2]
        elif kind == "add":
            typ = ADD_TYPES[step[1]]
            name = f"c{model.next_key}"
            model.next_key += 1
            default = _value(typ, 1000, 1) if step[2] else None
            if step[2]:  # through SQL, the DEFAULT evaluated by DuckDB
                literal = f"'{default}'" if isinstance(default, str) else str(default)
                wh.sql(f"ALTER TABLE m ADD COLUMN {name} {SQL_TYPES[step[1]]} DEFAULT {literal}")
            else:
                t.add_column(name, typ)
            key = name + "#"  # distinct from every old physical name
            model.columns.append([name, key, typ, default])
            for x in model.rows:
                x[key] = default
            schema_change = True
        elif kind in ("rename", "drop", "widen"):
            movable = model.columns[2:]
            if not movable:
                continue
            col = movable[step[1] % len(movable)]
            if kind == "rename":
                new_name = f"r{model.next_key}"
                model.next_key += 1
                wh.sql(f'ALTER TABLE m RENAME COLUMN "{col[0]}" TO "{new_name}"')
                col[0] = new_name
            elif kind == "drop":
                if step[1] % 2:
                    wh.sql(f'ALTER TABLE m DROP COLUMN "{col[0]}"')
                else:
                    t.drop_column(col[0])
                model.columns.remove(col)
            else:
                wider = WIDER.get(col[2])
                if wider is None:
                    continue
                if step[1] % 2:
                    sql_name = {pa.int32(): "INTEGER", pa.int64(): "BIGINT",
                                pa.float64(): "DOUBLE"}[wider]
                    wh.sql(f'ALTER TABLE m ALTER COLUMN "{col[0]}" SET DATA TYPE {sql_name}')
                else:
                    t.widen_column(col[0], wider)
                col[2] = wider
            schema_change = True
        elif kind == "partition":
            t.set_partition_spec(SPECS[step[1]])
            schema_change = True
        elif kind == "compact":
            if len(model.rows) % 2:
                wh.sql("OPTIMIZE m")
            else:
                t.compact()
        elif kind == "expire":
            t.expire_snapshots(retain_last=step[1])
            head = t.head().version
            for v in [v for v in model.versions if v <= head - step[1]]:
                del model.versions[v]
        model.record(t.head().version)
        _check(t, model)
        if schema_change:
            for v in sorted(model.versions):
                _check(t, model, v)
    # in the end, every retained version once more, from a fresh warehouse object
    t2 = Warehouse.open(uri).table("m")
    for v in sorted(model.versions):
        _check(t2, model, v)


OPS = st.lists(op, min_size=3, max_size=6)
SMALL = settings(max_examples=2, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])


@SMALL
@given(ops=OPS)
def test_format2_model_local(tmp_path, ops):
    run_model(str(tmp_path / uuid.uuid4().hex), ops)


@SMALL
@given(ops=OPS)
def test_format2_model_s3(s3_uri_factory, ops):
    run_model(s3_uri_factory(), ops)


def test_format2_model_fixed_sequence(tmp_path):
    """Every kind of step at least once, in an order that exercises old files under every
    schema change (the default run's guaranteed coverage)."""
    run_model(str(tmp_path / "w"), [
        ("append", 5), ("add", "int16", True), ("append", 4), ("widen", 1),
        ("rename", 0), ("partition", 2), ("append", 6), ("delete_sql", 3, 1),
        ("add", "string", False), ("widen", 0), ("drop", 0), ("append", 3),
        ("delete_api", 10), ("partition", 3), ("append", 4), ("compact",),
        ("rename", 1), ("erase", 4), ("add", "float32", True), ("widen", 2), ("erase", 3),
        ("expire", 3), ("append", 2), ("compact",)])


@pytest.mark.slow
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=5, max_size=30))
def test_format2_model_large(tmp_path, s3_uri_factory, ops):
    run_model(str(tmp_path / uuid.uuid4().hex), ops)
    run_model(s3_uri_factory(), ops)
