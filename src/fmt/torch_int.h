/* SPDX-License-Identifier: MIT */
/*
 * Internal to the torch.save reader: torch.c (the zip, data.pkl's decode,
 * the one door ckfs_torch_open) and torch_like.c (a rank file read by
 * rank 0's template), which finds its storages as the decode does.
 */
#ifndef CKFS_FMT_TORCH_INT_H
#define CKFS_FMT_TORCH_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/torch.h"

/* tf's record data/<skey> in *out, checked to hold nbytes for key
 * (torch.c): the decode's messages, for both readers. */
enum ckfs_code torch_storage_record(const struct ckfs_torch_file *tf, const char *skey,
				    size_t skey_len, uint64_t nbytes, const char *key,
				    const struct ckfs_zip_entry **out,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Whether data.pkl (the record pkl of tf, its zip open) is like's but for
 * the values that may differ, the coordinate's holding coord. */
bool torch_like_matches(const struct ckfs_torch_like *like, const struct ckfs_torch_file *tf,
			const struct ckfs_zip_entry *pkl, const int64_t *coord);
/* tf's entries made like's, bound to tf's storage records, once
 * torch_like_matches said yes. On failure the caller releases tf. */
enum ckfs_code torch_like_bind(struct ckfs_torch_file *tf, const struct ckfs_torch_like *like,
			       const int64_t *coord, struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
