/* SPDX-License-Identifier: MIT */
/*
 * The storages of a rank file whose local zip headers were derived
 * rather than read (ckfs_torch_open's .derive_locals, include/ckfs/zip.h),
 * as the guards of its source (include/ckfs/model.h): the range of a storage,
 * from its local header to the end of its data, is read only once that
 * header was read and found to start the data where the derivation put
 * it. A guard keeps the storage's key (its record is "<prefix>data/<key>",
 * the prefix being the table's text) and the header's length. A derived
 * record that does not fit that (a key that is not a plain number, a
 * header over 64 KiB, a storage over 2 GiB, ...) is checked now, one
 * read each, as before.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckfs/zip.h"
#include "layouts/layouts.h"

/* Longest archive prefix kept in a table; longer ones are checked now. */
#define GUARD_PREFIX_MAX 1024

static enum ckfs_code guard_check(const struct ckfs_source *s, const char *ctx, uint64_t start,
				  uint16_t hdr, uint32_t key, struct ckfs_error *err)
{
	char name[GUARD_PREFIX_MAX + 32];

	snprintf(name, sizeof(name), "%s%" PRIu32, ctx, key);
	return ckfs_zip_check_local_at(s->f, s->path, name, start, start + hdr, 0, err);
}

ckfs_guard_fn ckfs_torch_guard_fn(void)
{
	return guard_check;
}

/* The key of a record named pfx + key, the key a number < 2^32 written
 * as torch writes it (no sign, no leading zero). */
static bool storage_key(const char *name, const char *pfx, size_t pl, uint32_t *key)
{
	const char *d = name + pl;
	uint64_t v = 0;

	if (strncmp(name, pfx, pl) != 0 || !*d || (d[0] == '0' && d[1]))
		return false;
	for (; *d; d++) {
		if (*d < '0' || *d > '9' || (v = v * 10 + (uint64_t)(*d - '0')) > UINT32_MAX)
			return false;
	}
	*key = (uint32_t)v;
	return true;
}

enum ckfs_code ckfs_torch_guards(struct ckfs_source *s, const struct ckfs_torch_file *tf,
				 struct ckfs_error *err)
{
	const struct ckfs_zip *z = &tf->zip;
	char pfx[GUARD_PREFIX_MAX + 8];
	size_t n = 0, pl;
	struct ckfs_guards *gs;
	enum ckfs_code rc = CKFS_OK;

	ckfs_guards_free(s->guards);
	s->guards = NULL;
	for (size_t i = 0; i < z->n_entries; i++)
		n += z->entries[i].derived;
	if (n == 0)
		return CKFS_OK;
	bool fits = strlen(z->prefix) <= GUARD_PREFIX_MAX;
	snprintf(pfx, sizeof(pfx), "%sdata/", fits ? z->prefix : "");
	pl = strlen(pfx);
	if (!(gs = ckfs_guards_new(guard_check, pfx, n)))
		return ckfs_nomem(err);
	for (size_t i = 0; rc == CKFS_OK && i < z->n_entries; i++) {
		const struct ckfs_zip_entry *e = &z->entries[i];
		uint64_t hdr = e->data_offset - e->header_offset, len = hdr + e->comp_size;
		uint32_t key;

		if (!e->derived)
			continue;
		if (fits && e->method == 0 && storage_key(e->name, pfx, pl, &key) &&
		    e->header_offset <= CKFS_GUARD_MAX_START && hdr <= UINT16_MAX &&
		    e->comp_size <= CKFS_GUARD_MAX_LEN && len <= CKFS_GUARD_MAX_LEN)
			ckfs_guards_add(gs, ckfs_guard_make(e->header_offset, len, (uint16_t)hdr, key));
		else
			rc = ckfs_zip_check_derived(z, e, err);
	}
	if (rc == CKFS_OK)
		rc = ckfs_guards_seal(gs, err);
	if (rc != CKFS_OK || gs->n == 0) {
		ckfs_guards_free(gs);
		return rc;
	}
	s->guards = gs;
	return CKFS_OK;
}
