"""The Thrift footer codec (``flightsrv.table.parquet_meta``) and the row-group splice
(``flightsrv.table.splice``), on real pyarrow-written files, read back with pyarrow and DuckDB,
assembled through the local store and through S3 on a moto server."""

from __future__ import annotations

import io
import random

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightsrv.errors import ConfigurationError, PreconditionFailed, StoreError
from flightsrv.store import open_store
from flightsrv.store.base import PutMode
from flightsrv.store.local import LocalStore
from flightsrv.table import parquet_meta as pm
from flightsrv.table import splice as sp
from flightsrv.table.parquet_meta import CC, CMD, RG, TList, TMap, TStruct

ERASED = "ERASE-ME-7f3c9a1e55"  # sorts after every other string: it lands in the stats


# -- helpers -------------------------------------------------------------------------


def make_table(n: int, seed: int = 0, erased_at: int | None = None) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64)
    s = [f"name-{i:06d}-{i % 13}" for i in range(n)]
    if erased_at is not None:
        s[erased_at] = ERASED
    lst = [None if i % 11 == 0 else [int(x) for x in rng.integers(0, 100, i % 4)]
           for i in range(n)]
    struct = [None if i % 17 == 0 else {"x": i * 3, "y": None if i % 5 == 0 else f"y{i % 50}"}
              for i in range(n)]
    ts = pa.array(ids * 1_000_003, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    f = [None if i % 9 == 0 else float(v) for i, v in enumerate(rng.normal(size=n))]
    cat = pa.array([f"cat{i % 5}" for i in range(n)]).dictionary_encode()
    return pa.table({"id": ids, "s": s, "l": lst, "st": struct, "ts": ts,
                     "f": pa.array(f, pa.float64()), "cat": cat})


def write_parquet(table: pa.Table, **kw) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


def footer_of(data: bytes) -> bytes:
    n = pm.parse_footer_tail(data[-8:])
    return data[-8 - n : -8]


def expected_after(table: pa.Table | bytes, plan: sp.SplicePlan) -> pa.Table:
    """The source as pyarrow reads it, minus the rows the plan removed."""
    if isinstance(table, bytes):
        table = pq.read_table(io.BytesIO(table))
    keep = np.setdiff1d(np.arange(table.num_rows), plan.removed_file_positions())
    return table.take(pa.array(keep))


def normalized(t: pa.Table) -> pa.Table:
    """Dictionary columns decoded, one chunk: tables compare by value."""
    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
            for c in t.columns]
    return pa.Table.from_arrays(cols, names=t.column_names).combine_chunks()


def check_readable(data: bytes, expected: pa.Table, tmp_path, name: str = "out") -> None:
    """pyarrow and DuckDB both read ``data`` as exactly ``expected``."""
    got = pq.read_table(io.BytesIO(data))
    assert got.num_rows == expected.num_rows
    assert got.schema.equals(expected.schema)
    assert normalized(got).equals(normalized(expected)), "pyarrow read differs"
    path = tmp_path / f"{name}.parquet"
    path.write_bytes(data)
    con = duckdb.connect()
    cols = "id, s, l, st, f, cat::VARCHAR AS cat, epoch_us(ts) AS ts"
    res = con.sql(f"SELECT {cols} FROM read_parquet('{path}') ORDER BY id").to_arrow_table()
    exp = expected.to_pydict()
    assert res.column("id").to_pylist() == exp["id"]
    assert res.column("s").to_pylist() == exp["s"]
    assert res.column("l").to_pylist() == exp["l"]
    assert res.column("st").to_pylist() == exp["st"]
    assert res.column("f").to_pylist() == exp["f"]
    assert res.column("cat").to_pylist() == exp["cat"]
    assert res.column("ts").to_pylist() == expected.column("ts").cast(pa.int64()).to_pylist()
    n = con.sql(f"SELECT count(*) FROM read_parquet('{path}')").fetchall()[0][0]
    assert n == expected.num_rows
    check_page_structures(data)


