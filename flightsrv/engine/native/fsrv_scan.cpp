/* fsrv_scan: flightsrv's deletion masks applied by DuckDB's own Parquet reader (C++ API).
 *
 * What it registers: the table function __fsrv_scan, which is DuckDB's read_parquet (every
 * overload, every option, its virtual columns) with one more named parameter, fsrv_slot :=
 * <k>. The files of the call are read with the masks of slot k: file i of the call's file
 * list (in the order given) gets the slot's mask i as the reader's deletion filter, the hook
 * DuckDB's Parquet reader applies to each vector of rows before it evaluates any pushed-down
 * filter or hands a row up, so a deleted row never leaves the scan. A file the slot holds no
 * mask for, a path the list does not name or a call without fsrv_slot fails the statement:
 * a file is never read without its mask. And the mask functions of the C-API kind
 * (fsrv_mask.c), __fsrv_live_<k>([UBIGINT file_index,] BIGINT position) -> BOOLEAN over the
 * same slots, for reads that select a few rows by a pushed-down filter first (a point read:
 * the reader's own filters run fastest without a deletion filter, and the mask is then
 * evaluated on the rows they keep).
 *
 * Who fills the slots: only the host process, through fsrv_mask_set_files (an exported C
 * symbol that flightsrv calls with ctypes, with the same signature and layout as the C-API
 * extension fsrv_mask.c), never SQL. flightsrv's guard refuses every function that is not on
 * its allow-list, so user SQL cannot call __fsrv_scan. A slot is written only while no
 * statement reads it (flightsrv pins the slots a statement uses), so readers take no lock.
 *
 * Built against the headers of the exact DuckDB release that loads it (C++ extensions have
 * no stable ABI: DuckDB's loader refuses a file whose footer names another version) and
 * linked against the loaded _duckdb module, whose C++ symbols it uses. */
#include "duckdb/catalog/catalog_entry/table_function_catalog_entry.hpp"
#include "duckdb/common/multi_file/base_file_reader.hpp"
#include "duckdb/common/multi_file/multi_file_data.hpp"
#include "duckdb/common/multi_file/multi_file_function.hpp"
#include "duckdb/common/multi_file/multi_file_reader.hpp"
#include "duckdb/function/scalar_function.hpp"
#include "duckdb/function/table_function.hpp"
#include "duckdb/main/extension/extension_loader.hpp"

#include <cstdint>
#include <cstring>
#include <unordered_map>

#include "fsrv_slots.h"

#define FSRV_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace duckdb;

using FileMask = fsrv_file_mask;
using Slot = fsrv_slot;

//! The reader's deletion filter for one file: the kept rows of a vector as a selection
class MaskFilter : public DeleteFilter {
public:
	explicit MaskFilter(FileMask mask_p) : mask(mask_p) {
	}

	idx_t Filter(row_t start, idx_t count, SelectionVector &result_sel) override {
		const uint64_t p0 = static_cast<uint64_t>(start);
		if (start < 0 || p0 >= mask.nbits || count == 0) {
			return count; // past the bitmap every position is live; an unset selection keeps all
		}
		const idx_t covered = p0 + count <= mask.nbits ? count : static_cast<idx_t>(mask.nbits - p0);
		sel_t *out = nullptr;
		idx_t kept = 0;
		idx_t i = 0;
		while (i < covered) {
			const uint64_t p = p0 + i;
			uint64_t deleted;
			idx_t take;
			if ((p & 63) == 0 && i + 64 <= covered) { // 64 positions per bitmap word
				memcpy(&deleted, mask.bits + (p >> 3), sizeof(deleted));
				take = 64;
			} else {
				deleted = (mask.bits[p >> 3] >> (p & 7)) & 1;
				take = 1;
			}
			if (deleted == 0) {
				if (out) {
					for (idx_t k = 0; k < take; k++) {
						out[kept + k] = static_cast<sel_t>(i + k);
					}
				}
				kept += take;
			} else {
				if (!out) { // the first deleted row of this vector: the rows before it were all kept
					result_sel.Initialize(STANDARD_VECTOR_SIZE);
					out = result_sel.data();
					for (idx_t k = 0; k < kept; k++) {
						out[k] = static_cast<sel_t>(k);
					}
				}
				uint64_t live = ~deleted;
				if (take < 64) {
					live &= 1;
				}
				while (live) {
					out[kept++] = static_cast<sel_t>(i + static_cast<idx_t>(__builtin_ctzll(live)));
					live &= live - 1;
				}
			}
			i += take;
		}
		if (!out) {
			return count;
		}
		for (; i < count; i++) {
			out[kept++] = static_cast<sel_t>(i);
		}
		return kept;
	}

private:
	FileMask mask;
};

//! read_parquet's multi-file reader, plus: the slot named by fsrv_slot, the call's own file list
//! (to find each file's mask by its path), and the deletion filter set on every file's reader
struct MaskedMultiFileReader : public MultiFileReader {
	static constexpr uint32_t NO_SLOT = UINT32_MAX;
	uint32_t slot = NO_SLOT;
	std::unordered_map<string, idx_t> file_index;

	static unique_ptr<MultiFileReader> Create(const BoundTableFunction &) {
		return make_uniq<MaskedMultiFileReader>();
	}

	vector<OpenFileInfo> ParseFileList(const Value &input) override {
		auto files = MultiFileReader::ParseFileList(input);
		file_index.clear();
		for (idx_t i = 0; i < files.size(); i++) {
			file_index.emplace(files[i].path, i);
		}
		return files;
	}

