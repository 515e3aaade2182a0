"""Which top-level prefixes of a warehouse can be tables, and table-name normalisation."""

from __future__ import annotations

import re

from flightsrv.errors import ConfigurationError

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,127}")


def is_table_name(name: str) -> bool:
    """Whether ``name`` (a top-level prefix) can be a table's."""
    return bool(_NAME.fullmatch(name))


def check_name(name: str) -> str:
    n = name.lower()
    if not _NAME.fullmatch(n):
        raise ConfigurationError("invalid table name (letters, digits, _; not starting with "
                                 "a digit)", table=name)
    return n