def check_page_structures(data: bytes) -> None:
    """Every offset in the footer lands on what it claims: page headers, page indexes,
    bloom filters; offset indexes agree with the pages and row counts."""
    fmd = pm.decode(footer_of(data))
    total = 0
    for gi, rg in enumerate(pm.row_groups(fmd)):
        total += rg.get(RG.NUM_ROWS)
        if rg.has(RG.ORDINAL):
            assert rg.get(RG.ORDINAL) == gi
        for cc in pm.columns(rg):
            md = pm.meta(cc)
            start, end = pm.chunk_range(cc)
            hdr, _ = pm.decode_struct(data, start)  # a page header sits at the chunk start
            assert hdr.get(pm.PH.TYPE) in (pm.PAGE_DATA, pm.PAGE_DICTIONARY, pm.PAGE_DATA_V2)
            if md.get(CMD.DICTIONARY_PAGE_OFFSET):
                assert hdr.get(pm.PH.TYPE) == pm.PAGE_DICTIONARY
            hdr, _ = pm.decode_struct(data, md.get(CMD.DATA_PAGE_OFFSET))
            assert hdr.get(pm.PH.TYPE) in (pm.PAGE_DATA, pm.PAGE_DATA_V2)
            if cc.get(CC.OFFSET_INDEX_OFFSET):
                off, ln = cc.get(CC.OFFSET_INDEX_OFFSET), cc.get(CC.OFFSET_INDEX_LENGTH)
                oi = pm.decode(data[off : off + ln])
                locs = pm.page_locations(oi)
                assert locs[0].get(pm.PL.FIRST_ROW_INDEX) == 0
                for k, loc in enumerate(locs):
                    p = loc.get(pm.PL.OFFSET)
                    assert start <= p < end
                    h, hend = pm.decode_struct(data, p)
                    assert h.get(pm.PH.TYPE) in (pm.PAGE_DATA, pm.PAGE_DATA_V2)
                    size = hend - p + h.get(pm.PH.COMPRESSED_PAGE_SIZE)
                    assert size == loc.get(pm.PL.COMPRESSED_PAGE_SIZE)
                    if k + 1 < len(locs):
                        assert locs[k + 1].get(pm.PL.OFFSET) == p + size
                    else:
                        assert p + size == end
                    assert loc.get(pm.PL.FIRST_ROW_INDEX) < rg.get(RG.NUM_ROWS)
                if cc.get(CC.COLUMN_INDEX_OFFSET):
                    off, ln = cc.get(CC.COLUMN_INDEX_OFFSET), cc.get(CC.COLUMN_INDEX_LENGTH)
                    ci = pm.decode(data[off : off + ln])
                    assert len(ci.get(1).items) == len(locs)  # null_pages: one per page
            if md.get(CMD.BLOOM_FILTER_OFFSET):
                off = md.get(CMD.BLOOM_FILTER_OFFSET)
                size = pm.bloom_filter_size(data, off)
                if md.has(CMD.BLOOM_FILTER_LENGTH):
                    assert size == md.get(CMD.BLOOM_FILTER_LENGTH)
    assert fmd.get(pm.FMD.NUM_ROWS) == total


