/* SPDX-License-Identifier: MIT */
/*
 * Plan invariants (include/ckfs/model.h): each chunk lies inside its
 * tensor, chunks never overlap, and together they hold exactly numel
 * elements, so every element has exactly one source. Checked on metadata
 * only, before a model is served. Also what the safetensors header needs
 * of a tensor: a name that is valid UTF-8 (JSON text) and a byte size
 * within CKFS_MAX_SERVED_BYTES.
 */
#include "ckfs/model.h"

#include <stdio.h>

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), 0 when invalid. */
static size_t utf8_seq(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		return (s[1] & 0xC0) == 0x80 ? 2 : 0;
	if (s[0] >= 0xE0 && s[0] <= 0xEF) {
		unsigned lo = s[0] == 0xE0 ? 0xA0 : 0x80, hi = s[0] == 0xED ? 0x9F : 0xBF;
		return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
	}
	if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		unsigned lo = s[0] == 0xF0 ? 0x90 : 0x80, hi = s[0] == 0xF4 ? 0x8F : 0xBF;
		return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 &&
		       (s[3] & 0xC0) == 0x80 ? 4 : 0;
	}
	return 0;
}

/* A name for a message: printable ASCII as is, other bytes as \xNN. */
static void quote_name(const char *name, char *out, size_t size)
{
	size_t n = 0;

	for (const unsigned char *p = (const unsigned char *)name; *p && n + 5 < size; p++)
		n += (size_t)snprintf(out + n, size - n, *p >= 0x20 && *p < 0x7F ? "%c" : "\\x%02x",
				      *p);
	out[n] = '\0';
}

static enum ckfs_code check_name_and_size(const struct ckfs_tensor *t,
					  struct ckfs_error *err)
{
	const unsigned char *p = (const unsigned char *)t->name;
	char shown[256];
	uint64_t stored, out;

	for (size_t k; *p; p += k)
		if (!(k = utf8_seq(p))) {
			quote_name(t->name, shown, sizeof(shown));
			return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': name is not "
					 "valid UTF-8 (byte %zu)", shown,
					 (size_t)(p - (const unsigned char *)t->name));
		}
	if (__builtin_mul_overflow(t->numel, (uint64_t)ckfs_dtype_size(t->stored_dtype),
				   &stored) ||
	    __builtin_mul_overflow(t->numel, (uint64_t)ckfs_dtype_size(t->out_dtype), &out) ||
	    stored > CKFS_MAX_SERVED_BYTES || out > CKFS_MAX_SERVED_BYTES)
		return ckfs_fail(err, CKFS_E_LIMIT, "tensor '%s': too large to serve "
				 "(%llu elements of %zu bytes; the limit is %llu bytes)",
				 t->name, (unsigned long long)t->numel,
				 ckfs_dtype_size(t->stored_dtype) > ckfs_dtype_size(t->out_dtype)
					 ? ckfs_dtype_size(t->stored_dtype)
					 : ckfs_dtype_size(t->out_dtype),
				 (unsigned long long)CKFS_MAX_SERVED_BYTES);
	return CKFS_OK;
}

static int boxes_overlap(const struct ckfs_chunk *a, const struct ckfs_chunk *b,
			 int ndim)
{
	for (int k = 0; k < ndim; k++) {
		if (a->offset[k] + a->shape[k] <= b->offset[k] ||
		    b->offset[k] + b->shape[k] <= a->offset[k])
			return 0;
	}
	return 1;
}

enum ckfs_code ckfs_plan_validate_tensor(const struct ckfs_model *m,
					 const struct ckfs_tensor *t,
					 struct ckfs_error *err)
{
	uint64_t covered = 0;
	(void)m;

	CKFS_TRY(check_name_and_size(t, err));
	for (uint32_t i = 0; i < t->n_chunks; i++) {
		const struct ckfs_chunk *c = &t->chunks[i];
		uint64_t n = 1;
		for (int k = 0; k < t->ndim; k++) {
			if (c->offset[k] < 0 || c->shape[k] <= 0 ||
			    c->offset[k] > t->shape[k] - c->shape[k])
				return ckfs_fail(err, CKFS_E_INVALID,
						 "tensor '%s': the shard of rank %d lies "
						 "outside the global shape", t->name,
						 c->rank);
			n *= (uint64_t)c->shape[k];
		}
		covered += n;
		for (uint32_t j = 0; j < i; j++)
			if (boxes_overlap(c, &t->chunks[j], t->ndim))
				return ckfs_fail(err, CKFS_E_INVALID,
						 "tensor '%s': shards of ranks %d and "
						 "%d overlap", t->name,
						 t->chunks[j].rank, c->rank);
	}
	if (covered != t->numel)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "tensor '%s': shards hold %llu of %llu elements "
				 "(missing or extra ranks?)", t->name,
				 (unsigned long long)covered,
				 (unsigned long long)t->numel);
	return CKFS_OK;
}
