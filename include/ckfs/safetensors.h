/* SPDX-License-Identifier: MIT */
/*
 * Reading existing safetensors files: a folder's model.safetensors, or its
 * index and shards, validated as the reference reader (safetensors 0.7)
 * validates them (src/fmt/safetensors.c). Used to serve Hugging Face
 * folders as they are and by `ckfs verify` for its reference.
 */
#ifndef CKFS_SAFETENSORS_H
#define CKFS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/file.h"
#include "ckfs/limits.h"

struct ckfs_st_entry {
	const char *name;
	enum ckfs_dtype dtype;
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	uint64_t begin, end;            /* absolute file offsets */
	const char *file;               /* path of the file holding it */
	struct ckfs_file f;
};

struct ckfs_st_set {
	struct ckfs_arena arena;
	size_t n_entries;
	struct ckfs_st_entry *entries;  /* sorted by name */
	struct ckfs_file files[4096];
	size_t n_files;
};

/* Open a folder's model.safetensors, or its index and every shard, under
 * the file policy pol (NULL: none), and validate them with the reference
 * loader's rules (src/fmt/safetensors.c). */
enum ckfs_code ckfs_st_set_open(const char *dir, const struct ckfs_file_policy *pol,
				struct ckfs_st_set *set,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_st_set_release(struct ckfs_st_set *set);
const struct ckfs_st_entry *ckfs_st_set_find(const struct ckfs_st_set *set,
					     const char *name);

#endif
