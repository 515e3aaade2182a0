"""Readers of the open-format mirrors for tests and benchmarks (docs/INTEROP.md).

``delta_rows`` / ``iceberg_rows`` read one version through the real libraries (deltalake's
DV-aware ``scan()``; pyiceberg's ``StaticTable``), configured for the warehouse's store (a
local path or S3 through the ``AWS_*`` environment, as the moto fixture sets it).
``scenario`` builds the table the interop tests publish: appends, DV deletes (inline and
object), metadata-only deletes (whole row groups, a whole file), a splice, a compaction.

``duckdb_venv()`` builds (once, cached) a virtualenv with DuckDB 1.5.5 and its delta, avro,
iceberg, httpfs and ducklake extension wheels: the readers for ``delta_scan`` /
``iceberg_scan`` (our own DuckDB is 2.0, for which no extension wheels exist), and DuckLake,
the peer ``benchmarks/bench_peers.py`` measures against; ``duckdb_rows`` runs the readers.
``spark_venv()`` / ``spark_rows`` do the same for Spark 4.0 with delta-spark and
iceberg-spark-runtime (jars from Maven Central, cached in ``~/.m2``): the opt-in, slow Spark
readers of the reader matrix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa

DUCKDB_VERSION = "1.5.5"
DUCKDB_PACKAGES = [f"duckdb=={DUCKDB_VERSION}"] + [
    f"duckdb-extension-{n}=={DUCKDB_VERSION}"
    for n in ("delta", "avro", "iceberg", "httpfs", "ducklake")] + ["pyarrow"]


def s3_env() -> dict:
    return {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                       "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
            if k in os.environ}


def delta_storage_options(uri: str) -> dict | None:
    if not uri.startswith("s3://"):
        return None
    env = s3_env()
    return {"AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
            "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": env.get("AWS_REGION", "us-east-1"), "AWS_ALLOW_HTTP": "true"}


def iceberg_properties(uri: str) -> dict:
    if not uri.startswith("s3://"):
        return {}
    env = s3_env()
    return {"s3.endpoint": env["AWS_ENDPOINT_URL"], "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
            "s3.region": env.get("AWS_REGION", "us-east-1")}


def canonical(table: pa.Table, key: str = "id") -> list[dict]:
    """Rows as dicts sorted by ``key`` (readers return rows in any order)."""
    return sorted(table.to_pylist(), key=lambda r: r[key])


def delta_rows(table_uri: str, version: int, columns=None) -> pa.Table:
    from deltalake import DeltaTable

    dt = DeltaTable(table_uri, version=version, storage_options=delta_storage_options(
        table_uri))
    return pa.RecordBatchReader.from_stream(dt.scan(columns=columns)).read_all()


def iceberg_rows(metadata_uri: str, version: int) -> pa.Table:
    from pyiceberg.table import StaticTable

    st = StaticTable.from_metadata(metadata_uri, properties=iceberg_properties(metadata_uri))
    return st.scan(snapshot_id=version + 1).to_arrow()


SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.int32()), ("name", pa.string()),
                    ("score", pa.float64()), ("day", pa.date32()),
                    ("at", pa.timestamp("us", tz="UTC")), ("flag", pa.bool_())])


def batch(lo: int, hi: int) -> pa.Table:
    import datetime as dt

    ids = list(range(lo, hi))
    return pa.table({
        "id": ids, "grp": [i % 17 for i in ids], "name": [f"n{i}" if i % 11 else None
                                                         for i in ids],
        "score": [i * 0.25 for i in ids],
        "day": [dt.date(2026, 1, 1) + dt.timedelta(days=i % 300) for i in ids],
        "at": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i)
               for i in ids],
        "flag": [i % 2 == 0 for i in ids]}, schema=SCHEMA)


def scenario(wh, name: str = "t", *, publish_midway: bool = True, properties=None):
    """The interop table; returns it (versions 0..10, nothing expired yet)."""
    t = wh.create_table(name, SCHEMA, properties={"row_group_bytes": "16KB",
                                                  "compact.min_deleted_fraction": "0.2",
                                                  **(properties or {})})
    t.append(batch(0, 3000))                                   # v1
    t.append(batch(3000, 6000))                                # v2
    t.append(batch(6000, 6100))                                # v3 (a small file)
    t.delete("id % 97 = 0")                                    # v4 small DVs: inline
    if publish_midway:
        t.publish("all")
    t.delete("id >= 3000 AND id % 3 = 1")                      # v5 a large DV: DV object
    t.delete("id < 2100 OR id BETWEEN 3000 AND 4023")          # v6 whole row groups + DVs
    t.delete("id >= 6000")                                     # v7 a whole file, metadata only
    t.delete("id BETWEEN 5100 AND 5150", mode="splice")        # v8 a splice
    t.compact()                                                # v9 a compaction
    t.append(batch(7000, 7100))                                # v10
    return t


NESTED = pa.schema([("id", pa.int64()), ("grp", pa.int32()), ("name", pa.string()),
                    ("score", pa.float64()), ("tags", pa.list_(pa.string())),
                    ("pt", pa.struct([("x", pa.int32()), ("y", pa.string())])),
                    ("m", pa.map_(pa.string(), pa.int32()))])


def nested_batch(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table({
        "id": ids, "grp": [i % 17 for i in ids],
        "name": [f"n{i}" if i % 11 else None for i in ids],
        "score": [i * 0.25 for i in ids],
        "tags": [None if i % 13 == 0 else [f"t{i % 3}"] * (i % 4) for i in ids],
        "pt": [None if i % 7 == 0 else {"x": i % 5 or None, "y": f"y{i % 9}"} for i in ids],
        "m": [None if i % 19 == 0 else [(f"k{j}", i + j) for j in range(i % 3)]
              for i in ids]}, schema=NESTED)


#: what each version of :func:`matrix_scenario` did
MATRIX_STEPS = [
    "create", "properties", "append", "append", "append (a small file)",
    "delete: inline DVs", "delete: a DV object", "delete: row groups + DVs",
    "delete: a whole file", "delete: splice", "UPDATE", "MERGE", "ADD COLUMN",
    "UPDATE of the new column", "RENAME COLUMN", "DROP COLUMN", "SET PARTITIONED BY",
    "append (partitioned)", "OPTIMIZE", "append",
]


def matrix_scenario(wh, name: str = "rm"):
    """The reader-matrix table (docs/INTEROP.md §8): one history through every kind of
    commit, nested types included, one version per entry of ``MATRIX_STEPS``; published
    (``PUBLISH ... FORMAT all``) midway and at the end, with the oldest ``expired``
    versions expired between. Returns the table."""
    wh.sql(f"CREATE TABLE {name} (id BIGINT, grp INTEGER, name VARCHAR, score DOUBLE, "
           "tags VARCHAR[], pt STRUCT(x INTEGER, y VARCHAR), m MAP(VARCHAR, INTEGER))")
    t = wh.table(name)
    t = getattr(t, "_table", t)
    t.set_properties(**{"row_group_bytes": "16KB", "compact.min_deleted_fraction": "0.2"})
    t.append(nested_batch(0, 3000))
    t.append(nested_batch(3000, 6000))
    t.append(nested_batch(6000, 6100))
    t.delete("id % 97 = 0")
    t.delete("id >= 3000 AND id % 3 = 1")
    t.delete("id < 2100 OR id BETWEEN 3000 AND 4023")
    t.delete("id >= 6000")
    t.delete("id BETWEEN 5100 AND 5150", mode="splice")
    wh.sql(f"PUBLISH {name} FORMAT all")
    wh.sql(f"UPDATE {name} SET score = -score, tags = ['u'] WHERE grp = 3")
    wh.sql(f"MERGE INTO {name} USING (SELECT range AS k FROM range(2990, 3010)) s "
           f"ON {name}.id = s.k WHEN MATCHED THEN UPDATE SET name = 'merged' "
           "WHEN NOT MATCHED THEN INSERT (id, grp, name, pt) VALUES (s.k, 99, 'new', "
           "{'x': 1, 'y': 'm'})")
    wh.sql(f"ALTER TABLE {name} ADD COLUMN lvl INTEGER")
    wh.sql(f"UPDATE {name} SET lvl = grp WHERE id % 5 = 0")
    wh.sql(f"ALTER TABLE {name} RENAME COLUMN name TO label")
    wh.sql(f"ALTER TABLE {name} DROP COLUMN score")
    wh.sql(f"ALTER TABLE {name} SET PARTITIONED BY (bucket(4, grp))")
    wh.sql(f"INSERT INTO {name} SELECT range, range % 17, 'p' || range, ['x', NULL], "
           "{'x': range % 4, 'y': NULL}, MAP {'a': range % 3}, range % 6 "
           "FROM range(8000, 8300)")
    wh.sql(f"OPTIMIZE {name}")
    wh.sql(f"INSERT INTO {name} VALUES (9000, 1, 'last', [], NULL, MAP {{}}, 7)")
    return t


DUCKDB_SCRIPT = textwrap.dedent("""
    import glob, json, os, sys
    import duckdb
    spec = json.loads(sys.argv[1])
    con = duckdb.connect()
    # a query over 2 s would draw DuckDB's progress bar into the JSON on stdout
    con.execute("SET enable_progress_bar = false")
    base = os.path.dirname(os.path.dirname(duckdb.__file__))
    for name in ("delta", "avro", "iceberg", "httpfs"):
        path = glob.glob(os.path.join(base, f"duckdb_extension_{name}", "extensions", "*",
                                      f"{name}.duckdb_extension"))[0]
        con.execute(f"LOAD '{path}'")
    if spec.get("s3"):
        s3 = spec["s3"]
        con.execute(f\"\"\"CREATE SECRET (TYPE s3, KEY_ID '{s3["key"]}', SECRET '{s3["secret"]}',
            ENDPOINT '{s3["endpoint"]}', URL_STYLE 'path', USE_SSL false,
            REGION '{s3["region"]}')\"\"\")
    out = {}
    for q in spec["queries"]:
        try:
            if q.get("arrow"):  # the whole result as an Arrow IPC file
                import pyarrow as pa
                table = con.execute(q["sql"]).fetch_arrow_table()
                with pa.OSFile(q["arrow"], "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                    w.write_table(table)
                out[q["name"]] = {"arrow": q["arrow"]}
                continue
            rows = con.execute(q["sql"]).fetchall()
            out[q["name"]] = {"rows": [list(map(str, r)) for r in rows]}
        except Exception as exc:
            out[q["name"]] = {"error": str(exc)[:500]}
    print(json.dumps(out))
""")


def duckdb_venv(base: str | None = None) -> str:
    """Path of the python of a virtualenv with DuckDB 1.5.5 and its extension wheels,
    built on first use under ``base`` (default ``~/.cache/flightsrv``). Raises
    ``RuntimeError`` saying why when it cannot be built."""
    return _venv(f"duckdb-{DUCKDB_VERSION}", DUCKDB_PACKAGES, base)


def _venv(name: str, packages: list[str], base: str | None = None) -> str:
    """Python of virtualenv ``name`` with ``packages``, built (or completed) on first use."""
    base = base or os.environ.get("FLIGHTSRV_DUCKDB_VENV_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "flightsrv")
    venv = os.path.join(base, name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".complete")
    want = " ".join(packages)
    if os.path.exists(marker):
        with open(marker) as f:
            have = f.read().split()
        if set(packages) <= set(have):
            return python
        # an older virtualenv without some wheel: add what is missing
        steps = [[python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  *[p for p in packages if p not in have]]]
    else:
        os.makedirs(base, exist_ok=True)
        steps = [[sys.executable, "-m", "venv", "--clear", venv],
                 [python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  *packages]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"building the {name} virtualenv failed: "
                               f"{' '.join(cmd[:4])}: {(r.stderr or r.stdout)[-400:]}")
    with open(marker, "w") as f:
        f.write(want)
    return python


def duckdb_rows(python: str, queries: list[dict], *, s3: dict | None = None) -> dict:
    """Run ``queries`` ([{name, sql}]) in the DuckDB 1.5.5 virtualenv; name -> rows|error."""
    spec = {"queries": queries, "s3": s3}
    r = subprocess.run([python, "-c", DUCKDB_SCRIPT, json.dumps(spec)], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"DuckDB {DUCKDB_VERSION} reader failed: {r.stderr[-800:]}")
    return json.loads(r.stdout)


# -- Spark readers (opt-in: docs/INTEROP.md §8) ------------------------------------------

#: The newest Spark the Delta and Iceberg connectors on Maven Central run on (checked
#: 2026-11-27: none runs on the project's Spark 4.3), in a virtualenv of its own
SPARK_VERSION = "4.0.1"
SPARK_PACKAGES = [f"pyspark=={SPARK_VERSION}", "pyarrow"]
SPARK_JARS = ["io.delta:delta-spark_2.13:4.0.0", "io.delta:delta-storage:4.0.0",
              "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"]

SPARK_SCRIPT = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from pyspark.sql import SparkSession
    spec = json.loads(sys.argv[1])
    spark = (SparkSession.builder.master("local[2]").appName("flightsrv-mirror-readers")
             .config("spark.jars", ",".join(spec["jars"]))
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog",
                     "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = {}
    for q in spec["queries"]:  # {name, format, path, version, arrow}
        try:
            table = (spark.read.format(q["format"]).option("versionAsOf", q["version"])
                     .load(q["path"]).toArrow())
            with pa.OSFile(q["arrow"], "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            out[q["name"]] = {"arrow": q["arrow"]}
        except Exception as exc:
            out[q["name"]] = {"error": str(exc)[:500]}
    print(json.dumps(out))
""")


