/* SPDX-License-Identifier: MIT */
/* Fuzz target: the zip directory reader, record reads and CRC checks. */
#include <stdlib.h>

#include "ckfs/zip.h"
#include "fuzz_common.h"

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
	close(fd);
	return 0;
}
