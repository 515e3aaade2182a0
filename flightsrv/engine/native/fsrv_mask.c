/* fsrv_mask: flightsrv's deletion masks as DuckDB scalar functions (C extension API v1.2.0).
 *
 * What it registers: FSRV_MASK_SLOTS scalar functions __fsrv_live_<k>, one per slot k, each
 * with two forms:
 *   __fsrv_live_<k>(BIGINT position) -> BOOLEAN: true unless bit `position` of the slot's
 *     (first) file mask is set (the row is deleted);
 *   __fsrv_live_<k>(UBIGINT file_index, BIGINT position) -> BOOLEAN: the same against the
 *     mask of file `file_index` of the slot (the files of one read_parquet list, in order);
 *     false for a file index the slot holds no mask for.
 * Nothing else: no table function, no setting, no file access, and no SQL function that
 * writes a slot.
 *
 * Who fills the slots: only the host process, through fsrv_mask_set_files / fsrv_mask_set
 * (exported C symbols that flightsrv calls with ctypes), never SQL. flightsrv's guard
 * refuses every function that is not on its allow-list, so user SQL cannot call
 * __fsrv_live_<k> either.
 *
 * A slot is written only while no statement reads it (flightsrv pins the slots a statement
 * uses and rewrites only unpinned ones), so the scalar functions read it without a lock. */
#define DUCKDB_EXTENSION_NAME fsrv_mask
#include "duckdb_extension.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

DUCKDB_EXTENSION_EXTERN

#include "fsrv_slots.h"

static uint32_t slot_ids[FSRV_MASK_SLOTS];

/* Replace slot `slot` with a copy of one file's mask: `nbytes` bytes of `bits` covering
 * `nbits` positions (file_index 0); an empty mask (nbytes 0) empties the slot. */
__attribute__((visibility("default"))) int fsrv_mask_set(uint32_t slot, const uint8_t *bits,
                                                         uint64_t nbytes, uint64_t nbits) {
	uint64_t offsets[2] = {0, nbytes};
	if (nbytes == 0 && nbits == 0) {
		return fsrv_mask_set_files(slot, 0, NULL, 0, NULL, NULL);
	}
	return fsrv_mask_set_files(slot, 1, bits, nbytes, offsets, &nbits);
}

/* lut[b]: the eight output booleans (little-endian bytes) of bitmap byte b: 1 where the bit
 * is clear (the row is live), 0 where it is set (deleted) */
static uint64_t lut[256];

static void init_lut(void) {
	for (unsigned b = 0; b < 256; b++) {
		uint64_t v = 0;
		for (unsigned j = 0; j < 8; j++) {
			if (!((b >> j) & 1)) {
				v |= (uint64_t)1 << (8 * j);
			}
		}
		lut[b] = v;
	}
}

/* out[0..n) for the consecutive positions p0, p0 + 1, ... of mask m */
static void mask_run(const fsrv_file_mask *m, uint64_t p0, idx_t n, bool *out) {
	const uint8_t *bits = m->bits;
	uint64_t nbits = m->nbits;
	idx_t i = 0;
	if (p0 < nbits && (p0 & 7) == 0) {
		/* eight rows per bitmap byte, 64 rows per word; a word with no deleted row is a
		 * run of trues */
		idx_t whole = (idx_t)((nbits - p0) / 8);
		if (whole > n / 8) {
			whole = n / 8;
		}
		const uint8_t *b = bits + (p0 >> 3);
		idx_t j = 0;
		for (; j + 8 <= whole; j += 8) {
			uint64_t w;
			memcpy(&w, b + j, 8);
			if (w == 0) {
				memset(out + 8 * j, 1, 64);
			} else {
				for (idx_t t = 0; t < 8; t++) {
					memcpy(out + 8 * (j + t), &lut[b[j + t]], 8);
				}
			}
		}
		for (; j < whole; j++) {
			memcpy(out + 8 * j, &lut[b[j]], 8);
		}
		i = 8 * whole;
	}
	for (; i < n; i++) {
		uint64_t p = p0 + i;
		if (p >= nbits) { /* past the bitmap: every later position is live */
			memset(out + i, 1, n - i);
			break;
		}
		out[i] = !((bits[p >> 3] >> (p & 7)) & 1);
	}
}

/* whether pos[0..n) is p0, p0 + 1, ... (the usual vector of a Parquet read's
 * file_row_number; a NULL row's position is whatever its slot holds: the check then fails
 * or the validity pass clears it) */
static bool consecutive(const int64_t *pos, idx_t n) {
	uint64_t p0 = (uint64_t)pos[0];
	uint64_t apart = 0;
	for (idx_t k = 0; k < n; k++) {
		apart |= (uint64_t)pos[k] ^ (p0 + k);
	}
	return apart == 0 && pos[0] >= 0;
}

static bool row_live(const fsrv_file_mask *m, int64_t p) {
	uint64_t u = (uint64_t)p;
	return p < 0 || !(u < m->nbits && ((m->bits[u >> 3] >> (u & 7)) & 1));
}