class CountingStore:
    """Delegates to a real store; counts ranged GETs and can fail or enforce part rules."""

    def __init__(self, inner, *, min_part_size=None, equal_part_sizes=None, fail_copy=False):
        self.inner = inner
        self.uri = inner.uri
        self.min_part_size = inner.min_part_size if min_part_size is None else min_part_size
        self.equal_part_sizes = (inner.equal_part_sizes if equal_part_sizes is None
                                 else equal_part_sizes)
        self.fail_copy = fail_copy
        self.gets = 0
        self.sizes: dict[str, dict[int, int]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_range(self, key, start, end, *, etag=None):
        self.gets += 1
        return self.inner.get_range(key, start, end, etag=etag)

    def upload_part(self, key, upload_id, n, data):
        self.sizes.setdefault(upload_id, {})[n] = len(data)
        return self.inner.upload_part(key, upload_id, n, data)

    def upload_part_copy(self, key, upload_id, n, source_key, start, end, *, source_etag=None):
        if self.fail_copy:
            raise StoreError("injected copy failure", key=key)
        self.sizes.setdefault(upload_id, {})[n] = end - start
        return self.inner.upload_part_copy(key, upload_id, n, source_key, start, end,
                                           source_etag=source_etag)

    def complete_multipart(self, key, upload_id, parts, *, mode=PutMode.CREATE):
        sizes = self.sizes.get(upload_id, {})
        for p in parts[:-1]:  # the S3 EntityTooSmall rule, enforced locally
            if sizes[p.part_number] < self.min_part_size:
                raise StoreError("EntityTooSmall", part=p.part_number,
                                 size=sizes[p.part_number])
        return self.inner.complete_multipart(key, upload_id, parts, mode=mode)


@pytest.fixture
def store(tmp_path):
    return LocalStore(str(tmp_path / "store"))


# -- the Thrift codec ----------------------------------------------------------------

FOOTER_VARIANTS = [
    dict(),
    dict(compression="zstd", write_page_index=True),
    dict(compression="gzip", use_dictionary=False, data_page_version="2.0"),
    dict(compression="none", bloom_filter_options={"s": {"ndv": 100, "fpp": 0.01}},
         write_page_index=True, write_page_checksum=True),
    dict(compression="snappy", write_statistics=False, version="1.0"),
    dict(compression="lz4", column_encoding={"id": "DELTA_BINARY_PACKED"},
         use_dictionary=["s"], sorting_columns=[pq.SortingColumn(0)]),
]


@pytest.mark.parametrize("kw", FOOTER_VARIANTS, ids=range(len(FOOTER_VARIANTS)))
def test_footer_round_trip_is_byte_exact(kw):
    data = write_parquet(make_table(3000), row_group_size=700, **kw)
    footer = footer_of(data)
    fmd = pm.decode(footer)
    assert pm.encode(fmd) == footer
    assert pm.encode(fmd.copy()) == footer
    # field ids agree with pyarrow's own reading of the footer
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    assert fmd.get(pm.FMD.NUM_ROWS) == md.num_rows == 3000
    assert len(pm.row_groups(fmd)) == md.num_row_groups == 5
    for i, rg in enumerate(pm.row_groups(fmd)):
        assert rg.get(RG.NUM_ROWS) == md.row_group(i).num_rows
        assert rg.get(RG.TOTAL_BYTE_SIZE) == md.row_group(i).total_byte_size
        for j, cc in enumerate(pm.columns(rg)):
            c = md.row_group(i).column(j)
            m = pm.meta(cc)
            assert pm.path_of(cc) == c.path_in_schema
            assert m.get(CMD.DATA_PAGE_OFFSET) == c.data_page_offset
            assert m.get(CMD.TOTAL_COMPRESSED_SIZE) == c.total_compressed_size
            assert m.get(CMD.NUM_VALUES) == c.num_values
            if c.has_dictionary_page:
                assert m.get(CMD.DICTIONARY_PAGE_OFFSET) == c.dictionary_page_offset
    # the page indexes and bloom filters round-trip too
    for rg in pm.row_groups(fmd):
        for cc in pm.columns(rg):
            for fo, fl in ((CC.OFFSET_INDEX_OFFSET, CC.OFFSET_INDEX_LENGTH),
                           (CC.COLUMN_INDEX_OFFSET, CC.COLUMN_INDEX_LENGTH)):
                if cc.get(fo):
                    raw = data[cc.get(fo) : cc.get(fo) + cc.get(fl)]
                    assert pm.encode(pm.decode(raw)) == raw
            m = pm.meta(cc)
            if m.get(CMD.BLOOM_FILTER_OFFSET):
                hdr, end = pm.decode_struct(data, m.get(CMD.BLOOM_FILTER_OFFSET))
                assert pm.encode(hdr) == data[m.get(CMD.BLOOM_FILTER_OFFSET) : end]


def test_codec_keeps_unknown_fields_and_all_types():
    inner = TStruct({1: (pm.I32, -7), 2: (pm.BINARY, b"x" * 40)})
    s = TStruct({
        1: (pm.BOOL, True), 2: (pm.BOOL, False), 3: (pm.I8, -3), 4: (pm.I16, 300),
        5: (pm.I32, -(2**31)), 6: (pm.I64, 2**62), 7: (pm.DOUBLE, 1.5),
        8: (pm.BINARY, b""), 20: (pm.LIST, TList(pm.I64, list(range(-20, 20)))),
        40: (pm.STRUCT, inner), 300: (pm.MAP, TMap(pm.BINARY, pm.I32, [(b"a", 1), (b"b", 2)])),
        301: (pm.LIST, TList(pm.BOOL_TRUE, [True, False, True])),
        302: (pm.SET, TList(pm.I32, [1, 2], is_set=True)), 303: (pm.MAP, TMap(0, 0, [])),
        -5 + 400: (pm.LIST, TList(pm.STRUCT, [inner, inner])),
    })
    raw = pm.encode(s)
    back = pm.decode(raw)
    assert pm.encode(back) == raw
    assert back.get(300).items == [(b"a", 1), (b"b", 2)]
    assert back.get(5) == -(2**31) and back.get(6) == 2**62 and back.get(3) == -3
    assert back.get(301).items == [True, False, True]
    assert list(back) == list(s)  # field order kept
    # an unknown field set in the middle lands in id order; removing it restores the bytes
    back.set(10, pm.I32, 99)
    assert list(back)[:9] == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    back.remove(10)
    assert pm.encode(back) == raw


def test_codec_rejects_truncated_input():
    raw = pm.encode(TStruct({1: (pm.BINARY, b"hello"), 2: (pm.I64, 5)}))
    from flightsrv.errors import CorruptObject
    for cut in range(1, len(raw)):
        with pytest.raises(CorruptObject):
            pm.decode(raw[:cut])


def test_shift_offset_index():
    data = write_parquet(make_table(2000), row_group_size=1000, write_page_index=True,
                         max_rows_per_page=100, use_dictionary=False)
    fmd = pm.decode(footer_of(data))
    cc = pm.columns(pm.row_groups(fmd)[1])[1]
    raw = data[cc.get(CC.OFFSET_INDEX_OFFSET):][: cc.get(CC.OFFSET_INDEX_LENGTH)]
    before = [p.get(pm.PL.OFFSET) for p in pm.page_locations(pm.decode(raw))]
    after = [p.get(pm.PL.OFFSET) for p in pm.page_locations(pm.decode(
        pm.shift_offset_index(raw, -123)))]
    assert len(before) > 1 and after == [b - 123 for b in before]


# -- read_footer ---------------------------------------------------------------------


def test_read_footer_uses_one_get_for_small_footers_and_two_for_large(store):
    small = write_parquet(make_table(500), row_group_size=100)
    m = store.put("small.parquet", small)
    cs = CountingStore(store)
    footer, fmd, start = sp.read_footer(cs, "small.parquet", m.etag, m.size)
    assert cs.gets == 1 and footer == footer_of(small) and start == len(small) - 8 - len(footer)
    big = write_parquet(make_table(3000), row_group_size=10)  # 300 groups: footer > 64 KiB
    assert len(footer_of(big)) > sp.FOOTER_PROBE
    m = store.put("big.parquet", big)
    cs = CountingStore(store)
    footer, fmd, start = sp.read_footer(cs, "big.parquet", m.etag)  # size via HEAD
    assert cs.gets == 2 and footer == footer_of(big) and len(pm.row_groups(fmd)) == 300


def test_read_footer_pins_the_etag(store):
    m = store.put("f.parquet", write_parquet(make_table(100)))
    store.put("f.parquet", write_parquet(make_table(101)), mode=PutMode.OVERWRITE)
    with pytest.raises(PreconditionFailed):
        sp.read_footer(store, "f.parquet", m.etag, m.size)
    with pytest.raises(PreconditionFailed):
        sp.rewrite_row_groups(store, "f.parquet", m.etag, m.size, {0: [1]})


# -- splicing through the local store -------------------------------------------------

N_ROWS, GROUP = 4000, 1000
CODECS = ["zstd", "snappy", "gzip", "none"]
EDITS = {
    "first": {0: [0, 1, 500, 999]},
    "middle": {2: range(10, 900, 7)},
    "last": {3: [999]},
    "whole-group": {1: range(1000)},
    "several": {0: {5}, 2: np.arange(0, 1000, 2), 3: range(1000)},
    "erased": {1: [234]},  # row 1234 holds ERASED
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dictionary", [True, False], ids=["dict", "plain"])
def test_splice_matrix(store, tmp_path, codec, dictionary):
    table = make_table(N_ROWS, seed=1, erased_at=1234)
    kw = dict(compression=codec, use_dictionary=dictionary, row_group_size=GROUP,
              write_page_index=(codec in ("zstd", "none")), max_rows_per_page=128)
    if codec == "none":
        kw["bloom_filter_options"] = {"s": {"ndv": 1000, "fpp": 0.05}}
    src = write_parquet(table, **kw)
    m = store.put("src.parquet", src)
    old_fmd = pm.decode(footer_of(src))
    old_ranges = [pm.row_group_range(rg) for rg in pm.row_groups(old_fmd)]
    for name, dels in EDITS.items():
        cs = CountingStore(store)
        plan = sp.rewrite_row_groups(cs, "src.parquet", m.etag, m.size, dels)
        assert plan.path == "splice"
        assert plan.get_requests == cs.gets <= 2 + len(dels)  # footer, groups, tail
        meta = sp.assemble(store, plan, f"out-{name}.parquet")
        data, _ = store.get(f"out-{name}.parquet")
        assert len(data) == meta.size == plan.new_size
        exp = expected_after(src, plan)
        assert plan.new_num_rows == exp.num_rows
        check_readable(data, exp, tmp_path, name)
        # uploads: only re-encoded groups and the metadata tail (no padding: min part 0)
        new_fmd = pm.decode(footer_of(data))
        new_groups = pm.row_groups(new_fmd)
        edited_new = sum(
            pm.row_group_range(new_groups[plan.group_map[g]])[1]
            - pm.row_group_range(new_groups[plan.group_map[g]])[0]
            for g in dels if plan.group_map[g] is not None)
        new_data_end = max([pm.row_group_range(rg)[1] for rg in new_groups], default=4)
        magic = 4 if 0 in dels else 0  # "PAR1" is uploaded with an edited first group
        assert plan.bytes_uploaded == magic + edited_new + (len(data) - new_data_end)
        edited_old = sum(old_ranges[g][1] - old_ranges[g][0] for g in dels)
        assert edited_new <= edited_old + 4096
        assert plan.bytes_copied == plan.new_size - plan.bytes_uploaded
        # the whole group went away, groups after it shifted
        if name == "whole-group":
            assert plan.group_map == [0, None, 1, 2] and len(new_groups) == 3
        if name == "erased":
            assert ERASED.encode() in src
            assert ERASED.encode() not in data
        # untouched groups are byte-identical copies
        for g, ng in enumerate(plan.group_map):
            if g not in dels and ng is not None:
                s, e = old_ranges[g]
                ns, ne = pm.row_group_range(new_groups[ng])
                assert data[ns:ne] == src[s:e]


def test_delete_every_row(store, tmp_path):
    table = make_table(300)
    m = store.put("src.parquet", write_parquet(table, row_group_size=100))
    plan = sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size,
                                 {g: range(100) for g in range(3)})
    assert plan.new_num_rows == 0 and plan.path == "rewrite"
    sp.assemble(store, plan, "empty.parquet")
    data, _ = store.get("empty.parquet")
    got = pq.read_table(io.BytesIO(data))
    assert got.num_rows == 0 and got.schema.equals(table.schema)
    path = tmp_path / "empty.parquet"
    path.write_bytes(data)
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{path}')").fetchall()[0][0] == 0


def test_other_physical_layouts(store, tmp_path):
    """Data page v2 with CRCs, non-dictionary special encodings, format 1.0, sorted groups."""
    table = make_table(3000, seed=4)
    for i, kw in enumerate([
        dict(data_page_version="2.0", write_page_checksum=True, compression="zstd"),
        dict(use_dictionary=["s"], column_encoding={"id": "DELTA_BINARY_PACKED",
                                                     "f": "BYTE_STREAM_SPLIT"}),
        dict(version="2.4", compression="gzip", sorting_columns=[pq.SortingColumn(0)]),
        dict(store_schema=False, compression="brotli", write_statistics=["id"]),
    ]):
        src = write_parquet(table, row_group_size=1000, **kw)
        m = store.put(f"src{i}.parquet", src)
        plan = sp.rewrite_row_groups(store, f"src{i}.parquet", m.etag, m.size, {1: [0, 7, 999]})
        sp.assemble(store, plan, f"out{i}.parquet")
        data, _ = store.get(f"out{i}.parquet")
        exp = expected_after(src, plan)
        check_readable(data, exp, tmp_path, f"layout{i}")
        old = pm.decode(footer_of(src))
        new = pm.decode(footer_of(data))
        for a, b in zip(pm.columns(pm.row_groups(old)[1]), pm.columns(pm.row_groups(new)[1])):
            ma, mb = pm.meta(a), pm.meta(b)
            assert ma.get(CMD.CODEC) == mb.get(CMD.CODEC)
            assert set(ma.get(CMD.ENCODINGS).items) == set(mb.get(CMD.ENCODINGS).items)
            assert ma.has(CMD.STATISTICS) == mb.has(CMD.STATISTICS)
        if "sorting_columns" in kw:
            assert pm.row_groups(new)[1].get(RG.SORTING_COLUMNS) is not None


def test_row_position_mapping(store):
    table = make_table(300)
    m = store.put("src.parquet", write_parquet(table, row_group_size=100))
    plan = sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size,
                                 {0: [3, 4], 1: range(100), 2: {50}})
    assert plan.removed_file_positions().tolist() == [3, 4] + list(range(100, 200)) + [250]
    # a deletion vector of old positions 2, 3, 10, 150, 260 → 3 and 150 are gone
    assert plan.remap_positions([2, 3, 10, 150, 260]).tolist() == [2, 8, 260 - 103]
    sp.assemble(store, plan, "out.parquet")
    ids = pq.read_table(store.local_path("out.parquet")).column("id").to_numpy()
    assert ids[plan.remap_positions([2, 10, 260])].tolist() == [2, 10, 260]