	bool ParseOption(const Identifier &key, const Value &val, MultiFileOptions &options,
	                 ClientContext &context) override {
		if (key.GetIdentifierName() == "fsrv_slot") {
			auto k = val.GetValue<int64_t>();
			if (k < 0 || k >= FSRV_MASK_SLOTS) {
				throw InvalidInputException("__fsrv_scan: no mask slot %lld", static_cast<long long>(k));
			}
			slot = static_cast<uint32_t>(k);
			return true;
		}
		return MultiFileReader::ParseOption(key, val, options, context);
	}

	unique_ptr<MultiFileReader> Copy() const override {
		auto copy = make_uniq<MaskedMultiFileReader>();
		copy->function_name = function_name;
		copy->slot = slot;
		copy->file_index = file_index;
		return std::move(copy);
	}

	ReaderInitializeType InitializeReader(MultiFileReaderData &reader_data, const MultiFileBindData &bind_data,
	                                      const vector<MultiFileColumnDefinition> &global_columns,
	                                      const vector<ColumnIndex> &global_column_ids,
	                                      optional_ptr<TableFilterSet> table_filters, ClientContext &context,
	                                      MultiFileGlobalState &gstate) override {
		auto result = MultiFileReader::InitializeReader(reader_data, bind_data, global_columns, global_column_ids,
		                                                table_filters, context, gstate);
		auto &reader = *reader_data.reader;
		if (slot == NO_SLOT) {
			throw InvalidInputException("__fsrv_scan needs fsrv_slot");
		}
		auto entry = file_index.find(reader.file.path);
		const Slot &s = slots[slot];
		if (entry == file_index.end() || entry->second >= s.nfiles) {
			throw InvalidInputException("__fsrv_scan: no deletion mask for a file of slot %u", slot);
		}
		const FileMask &mask = s.files[entry->second];
		if (mask.nbits > 0) {
			reader.deletion_filter = make_uniq<MaskFilter>(mask);
		}
		return result;
	}
};

bool RowLive(const FileMask &m, int64_t p) {
	const uint64_t u = static_cast<uint64_t>(p);
	return p < 0 || !(u < m.nbits && ((m.bits[u >> 3] >> (u & 7)) & 1));
}

//! __fsrv_live_<k>(position): the mask of slot k's file 0 (an empty slot: all live); and
//! __fsrv_live_<k>(file_index, position): the mask of file file_index of the slot (a file index
//! the slot holds no mask for is not live). A NULL argument is not a live row.
void Live(uint32_t k, bool with_file, DataChunk &args, Vector &result) {
	const idx_t count = args.size();
	const Slot &s = slots[k];
	static const FileMask no_deletes = {nullptr, 0};
	UnifiedVectorFormat pos_f, fi_f;
	args.data[with_file ? 1 : 0].ToUnifiedFormat(count, pos_f);
	const auto pos = UnifiedVectorFormat::GetData<int64_t>(pos_f);
	const uint64_t *fi = nullptr;
	if (with_file) {
		args.data[0].ToUnifiedFormat(count, fi_f);
		fi = UnifiedVectorFormat::GetData<uint64_t>(fi_f);
	}
	result.SetVectorType(VectorType::FLAT_VECTOR);
	auto out = FlatVector::GetDataMutable<bool>(result);
	for (idx_t i = 0; i < count; i++) {
		const idx_t pi = pos_f.sel->get_index(i);
		if (!pos_f.validity.RowIsValid(pi)) {
			out[i] = false;
			continue;
		}
		if (!with_file) {
			out[i] = RowLive(s.nfiles > 0 ? s.files[0] : no_deletes, pos[pi]);
			continue;
		}
		const idx_t fidx = fi_f.sel->get_index(i);
		if (!fi_f.validity.RowIsValid(fidx) || fi[fidx] >= s.nfiles) {
			out[i] = false;
			continue;
		}
		out[i] = RowLive(s.files[fi[fidx]], pos[pi]);
	}
}

} // namespace

FSRV_EXPORT void fsrv_scan_duckdb_cpp_init(duckdb::ExtensionLoader &loader) {
	using namespace duckdb;
	auto &parquet = loader.GetTableFunction(Identifier("read_parquet"));
	TableFunctionSet set(Identifier("__fsrv_scan"));
	for (auto &overload : parquet.functions.functions) {
		TableFunction fn = *overload;
		fn.name = "__fsrv_scan";
		fn.get_multi_file_reader = MaskedMultiFileReader::Create;
		// the files' row counts count deleted rows: count(*) must read the rows, not the footers
		fn.get_partition_stats = nullptr;
		fn.GetSignature().ExtendTypedKwargs(
		    [](TypedKwargs &options) { options.Add(Identifier("fsrv_slot"), LogicalType::BIGINT); });
		set.AddFunction(std::move(fn));
	}
	loader.RegisterFunction(std::move(set));

	for (uint32_t k = 0; k < FSRV_MASK_SLOTS; k++) {
		const string name = "__fsrv_live_" + std::to_string(k);
		ScalarFunctionSet live(Identifier(name.c_str()));
		live.AddFunction(ScalarFunction(Identifier(name.c_str()), {LogicalType::BIGINT}, LogicalType::BOOLEAN,
		                                [k](DataChunk &args, ExpressionState &, Vector &result) {
			                                Live(k, false, args, result);
		                                }));
		live.AddFunction(ScalarFunction(Identifier(name.c_str()), {LogicalType::UBIGINT, LogicalType::BIGINT},
		                                LogicalType::BOOLEAN, [k](DataChunk &args, ExpressionState &, Vector &result) {
			                                Live(k, true, args, result);
		                                }));
		loader.RegisterFunction(std::move(live));
	}
}