static void clear_invalid(duckdb_vector v, idx_t n, bool *out) {
	uint64_t *valid = duckdb_vector_get_validity(v);
	if (valid) { /* file_row_number and file_index are never NULL; a NULL is not a live row */
		for (idx_t k = 0; k < n; k++) {
			if (!duckdb_validity_row_is_valid(valid, k)) {
				out[k] = false;
			}
		}
	}
}

static const fsrv_file_mask no_deletes = {NULL, 0};

/* __fsrv_live_<k>(file_row_number): the mask of the slot's file 0 (an empty slot: all live) */
static void live(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	const fsrv_slot *s = &slots[*(const uint32_t *)duckdb_scalar_function_get_extra_info(info)];
	const fsrv_file_mask *m = s->nfiles > 0 ? &s->files[0] : &no_deletes;
	idx_t n = duckdb_data_chunk_get_size(input);
	duckdb_vector pos_vec = duckdb_data_chunk_get_vector(input, 0);
	const int64_t *pos = (const int64_t *)duckdb_vector_get_data(pos_vec);
	bool *out = (bool *)duckdb_vector_get_data(output);
	if (n > 0 && consecutive(pos, n)) {
		mask_run(m, (uint64_t)pos[0], n, out);
	} else {
		for (idx_t k = 0; k < n; k++) {
			out[k] = row_live(m, pos[k]);
		}
	}
	clear_invalid(pos_vec, n, out);
}

/* __fsrv_live_<k>(file_index, file_row_number): the mask of the slot's file file_index; a
 * file index the slot has no mask for is not live */
static void live_files(duckdb_function_info info, duckdb_data_chunk input,
                       duckdb_vector output) {
	const fsrv_slot *s = &slots[*(const uint32_t *)duckdb_scalar_function_get_extra_info(info)];
	idx_t n = duckdb_data_chunk_get_size(input);
	duckdb_vector fi_vec = duckdb_data_chunk_get_vector(input, 0);
	duckdb_vector pos_vec = duckdb_data_chunk_get_vector(input, 1);
	const uint64_t *fi = (const uint64_t *)duckdb_vector_get_data(fi_vec);
	const int64_t *pos = (const int64_t *)duckdb_vector_get_data(pos_vec);
	bool *out = (bool *)duckdb_vector_get_data(output);
	if (n == 0) {
		return;
	}
	uint64_t f0 = fi[0];
	uint64_t other = 0;
	for (idx_t k = 0; k < n; k++) {
		other |= fi[k] ^ f0;
	}
	if (other == 0 && f0 < s->nfiles && consecutive(pos, n)) {
		mask_run(&s->files[f0], (uint64_t)pos[0], n, out);
	} else {
		for (idx_t k = 0; k < n; k++) {
			out[k] = fi[k] < s->nfiles && row_live(&s->files[fi[k]], pos[k]);
		}
	}
	clear_invalid(fi_vec, n, out);
	clear_invalid(pos_vec, n, out);
}

DUCKDB_EXTENSION_ENTRYPOINT(duckdb_connection connection, duckdb_extension_info info,
                            struct duckdb_extension_access *access) {
	init_lut();
	duckdb_logical_type bigint = duckdb_create_logical_type(DUCKDB_TYPE_BIGINT);
	duckdb_logical_type ubigint = duckdb_create_logical_type(DUCKDB_TYPE_UBIGINT);
	duckdb_logical_type boolean = duckdb_create_logical_type(DUCKDB_TYPE_BOOLEAN);
	bool ok = true;
	char name[32];
	for (uint32_t k = 0; k < FSRV_MASK_SLOTS && ok; k++) {
		slot_ids[k] = k;
		snprintf(name, sizeof(name), "__fsrv_live_%u", (unsigned)k);
		duckdb_scalar_function_set set = duckdb_create_scalar_function_set(name);
		for (int arity = 1; arity <= 2 && ok; arity++) {
			duckdb_scalar_function fn = duckdb_create_scalar_function();
			duckdb_scalar_function_set_name(fn, name);
			if (arity == 2) {
				duckdb_scalar_function_add_parameter(fn, ubigint);
			}
			duckdb_scalar_function_add_parameter(fn, bigint);
			duckdb_scalar_function_set_return_type(fn, boolean);
			duckdb_scalar_function_set_function(fn, arity == 1 ? live : live_files);
			duckdb_scalar_function_set_extra_info(fn, &slot_ids[k], NULL);
			ok = duckdb_add_scalar_function_to_set(set, fn) == DuckDBSuccess;
			duckdb_destroy_scalar_function(&fn);
		}
		ok = ok && duckdb_register_scalar_function_set(connection, set) == DuckDBSuccess;
		duckdb_destroy_scalar_function_set(&set);
	}
	duckdb_destroy_logical_type(&bigint);
	duckdb_destroy_logical_type(&ubigint);
	duckdb_destroy_logical_type(&boolean);
	if (!ok) {
		access->set_error(info, "fsrv_mask: could not register its functions");
	}
	return ok;
}
