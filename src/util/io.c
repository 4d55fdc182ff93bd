/* SPDX-License-Identifier: MIT */
/* Whole reads and writes: see include/ckfs/io.h. */
#include "ckfs/io.h"

#include <errno.h>
#include <unistd.h>

/* One loop for the four calls: off < 0 for read(2)/write(2). */
static ssize_t transfer(int fd, void *buf, size_t n, int64_t off, int write_)
{
	unsigned char *p = buf;
	size_t done = 0;

	while (done < n) {
		ssize_t r;
		if (write_)
			r = off < 0 ? write(fd, p + done, n - done)
				    : pwrite(fd, p + done, n - done, (off_t)off + (off_t)done);
		else
			r = off < 0 ? read(fd, p + done, n - done)
				    : pread(fd, p + done, n - done, (off_t)off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

ssize_t ckfs_read_full(int fd, void *buf, size_t n)
{
	return transfer(fd, buf, n, -1, 0);
}

ssize_t ckfs_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	if (off > INT64_MAX) {
		errno = EINVAL;
		return -1;
	}
	return transfer(fd, buf, n, (int64_t)off, 0);
}

ssize_t ckfs_write_full(int fd, const void *buf, size_t n)
{
	return transfer(fd, (void *)buf, n, -1, 1);
}

ssize_t ckfs_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	if (off > INT64_MAX) {
		errno = EINVAL;
		return -1;
	}
	return transfer(fd, (void *)buf, n, (int64_t)off, 1);
}
