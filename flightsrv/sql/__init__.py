"""The SQL front end: parse, classify, validate and plan statements (sqlglot, DuckDB dialect).

- :mod:`.statements`  one statement -> exactly one ``Statement`` kind, or SqlError
- :mod:`.validate`    refuse file readers, non-allow-listed table functions, qualified names
- :mod:`.plan`        bind parameters, pin snapshots, rewrite table references, scan hints
- :mod:`.types`       SQL <-> Arrow type maps and typed literals
- :mod:`.corpus`      the ``sql/`` corpus format and runner

Nothing here imports DuckDB or the table format; the engine (:mod:`flightsrv.engine`)
wires the plan to both.
"""

from flightsrv.sql.plan import Pinner, QueryPlan, Scan, bind_params, params_from_batch, plan_query
from flightsrv.sql.statements import (
    AlterTable,
    CreateTable,
    CreateTableAs,
    Delete,
    DropTable,
    Insert,
    Maintenance,
    Query,
    SetSession,
    Statement,
    parse_statement,
)

__all__ = [
    "AlterTable", "CreateTable", "CreateTableAs", "Delete", "DropTable", "Insert", "Maintenance",
    "Pinner",
    "Query", "QueryPlan", "Scan", "SetSession", "Statement", "bind_params", "params_from_batch",
    "parse_statement", "plan_query",
]