def test_bad_deletions_are_rejected(store):
    m = store.put("src.parquet", write_parquet(make_table(300), row_group_size=100))
    for dels in ({3: [0]}, {0: [100]}, {0: [-1]}, {}, {1: []}):
        with pytest.raises(ConfigurationError):
            sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size, dels)


def test_assemble_aborts_on_failure(store):
    m = store.put("src.parquet", write_parquet(make_table(3000), row_group_size=1000))
    plan = sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size, {1: [1]})
    with pytest.raises(StoreError):
        sp.assemble(CountingStore(store, fail_copy=True), plan, "out.parquet")
    assert list(store.list_multipart()) == []
    assert [o.key for o in store.list()] == ["src.parquet"]
    sp.assemble(store, plan, "out.parquet")
    with pytest.raises(PreconditionFailed):  # CREATE: never replaces an object
        sp.assemble(store, plan, "out.parquet")
    assert list(store.list_multipart()) == []


# -- part planning -------------------------------------------------------------------


def test_plan_parts_respects_min_part_size():
    rng = random.Random(7)
    source = bytes(rng.getrandbits(8) for _ in range(4000))
    for trial in range(300):
        segs = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5:
                a = rng.randint(0, 3000)
                segs.append(sp.Copy(a, a + rng.randint(0, 900)))
            else:
                segs.append(sp.Upload(bytes([trial % 256]) * rng.randint(0, 700)))
        segs.append(sp.Upload(b"FOOTER" * rng.randint(1, 20)))
        want = b"".join(source[s.src_start : s.src_end] if isinstance(s, sp.Copy) else s.data
                        for s in segs)
        min_part = rng.choice([0, 1, 100, 500, 1000])
        parts = sp.plan_parts(segs, min_part, lambda a, b: source[a:b], max_part=2000)
        got = b"".join(source[p.src_start : p.src_end] if isinstance(p, sp.Copy) else p.data
                       for p in parts)
        assert got == want
        assert all(p.size >= min_part for p in parts[:-1])
        assert all(p.size <= 2000 for p in parts if isinstance(p, sp.Copy))
        assert isinstance(parts[-1], sp.Upload) and parts[-1].data.endswith(segs[-1].data)


