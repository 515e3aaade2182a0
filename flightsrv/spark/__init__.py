"""flightsrv on Spark: the ``flightsrv`` data source and jobs that run on executors.

- ``register(spark)``: register the ``flightsrv`` format in a session (per session), and
  teach PySpark's writer/reader Spark's conventions for it: every save mode, the session's
  ``spark.sql.caseSensitive``, DataFrames pinned at load (``modes.py``).
- ``session(...)``: a SparkSession configured for flightsrv (Python workers on this
  interpreter, filter pushdown for Python sources on, Arrow batches of 100k rows), registered.
- ``delete_matching`` / ``delete_where``: erasure by join / by predicate (``erasure.py``).
- ``compact``: DV-aware compaction on executors (``compaction.py``).
- ``pipeline``: the example pipeline behind ``flightsrv pipeline``.

Needs pyspark (``pip install flightsrv[spark]``); ``import flightsrv`` does not import it.
"""

from __future__ import annotations

import os
import sys

SESSION_CONF = {
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}


def register(spark) -> None:
    """Register the ``flightsrv`` data source in ``spark`` (registration is per session), and
    teach PySpark's writer Spark's other save modes for it (``flightsrv.spark.modes``)."""
    from flightsrv.spark import modes
    from flightsrv.spark.datasource import FlightsrvDataSource

    spark.dataSource.register(FlightsrvDataSource)
    modes.install()
    if spark.conf.get("spark.sql.python.filterPushdown.enabled", "false") != "true":
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def session(master: str = "local[2]", app_name: str = "flightsrv", conf: dict | None = None):
    """A SparkSession ready for flightsrv: workers run this interpreter, pushdown on."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.master(master).appName(app_name)
    for k, v in {**SESSION_CONF, **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def delete_matching(spark, uri, keys_df, on, **kw) -> int:
    from flightsrv.spark.erasure import delete_matching as _impl

    return _impl(spark, uri, keys_df, on, **kw)


def delete_where(spark, uri, predicate: str, **kw) -> int:
    from flightsrv.spark.erasure import delete_where as _impl

    return _impl(spark, uri, predicate, **kw)


def compact(spark, uri, **kw):
    from flightsrv.spark.compaction import compact as _impl

    return _impl(spark, uri, **kw)


__all__ = ["compact", "delete_matching", "delete_where", "register", "session"]
