"""Which top-level prefixes of a warehouse can be tables, and table-name normalisation."""

from __future__ import annotations

import re

from flightsrv.errors import ConfigurationError

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,127}")
#: names the engine gives its own relations and hidden columns (``flightsrv.sql.binder``'s
#: ``RESERVED``): no table, and no top-level column, may take one
RESERVED_PREFIX = "__fsrv"


def is_table_name(name: str) -> bool:
    """Whether ``name`` (a top-level prefix) can be a table's."""
    return bool(_NAME.fullmatch(name)) and not name.startswith(RESERVED_PREFIX)


def check_name(name: str) -> str:
    n = name.lower()
    if not _NAME.fullmatch(n):
        raise ConfigurationError("invalid table name (letters, digits, _; not starting with "
                                 "a digit; at most 128 characters)", table=name)
    if n.startswith(RESERVED_PREFIX):
        raise ConfigurationError(f"invalid table name: names starting with "
                                 f"{RESERVED_PREFIX!r} are reserved", table=name)
    return n
