/* SPDX-License-Identifier: MIT */
/*
 * A bounded cache on disk of objects' bytes (--s3-cache DIR,SIZE), shared
 * by every process that names the same folder: a second mount, or a
 * second node's daemon on the same host, reads what one fetched.
 *
 * The unit is an aligned block of an object at one version: a file
 * DIR/<2 hex>/<16 hex>-<block> whose header repeats the object's identity
 * (the store: endpoint, region, addressing; bucket, key, ETag) and the
 * block's place, length and payload checksum (XXH3-64), checked on every
 * read, so neither a hash collision, another store with the same bucket,
 * key and ETag, a stray file nor a damaged block can serve wrong bytes. A
 * block is written to a temporary name and renamed, so readers see it
 * whole or not at all. Hits refresh the file's mtime; when the
 * folder holds more than SIZE, the files with the oldest mtimes go.
 */
#ifndef CKFS_STORE_DISK_CACHE_H
#define CKFS_STORE_DISK_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "ckfs/err.h"

#define CKFS_DISK_BLOCK (256u << 10)

struct ckfs_disk_cache;

/* The folder dir (made 0700 when missing; it must be the user's and not
 * writable by others), at most budget bytes. */
enum ckfs_code ckfs_disk_cache_open(const char *dir, uint64_t budget,
				    struct ckfs_disk_cache **out,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_disk_cache_free(struct ckfs_disk_cache *c);
/* Its folder, as opened. */
const char *ckfs_disk_cache_dir(const struct ckfs_disk_cache *c);

/* Block `block` of the object id (its store, "bucket/key ETag"), len
 * bytes: 1 and the bytes in buf when it is held intact, else 0. */
int ckfs_disk_cache_get(struct ckfs_disk_cache *c, const char *id, uint64_t block,
			void *buf, size_t len);
/* Keep it (best effort: a full disk or a race only means no entry). */
void ckfs_disk_cache_put(struct ckfs_disk_cache *c, const char *id, uint64_t block,
			 const void *buf, size_t len);

#endif
