/* SPDX-License-Identifier: MIT */
/* MD5 (RFC 1321): what S3 checks an upload against (Content-MD5) and
 * builds a multipart object's ETag from. Not for security. */
#ifndef CKFS_MD5_H
#define CKFS_MD5_H

#include <stddef.h>
#include <stdint.h>

struct ckfs_md5 {
	uint32_t state[4];
	uint64_t length; /* bytes so far */
	unsigned char block[64];
};

void ckfs_md5_init(struct ckfs_md5 *m);
void ckfs_md5_update(struct ckfs_md5 *m, const void *p, size_t n);
void ckfs_md5_final(struct ckfs_md5 *m, unsigned char digest[16]);
/* The digest of n bytes at p in one call. */
void ckfs_md5(const void *p, size_t n, unsigned char digest[16]);

#endif