def test_small_parts_padded_through_enforcing_store(store, tmp_path):
    """min_part_size enforced locally: groups smaller than a part borrow copy bytes."""
    table = make_table(20000, seed=2)
    src = write_parquet(table, row_group_size=2000, compression="none")
    m = store.put("src.parquet", src)
    min_part = 64 * 1024
    groups = [pm.row_group_range(rg) for rg in pm.row_groups(pm.decode(footer_of(src)))]
    assert all(e - s < min_part * 2 for s, e in groups)
    for name, dels in {"first": {0: [1]}, "mid": {5: [7]}, "last": {9: [3]},
                       "two": {2: [0], 6: range(2000)}}.items():
        cs = CountingStore(store, min_part_size=min_part)
        plan = sp.rewrite_row_groups(cs, "src.parquet", m.etag, m.size, dels)
        assert plan.path == "splice" and plan.bytes_copied > 0
        assert all(p.size >= min_part for p in plan.parts[:-1])
        sp.assemble(cs, plan, f"out-{name}.parquet")
        data, _ = store.get(f"out-{name}.parquet")
        check_readable(data, expected_after(src, plan), tmp_path, name)
        edited = sum(groups[g][1] - groups[g][0] for g in dels)
        # padding: at most two parts' worth of borrowed bytes around each edit
        assert plan.bytes_uploaded <= edited + 2 * min_part * len(dels) + len(plan.footer) + 64


