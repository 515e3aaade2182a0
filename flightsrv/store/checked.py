"""A store view that proves, before its first write, that the store enforces the conditional
writes commits rely on (``selfcheck.verify_preconditions``), once per underlying store.

Tables write through this view, so no write path has to remember to ask: reads pass straight
through, and the first write or delete runs the check
(``StoreUnsupported`` if the store ignores ``If-None-Match`` or ``If-Match``).
"""

from __future__ import annotations

import threading

from flightsrv.store.selfcheck import ensure_checked

# ``new_temp_file`` / ``write_temp_file`` only stage bytes; ``adopt`` is the write
_WRITES = ("put", "put_file", "adopt", "create_multipart", "upload_part", "upload_part_copy",
           "complete_multipart", "copy", "delete")


class CheckedStore:
    def __init__(self, inner, new_token):
        """``new_token()`` names the scratch object of the check (an injected id source)."""
        self.inner = inner
        self._new_token = new_token
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return self.inner.uri

    def __repr__(self) -> str:
        return f"CheckedStore({self.inner!r})"

    def ensure_checked(self) -> None:
        if getattr(self.inner, "_flightsrv_checked", False):
            return
        with self._lock:
            ensure_checked(self.inner, self._new_token())

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in _WRITES:
            return attr

        def checked(*args, **kwargs):
            self.ensure_checked()
            return attr(*args, **kwargs)

        return checked
