"""Points in time as users write them (time travel, retention), as epoch milliseconds."""

from __future__ import annotations

import datetime as dt
import re

from flightsrv.errors import ConfigurationError


def parse_timestamp_ms(as_of) -> int:
    """Epoch milliseconds of ``as_of``: a datetime (naive = UTC), epoch milliseconds (an int,
    or a string of digits, as Spark passes every option), or an ISO 8601 string
    (``2026-11-21``, ``2026-11-21T12:00:00Z``, ``2026-11-21 12:00:00+01:00``; naive = UTC)."""
    if isinstance(as_of, (int, float)) and not isinstance(as_of, bool):
        return int(as_of)
    if isinstance(as_of, str) and re.fullmatch(r"\s*-?\d+\s*", as_of):
        return int(as_of)  # epoch milliseconds as text
    if isinstance(as_of, str):
        as_of = as_of.strip()
        try:
            as_of = dt.datetime.fromisoformat(as_of.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError("timestamp does not parse (use ISO 8601)",
                                     timestamp=as_of) from None
    if isinstance(as_of, dt.datetime):
        if as_of.tzinfo is None:
            as_of = as_of.replace(tzinfo=dt.timezone.utc)
        return int(as_of.timestamp() * 1000)
    raise ConfigurationError("as_of must be a datetime, ISO string or epoch ms", as_of=repr(as_of))