def test_equal_part_store_gets_a_full_rewrite(store, tmp_path):
    table = make_table(20000, seed=3)
    src = write_parquet(table, row_group_size=2000, compression="none")
    m = store.put("src.parquet", src)
    cs = CountingStore(store, min_part_size=64 * 1024, equal_part_sizes=True)
    plan = sp.rewrite_row_groups(cs, "src.parquet", m.etag, m.size, {4: [0, 1]})
    assert plan.path == "rewrite" and plan.bytes_copied == 0
    assert plan.bytes_uploaded == plan.new_size
    sizes = {p.size for p in plan.parts[:-1]}
    assert len(sizes) <= 1
    sp.assemble(cs, plan, "out.parquet")
    check_readable(store.get("out.parquet")[0], expected_after(src, plan), tmp_path)


# -- S3 on the moto server (tests/conftest.py: s3_uri) -----------------------------


def big_table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": np.arange(n, dtype=np.int64),
        "s": pa.array([f"{v:016x}" for v in rng.integers(0, 2**62, n)]),
        "v": rng.normal(size=n),
    })


@pytest.mark.s3
def test_splice_on_s3_moto_obeys_entity_too_small(s3_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FLIGHTSRV_S3_EQUAL_PARTS", "0")
    s3 = open_store(s3_uri)
    assert not s3.equal_part_sizes
    assert s3.min_part_size == 5 * 1024 * 1024
    table = big_table(600_000, 5)
    src = write_parquet(table, row_group_size=100_000, compression="snappy")
    assert len(src) > 10 * 1024 * 1024
    groups = [pm.row_group_range(rg) for rg in pm.row_groups(pm.decode(footer_of(src)))]
    assert all(e - s < s3.min_part_size for s, e in groups)  # every edit needs padding
    m = s3.put("src.parquet", src)

    # a multipart upload with a small non-last part is refused by moto, as by S3
    uid = s3.create_multipart("bad.parquet")
    done = [s3.upload_part_copy("bad.parquet", uid, 1, "src.parquet", 0, 1024),
            s3.upload_part("bad.parquet", uid, 2, b"x")]
    with pytest.raises(StoreError, match="EntityTooSmall"):
        s3.complete_multipart("bad.parquet", uid, done)
    s3.abort_multipart("bad.parquet", uid)

    cases = {"first": {0: [0, 5]}, "middle": {3: range(0, 100_000, 3)}, "last": {5: [99_999]},
             "whole": {2: range(100_000)}}
    for name, dels in cases.items():
        plan = sp.rewrite_row_groups(s3, "src.parquet", m.etag, m.size, dels)
        assert plan.path == "splice", plan.summary()
        assert all(p.size >= s3.min_part_size for p in plan.parts[:-1])
        meta = sp.assemble(s3, plan, f"out-{name}.parquet")
        data, _ = s3.get(f"out-{name}.parquet", etag=meta.etag)
        assert len(data) == plan.new_size
        exp = table.take(pa.array(np.setdiff1d(np.arange(table.num_rows),
                                               plan.removed_file_positions())))
        assert pq.read_table(io.BytesIO(data)).equals(exp)
        path = tmp_path / f"{name}.parquet"
        path.write_bytes(data)
        res = duckdb.sql(f"SELECT count(*), sum(id), min(s), max(s) FROM read_parquet('{path}')"
                         ).fetchall()[0]
        ids = exp.column("id").to_numpy()
        assert res[0] == exp.num_rows and res[1] == int(ids.sum())
        assert (res[2], res[3]) == (min(exp.column("s").to_pylist()),
                                    max(exp.column("s").to_pylist()))
        edited = sum(groups[g][1] - groups[g][0] for g in dels)
        assert plan.bytes_uploaded <= edited + 2 * s3.min_part_size + len(plan.footer) + 64
        assert plan.bytes_copied >= len(src) - edited - 2 * s3.min_part_size - len(plan.footer)
    assert list(s3.list_multipart()) == []


@pytest.mark.s3
def test_equal_part_sizes_on_s3_moto(s3_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("FLIGHTSRV_S3_EQUAL_PARTS", "1")  # behave like Cloudflare R2
    s3 = open_store(s3_uri)
    assert s3.equal_part_sizes
    table = big_table(400_000, 6)
    src = write_parquet(table, row_group_size=100_000, compression="none")
    m = s3.put("src.parquet", src)
    plan = sp.rewrite_row_groups(s3, "src.parquet", m.etag, m.size, {1: [4]})
    assert plan.path == "rewrite" and plan.bytes_copied == 0
    assert len({p.size for p in plan.parts[:-1]}) <= 1
    meta = sp.assemble(s3, plan, "out.parquet")
    data, _ = s3.get("out.parquet", etag=meta.etag)
    exp = table.take(pa.array(np.setdiff1d(np.arange(table.num_rows),
                                           plan.removed_file_positions())))
    assert pq.read_table(io.BytesIO(data)).equals(exp)


# -- unknown footer fields, refusal, randomized splices ------------------------------------


def with_footer(data: bytes, fmd: TStruct) -> bytes:
    """The same data pages under a different footer."""
    n = pm.parse_footer_tail(data[-8:])
    return data[: len(data) - 8 - n] + pm.footer_frame(pm.encode(fmd))


def test_unknown_footer_fields_survive_a_splice(store, tmp_path):
    src = write_parquet(make_table(3000), row_group_size=1000)
    fmd = pm.decode(footer_of(src))
    fmd.set(99, pm.BINARY, b"future-field")  # ids a newer writer might add
    pm.columns(pm.row_groups(fmd)[2])[0].set(77, pm.I64, 123456)
    pm.row_groups(fmd)[0].set(50, pm.LIST, TList(pm.I32, [1, 2, 3]))
    src = with_footer(src, fmd)
    assert pq.read_table(io.BytesIO(src)).num_rows == 3000  # readers skip unknown ids
    m = store.put("src.parquet", src)
    plan = sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size, {1: [5, 6]})
    sp.assemble(store, plan, "out.parquet")
    data, _ = store.get("out.parquet")
    check_readable(data, expected_after(src, plan), tmp_path)
    new = pm.decode(footer_of(data))
    assert new.get(99) == b"future-field"
    assert pm.columns(pm.row_groups(new)[2])[0].get(77) == 123456
    assert pm.row_groups(new)[0].get(50).items == [1, 2, 3]


def test_splice_refuses_what_pyarrow_cannot_reproduce(store):
    src = write_parquet(make_table(2000), row_group_size=1000)
    fmd = pm.decode(footer_of(src))
    fmd.get(pm.FMD.SCHEMA).items[1].set(99, pm.I32, 1)  # schema detail pyarrow won't write
    src = with_footer(src, fmd)
    m = store.put("src.parquet", src)
    with pytest.raises(sp.SpliceUnsupported):
        sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size, {0: [1]})


