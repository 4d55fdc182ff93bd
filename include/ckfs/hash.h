/* SPDX-License-Identifier: MIT */
/* FNV-1a, 64 bits: a quick hash of small keys (zip entry names, folder
 * fingerprints, plan cache identities). Not collision-resistant against
 * someone choosing the input: callers compare the keys themselves where
 * that matters. */
#ifndef CKFS_HASH_H
#define CKFS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CKFS_FNV1A_START UINT64_C(0xcbf29ce484222325)

/* The hash of n bytes at p, continuing from h (CKFS_FNV1A_START at first). */
uint64_t ckfs_fnv1a(uint64_t h, const void *p, size_t n);

#endif
