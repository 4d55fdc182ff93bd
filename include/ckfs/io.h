/* SPDX-License-Identifier: MIT */
/*
 * Whole reads and writes on a file descriptor: read(2), write(2), pread(2)
 * and pwrite(2) again after EINTR and after a short transfer, until all n
 * bytes are moved. The one home of these loops (no caller writes its own).
 */
#ifndef CKFS_IO_H
#define CKFS_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The bytes read into buf: n, or fewer only at end of file (a read of 0);
 * -1 with errno when a read fails (the bytes read before it are lost to
 * the caller). */
ssize_t ckfs_read_full(int fd, void *buf, size_t n);
ssize_t ckfs_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* The bytes written from buf: n, or fewer only where write(2) wrote
 * nothing (which a regular file never does; errno is then unchanged);
 * -1 with errno when a write fails. */
ssize_t ckfs_write_full(int fd, const void *buf, size_t n);
ssize_t ckfs_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);

#endif