def test_randomized_splices(store, tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for trial in range(12):
        n_groups, group = rng.randint(1, 5), rng.choice([50, 333, 1000])
        table = make_table(n_groups * group, seed=trial)
        kw = dict(row_group_size=group, compression=rng.choice(CODECS + ["lz4", "brotli"]),
                  use_dictionary=rng.choice([True, False]),
                  write_page_index=rng.choice([True, False]),
                  data_page_version=rng.choice(["1.0", "2.0"]),
                  max_rows_per_page=rng.choice([None, 64]))
        src = write_parquet(table, **kw)
        m = store.put(f"src{trial}.parquet", src)
        dels = {}
        for g in rng.sample(range(n_groups), rng.randint(1, n_groups)):
            k = rng.choice([1, group // 3, group])
            dels[g] = rng.sample(range(group), k)
        cs = CountingStore(store, min_part_size=rng.choice([0, 4096, 32768]))
        plan = sp.rewrite_row_groups(cs, f"src{trial}.parquet", m.etag, m.size, dels)
        sp.assemble(cs, plan, f"out{trial}.parquet")
        data, _ = store.get(f"out{trial}.parquet")
        try:
            check_readable(data, expected_after(src, plan), tmp_path, f"r{trial}")
        except AssertionError:
            sizes = {g: len(v) for g, v in dels.items()}
            print(f"replay: seed={seed} trial={trial} kw={kw} deleted={sizes}")
            raise


def test_assemble_refuses_a_source_that_changed_after_planning(store):
    src = write_parquet(make_table(3000), row_group_size=1000)
    m = store.put("src.parquet", src)
    plan = sp.rewrite_row_groups(store, "src.parquet", m.etag, m.size, {1: [1]})
    store.put("src.parquet", src, mode=PutMode.OVERWRITE)  # same bytes, new version
    with pytest.raises(PreconditionFailed):
        sp.assemble(store, plan, "out.parquet")
    assert list(store.list_multipart()) == []
    assert [o.key for o in store.list()] == ["src.parquet"]
