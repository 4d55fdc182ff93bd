/* SPDX-License-Identifier: MIT */
/* Helpers for the fuzz targets: inputs become anonymous files (memfd) so
 * the parsers run on a real descriptor through pread, as in production. */
#ifndef CKFS_FUZZ_COMMON_H
#define CKFS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline int fuzz_memfd(const uint8_t *data, size_t size)
{
	int fd = memfd_create("ckfs-fuzz", MFD_CLOEXEC);
	size_t done = 0;

	if (fd < 0)
		return -1;
	while (done < size) {
		ssize_t w = write(fd, data + done, size - done);
		if (w <= 0) {
			close(fd);
			return -1;
		}
		done += (size_t)w;
	}
	return fd;
}

#endif
