/* SPDX-License-Identifier: MIT */
/* Fuzz target: the zip directory reader, record reads and CRC checks;
 * and derived local headers against read ones: when the derived open
 * passes and every derived header passes its check, the plain open
 * passes with the same offsets (a derived header that passes is at the
 * offset the header gives; one that fails is not). */
#include <stdlib.h>
#include <string.h>

#include "ckfs/zip.h"
#include "fuzz_common.h"

static void fuzz_derived(int fd, size_t size)
{
	struct ckfs_zip d, z;
	struct ckfs_error err;
	bool all = true;

	ckfs_error_clear(&err);
	if (ckfs_zip_open_ex(&d, ckfs_file_of_fd(fd), 0, size, "fuzz", CKFS_ZIP_DERIVE_LOCALS,
			     &err) != CKFS_OK)
		return;
	bool plain = ckfs_zip_open(&z, ckfs_file_of_fd(fd), 0, size, "fuzz", &err) == CKFS_OK;
	for (size_t i = 0; i < d.n_entries; i++) {
		ckfs_error_clear(&err);
		bool pass = ckfs_zip_check_derived(&d, &d.entries[i], &err) == CKFS_OK;
		all &= pass;
		if (plain && pass != (d.entries[i].data_offset == z.entries[i].data_offset &&
				      d.entries[i].header_offset == z.entries[i].header_offset))
			abort();
	}
	if (all && !plain)
		abort();
	if (plain)
		ckfs_zip_release(&z);
	ckfs_zip_release(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckfs_zip z;
	struct ckfs_error err;
	int fd = fuzz_memfd(data, size);

	if (fd < 0)
		return 0;
	ckfs_error_clear(&err);
	if (ckfs_zip_open(&z, ckfs_file_of_fd(fd), 0, size, "fuzz", &err) == CKFS_OK) {
		for (size_t i = 0; i < z.n_entries && i < 64; i++) {
			void *buf = NULL;
			size_t len;
			ckfs_error_clear(&err);
			if (ckfs_zip_read_record(&z, &z.entries[i], 1 << 20, &buf, &len,
						 &err) == CKFS_OK)
				free(buf);
		}
		size_t checked;
		ckfs_error_clear(&err);
		if (ckfs_zip_verify_crc(&z, &checked, &err) != CKFS_OK)
			ckfs_error_clear(&err);
		(void)ckfs_zip_find(&z, "data.pkl");
		ckfs_zip_release(&z);
	}
	fuzz_derived(fd, size);
	close(fd);
	return 0;
}
