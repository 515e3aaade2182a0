/* fsrv_slots.h: the mask slots both deletion-mask extensions read (fsrv_mask.c, C;
 * fsrv_scan.cpp, C++), and the exported symbols flightsrv fills them through (ctypes).
 * Included by exactly one translation unit of each extension. */
#ifndef FSRV_SLOTS_H
#define FSRV_SLOTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef FSRV_MASK_SLOTS
#define FSRV_MASK_SLOTS 1024
#endif

/* one file's mask: bit p set = position p is deleted; positions at or past nbits are live */
typedef struct {
	const uint8_t *bits;
	uint64_t nbits;
} fsrv_file_mask;

/* a slot: the masks of nfiles files (file_index 0..nfiles-1 of one read_parquet list), in one
 * allocation (the file table, then the bitmaps) */
typedef struct {
	void *mem;
	const fsrv_file_mask *files;
	uint32_t nfiles;
} fsrv_slot;

static fsrv_slot slots[FSRV_MASK_SLOTS];

__attribute__((visibility("default"))) uint32_t fsrv_mask_slots(void) {
	return FSRV_MASK_SLOTS;
}

static void slot_clear(uint32_t slot) {
	free(slots[slot].mem);
	slots[slot].mem = NULL;
	slots[slot].files = NULL;
	slots[slot].nfiles = 0;
}

/* Replace slot `slot` with copies of the masks of `nfiles` files: file i's bitmap is bytes
 * offsets[i] .. offsets[i+1] of `bits` (`nbytes` bytes in all) and covers nbits[i] positions.
 * 0 on success, -1 for a bad slot or layout (the slot is left as it was), -2 when out of
 * memory (the slot is then empty). With nfiles 0 the slot is emptied. */
__attribute__((visibility("default"))) int fsrv_mask_set_files(uint32_t slot, uint32_t nfiles,
                                                               const uint8_t *bits,
                                                               uint64_t nbytes,
                                                               const uint64_t *offsets,
                                                               const uint64_t *nbits) {
	if (slot >= FSRV_MASK_SLOTS || (nfiles > 0 && (!offsets || !nbits)) ||
	    nfiles > (1u << 24)) {
		return -1;
	}
	for (uint32_t i = 0; i < nfiles; i++) {
		if (offsets[i] > offsets[i + 1] || offsets[i + 1] > nbytes ||
		    offsets[i + 1] - offsets[i] < (nbits[i] + 7) / 8 || nbits[i] > (UINT64_MAX - 7)) {
			return -1;
		}
	}
	if (nfiles == 0) {
		slot_clear(slot);
		return 0;
	}
	size_t table = (size_t)nfiles * sizeof(fsrv_file_mask);
	uint8_t *mem = (uint8_t *)malloc(table + (size_t)nbytes + 1);
	if (!mem) {
		slot_clear(slot);
		return -2;
	}
	fsrv_file_mask *files = (fsrv_file_mask *)mem;
	uint8_t *copy = mem + table;
	if (nbytes > 0) {
		memcpy(copy, bits, nbytes);
	}
	for (uint32_t i = 0; i < nfiles; i++) {
		files[i].bits = copy + offsets[i];
		files[i].nbits = nbits[i];
	}
	slot_clear(slot);
	slots[slot].mem = mem;
	slots[slot].files = files;
	slots[slot].nfiles = nfiles;
	return 0;
}

#ifdef __cplusplus
}
#endif

#endif
