"""A commit whose manifest CREATE landed but whose reply was lost (a connection reset; S3
answering 500 after storing the object). The S3 client's own retry then meets our object
(412) or gives up (a transport error); either way the commit loop must find its own
commit id at the version and report success once, never re-apply the write on top of
itself (an append twice) or re-plan it and delete the files its version references (an
UPDATE left the table unreadable). When the store cannot even answer that check, the
outcome is unknown, and the error says so instead of inviting a retry. Found in session 28
with a fault proxy in front of moto; here the store is wrapped (docs/PROTOCOL.md §6)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import CommitOutcomeUnknown, PreconditionFailed, StoreError
from flightsrv.store.local import LocalStore


class LostReply:
    """Lets the next manifest CREATE land, then fails it as ``how`` says: ``"412"`` (the
    client's retry met the object), ``"transport"`` (no answer), or ``"dark"`` (no answer,
    and the store stays unreachable for reads of that manifest)."""

    def __init__(self, inner):
        self.inner = inner
        self.how: str | None = None
        self.dark: str | None = None

    def put(self, key, data, **kw):
        if self.how and "/manifest/v" in key:
            how, self.how = self.how, None
            self.inner.put(key, data, **kw)  # it landed
            if how == "412":
                raise PreconditionFailed("injected: the retried CREATE met our object", key=key)
            if how == "dark":
                self.dark = key
            raise StoreError("injected: connection reset before the reply", key=key)
        return self.inner.put(key, data, **kw)

    def get(self, key, **kw):
        if self.dark is not None and key == self.dark:
            raise StoreError("injected: the store does not answer", key=key)
        return self.inner.get(key, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def table(tmp_path):
    store = LostReply(LocalStore(str(tmp_path / "wh")))
    t = Warehouse(store).create_table("t", pa.schema([("k", pa.int64()), ("n", pa.int64())]))
    t.append(pa.table({"k": pa.array(range(4), pa.int64()), "n": pa.array([0] * 4,
                                                                          pa.int64())}))
    return store, t


def _fresh(tmp_path):
    return Warehouse.open(str(tmp_path / "wh")).table("t")


@pytest.mark.parametrize("how", ["412", "transport"])
def test_an_append_whose_reply_was_lost_commits_once(table, tmp_path, how):
    store, t = table
    before = t.head().version
    store.how = how
    m = t.append(pa.table({"k": pa.array([10, 11], pa.int64()),
                           "n": pa.array([1, 1], pa.int64())}))
    assert m.version == before + 1
    fresh = _fresh(tmp_path)
    assert fresh.head().version == before + 1
    assert sorted(fresh.to_table().column("k").to_pylist()) == [0, 1, 2, 3, 10, 11]


@pytest.mark.parametrize("how", ["412", "transport"])
def test_an_update_whose_reply_was_lost_leaves_the_table_whole(table, tmp_path, how):
    store, t = table
    store.how = how
    assert t.update({"n": "n + 1"}, "k = 0") == 1
    rows = sorted(_fresh(tmp_path).to_table().to_pylist(), key=lambda r: r["k"])
    assert rows == [{"k": 0, "n": 1}, {"k": 1, "n": 0}, {"k": 2, "n": 0}, {"k": 3, "n": 0}]


@pytest.mark.parametrize("how", ["412", "transport"])
def test_a_delete_whose_reply_was_lost_reports_its_rows(table, tmp_path, how):
    store, t = table
    store.how = how
    assert int(t.delete("k < 2")) == 2
    assert sorted(_fresh(tmp_path).to_table().column("k").to_pylist()) == [2, 3]


def test_an_unanswered_check_is_an_unknown_outcome_not_a_retry(table, tmp_path):
    store, t = table
    before = t.head().version
    store.how = "dark"
    with pytest.raises(CommitOutcomeUnknown, match="SHOW HISTORY") as e:
        t.append(pa.table({"k": pa.array([10], pa.int64()), "n": pa.array([1], pa.int64())}))
    assert e.value.context["version"] == before + 1 and e.value.context["table"] == "t"
    assert not isinstance(e.value, StoreError)  # not "retry"
    fresh = _fresh(tmp_path)  # it did land: a blind retry would have written it twice
    assert fresh.head().version == before + 1
    assert fresh.head().commit_id == e.value.context["commit_id"]
