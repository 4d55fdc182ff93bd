/* SPDX-License-Identifier: MIT */
/*
 * An independent second reading of a zip directory through libzip, for
 * `ckfs verify`: libzip's parser must list the same records with the same
 * sizes, methods and CRCs as ckfs's own (src/fmt/zip.c), which locates tensor
 * data. A disagreement means one of the two parsers misreads the file, and
 * the checkpoint should not be trusted until it is understood.
 */
#include <errno.h>
#include <string.h>
#include <zip.h>

#include "ckfs/zip.h"

/* libzip reads the file through ckfs's own reads (a local file or an
 * object in a store alike): a seekable source over ckfs_file_pread. */
struct reader {
	struct ckfs_file file;
	uint64_t size, pos;
	zip_error_t error;
};

static zip_int64_t reader_cb(void *arg, void *data, zip_uint64_t len, zip_source_cmd_t cmd)
{
	struct reader *r = arg;

	switch (cmd) {
	case ZIP_SOURCE_OPEN:
		r->pos = 0;
		return 0;
	case ZIP_SOURCE_READ: {
		if (r->pos >= r->size)
			return 0;
		if (len > r->size - r->pos)
			len = r->size - r->pos;
		ssize_t got = ckfs_file_pread(r->file, data, (size_t)len, r->pos);
		if (got < 0) {
			zip_error_set(&r->error, ZIP_ER_READ, errno);
			return -1;
		}
		r->pos += (uint64_t)got;
		return got;
	}
	case ZIP_SOURCE_SEEK: {
		zip_int64_t to = zip_source_seek_compute_offset(r->pos, r->size, data, len,
								&r->error);
		if (to < 0)
			return -1;
		r->pos = (uint64_t)to;
		return 0;
	}
	case ZIP_SOURCE_TELL:
		return (zip_int64_t)r->pos;
	case ZIP_SOURCE_STAT: {
		zip_stat_t *st = data;
		zip_stat_init(st);
		st->size = r->size;
		st->valid |= ZIP_STAT_SIZE;
		return sizeof(*st);
	}
	case ZIP_SOURCE_ERROR:
		return zip_error_to_data(&r->error, data, len);
	case ZIP_SOURCE_CLOSE:
	case ZIP_SOURCE_FREE:
		return 0;
	case ZIP_SOURCE_SUPPORTS:
		return ZIP_SOURCE_SUPPORTS_SEEKABLE;
	default:
		zip_error_set(&r->error, ZIP_ER_OPNOTSUPP, 0);
		return -1;
	}
}

enum ckfs_code ckfs_zip_crosscheck(const struct ckfs_zip *z, struct ckfs_error *err)
{
	struct reader r = { .file = z->file };
	zip_error_t ze;
	zip_source_t *src;
	zip_t *za = NULL;
	enum ckfs_code rc = CKFS_OK;

	if (z->base != 0)
		return CKFS_OK; /* embedded archives: libzip wants a whole file */
	int64_t size = ckfs_file_size(z->file);
	if (size < 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", z->label);
	r.size = (uint64_t)size;
	zip_error_init(&r.error);
	zip_error_init(&ze);
	if ((src = zip_source_function_create(reader_cb, &r, &ze)) &&
	    !(za = zip_open_from_source(src, ZIP_RDONLY, &ze)))
		zip_source_free(src);
	if (!za) {
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': libzip cannot open it: %s",
			       z->label, zip_error_strerror(&ze));
		zip_error_fini(&ze);
		zip_error_fini(&r.error);
		return rc;
	}
	zip_error_fini(&ze);
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
	zip_error_fini(&r.error);
	return rc;
}