def m2_repo() -> str:
    return os.path.expanduser(os.environ.get("FLIGHTSRV_M2_REPO", "~/.m2/repository"))


def maven_jar(coordinate: str) -> str:
    """Path of ``group:artifact:version``'s jar in the local Maven repository, fetched from
    Maven Central by ``mvn dependency:get`` on first use. Raises ``RuntimeError``."""
    group, artifact, version = coordinate.split(":")
    jar = os.path.join(m2_repo(), *group.split("."), artifact, version,
                       f"{artifact}-{version}.jar")
    if os.path.exists(jar):
        return jar
    cmd = ["mvn", "-q", "-B", "dependency:get", f"-Dartifact={coordinate}",
           "-Dtransitive=false"]
    if "FLIGHTSRV_M2_REPO" in os.environ:
        cmd.append(f"-Dmaven.repo.local={m2_repo()}")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except OSError as exc:
        raise RuntimeError(f"fetching {coordinate} needs Maven (mvn): {exc}") from None
    if r.returncode != 0 or not os.path.exists(jar):
        raise RuntimeError(f"could not fetch {coordinate}: {(r.stdout + r.stderr)[-400:]}")
    return jar


def spark_venv(base: str | None = None) -> str:
    """Python of a virtualenv with PySpark ``SPARK_VERSION`` (cached like ``duckdb_venv``)."""
    return _venv(f"spark-{SPARK_VERSION}", SPARK_PACKAGES, base)


def spark_rows(python: str, queries: list[dict]) -> dict:
    """Run ``queries`` ([{name, format: delta|iceberg, path, version, arrow}]) with Spark
    and the connector jars of ``SPARK_JARS``; name -> {arrow: file} | {error}."""
    spec = {"jars": [maven_jar(c) for c in SPARK_JARS], "queries": queries}
    r = subprocess.run([python, "-c", SPARK_SCRIPT, json.dumps(spec)], capture_output=True,
                       text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"Spark {SPARK_VERSION} reader failed: {r.stderr[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # python -m flightsrv.testing.interop: build the venv (CI)
    print(duckdb_venv())
