/* SPDX-License-Identifier: MIT */
/*
 * An independent second reading of a zip directory through libzip, for
 * `ckfs verify`: libzip's parser must list the same records with the same
 * sizes, methods and CRCs as ckfs's own (src/fmt/zip.c), which locates tensor
 * data. A disagreement means one of the two parsers misreads the file, and
 * the checkpoint should not be trusted until it is understood.
 */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "ckfs/zip.h"

enum ckfs_code ckfs_zip_crosscheck(const struct ckfs_zip *z, struct ckfs_error *err)
{
	int fd, zerr = 0;
	zip_t *za;
	enum ckfs_code rc = CKFS_OK;

	if (z->base != 0)
		return CKFS_OK; /* embedded archives: libzip wants a whole file */
	fd = dup(z->fd); /* libzip closes the descriptor it is given */
	if (fd < 0)
		return ckfs_fail_errno(err, "'%s': dup failed", z->label);
	za = zip_fdopen(fd, ZIP_RDONLY, &zerr);
	if (!za) {
		zip_error_t ze;
		close(fd);
		zip_error_init_with_code(&ze, zerr);
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': libzip cannot open it: %s",
			       z->label, zip_error_strerror(&ze));
		zip_error_fini(&ze);
		return rc;
	}
	zip_int64_t n = zip_get_num_entries(za, 0);
	if (n < 0 || (uint64_t)n != z->n_entries)
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': libzip lists %lld records, "
			       "ckfs %zu", z->label, (long long)n, z->n_entries);
	for (zip_int64_t i = 0; rc == CKFS_OK && i < n; i++) {
		const struct ckfs_zip_entry *e = &z->entries[i];
		zip_stat_t st;
		zip_stat_init(&st);
		if (zip_stat_index(za, (zip_uint64_t)i, ZIP_FL_ENC_RAW, &st) != 0 ||
		    !(st.valid & ZIP_STAT_NAME) || strcmp(st.name, e->name) != 0 ||
		    st.size != e->size || st.comp_size != e->comp_size ||
		    st.comp_method != e->method || st.crc != e->crc32)
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': libzip and ckfs disagree "
				       "on record %lld ('%s')", z->label, (long long)i,
				       e->name);
	}
	zip_discard(za);
	return rc;
}
