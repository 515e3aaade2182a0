/* fsrv_mask: flightsrv's deletion masks as DuckDB scalar functions (C extension API v1.2.0).
 *
 * What it registers: FSRV_MASK_SLOTS scalar functions __fsrv_live_<k>(BIGINT) -> BOOLEAN,
 * one per slot k. __fsrv_live_<k>(file_row_number) is true unless bit file_row_number of
 * slot k's bitmap is set (the row is deleted). Nothing else: no table function, no setting,
 * no file access, and no SQL function that writes a slot.
 *
 * Who fills the slots: only the host process, through fsrv_mask_set (an exported C symbol
 * that flightsrv calls with ctypes), never SQL. flightsrv's guard refuses every function
 * that is not on its allow-list, so user SQL cannot call __fsrv_live_<k> either.
 *
 * A slot is written only while no statement reads it (flightsrv pins the slots a statement
 * uses and rewrites only unpinned ones), so the scalar function reads it without a lock. */
#define DUCKDB_EXTENSION_NAME fsrv_mask
#include "duckdb_extension.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

DUCKDB_EXTENSION_EXTERN

#ifndef FSRV_MASK_SLOTS
#define FSRV_MASK_SLOTS 1024
#endif

typedef struct {
	uint8_t *bits;  /* bit p set: position p is deleted */
	uint64_t nbits; /* positions at or past nbits are live */
} fsrv_slot;

static fsrv_slot slots[FSRV_MASK_SLOTS];
static uint32_t slot_ids[FSRV_MASK_SLOTS];

__attribute__((visibility("default"))) uint32_t fsrv_mask_slots(void) {
	return FSRV_MASK_SLOTS;
}

/* Replace slot `slot` with a copy of `nbytes` bytes of `bits` covering `nbits` positions;
 * 0 on success, -1 for a bad slot or size, -2 when out of memory (the slot is then empty). */
__attribute__((visibility("default"))) int fsrv_mask_set(uint32_t slot, const uint8_t *bits,
                                                         uint64_t nbytes, uint64_t nbits) {
	if (slot >= FSRV_MASK_SLOTS || nbytes < (nbits + 7) / 8) {
		return -1;
	}
	uint8_t *copy = NULL;
	if (nbytes > 0) {
		copy = (uint8_t *)malloc(nbytes);
		if (!copy) {
			free(slots[slot].bits);
			slots[slot].bits = NULL;
			slots[slot].nbits = 0;
			return -2;
		}
		memcpy(copy, bits, nbytes);
	}
	free(slots[slot].bits);
	slots[slot].bits = copy;
	slots[slot].nbits = copy ? nbits : 0;
	return 0;
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

static void live(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	const fsrv_slot *s = &slots[*(const uint32_t *)duckdb_scalar_function_get_extra_info(info)];
	idx_t n = duckdb_data_chunk_get_size(input);
	duckdb_vector pos_vec = duckdb_data_chunk_get_vector(input, 0);
	const int64_t *pos = (const int64_t *)duckdb_vector_get_data(pos_vec);
	const uint64_t *valid = duckdb_vector_get_validity(pos_vec);
	bool *out = (bool *)duckdb_vector_get_data(output);
	const uint8_t *bits = s->bits;
	uint64_t nbits = s->nbits;
	idx_t i = 0;
	uint64_t p0 = n > 0 ? (uint64_t)pos[0] : 1;
	uint64_t apart = p0 & 7; /* nonzero unless every position is p0 + its index */
	for (idx_t k = 0; k < n; k++) {
		apart |= (uint64_t)pos[k] ^ (p0 + k);
	}
	if (n > 0 && apart == 0) {
		/* the usual vector: consecutive positions from a byte boundary (a Parquet read's
		 * file_row_number), eight rows per bitmap byte; what lies past the bitmap is live
		 * (a NULL row's position is whatever its slot holds: the check above then fails
		 * or the validity pass below clears it) */
		idx_t whole = p0 < nbits ? (idx_t)((nbits - p0) / 8) : 0;
		if (whole > n / 8) {
			whole = n / 8;
		}
		const uint8_t *b = bits ? bits + (p0 >> 3) : NULL;
		for (idx_t j = 0; j < whole; j++) {
			memcpy(out + 8 * j, &lut[b[j]], 8);
		}
		i = 8 * whole;
	}
	for (; i < n; i++) {
		uint64_t p = (uint64_t)pos[i];
		out[i] = !(p < nbits && ((bits[p >> 3] >> (p & 7)) & 1));
	}
	if (valid) { /* file_row_number is never NULL; a NULL position is not a live row */
		for (idx_t k = 0; k < n; k++) {
			if (!duckdb_validity_row_is_valid((uint64_t *)valid, k)) {
				out[k] = false;
			}
		}
	}
}

DUCKDB_EXTENSION_ENTRYPOINT(duckdb_connection connection, duckdb_extension_info info,
                            struct duckdb_extension_access *access) {
	init_lut();
	duckdb_logical_type bigint = duckdb_create_logical_type(DUCKDB_TYPE_BIGINT);
	duckdb_logical_type boolean = duckdb_create_logical_type(DUCKDB_TYPE_BOOLEAN);
	bool ok = true;
	char name[32];
	for (uint32_t k = 0; k < FSRV_MASK_SLOTS && ok; k++) {
		slot_ids[k] = k;
		snprintf(name, sizeof(name), "__fsrv_live_%u", (unsigned)k);
		duckdb_scalar_function fn = duckdb_create_scalar_function();
		duckdb_scalar_function_set_name(fn, name);
		duckdb_scalar_function_add_parameter(fn, bigint);
		duckdb_scalar_function_set_return_type(fn, boolean);
		duckdb_scalar_function_set_function(fn, live);
		duckdb_scalar_function_set_extra_info(fn, &slot_ids[k], NULL);
		ok = duckdb_register_scalar_function(connection, fn) == DuckDBSuccess;
		duckdb_destroy_scalar_function(&fn);
	}
	duckdb_destroy_logical_type(&bigint);
	duckdb_destroy_logical_type(&boolean);
	if (!ok) {
		access->set_error(info, "fsrv_mask: could not register its functions");
	}
	return ok;
}
