"""Automatic registration of the ``flightsrv`` Spark data source.

Spark 4 registers Python data sources found in installed top-level packages named
``pyspark_*`` that expose ``DefaultSource``; with flightsrv installed,
``spark.read.format("flightsrv")`` works without calling ``flightsrv.spark.register``.
"""

from flightsrv.spark.datasource import FlightsrvDataSource as DefaultSource  # noqa: F401
