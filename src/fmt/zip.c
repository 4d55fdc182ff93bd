/* SPDX-License-Identifier: MIT */
/*
 * Zip directory reader: see include/ckfs/zip.h.
 *
 * ckfs_zip_open() finds the end of central directory record by scanning back
 * from the end of the window, follows the zip64 locator to the zip64 end
 * record when there is one (torch.save always writes both), reads the
 * central directory whole (after checking its size against limits.h), then
 * reads every local header, because only the local header says where the
 * data starts: torch pads the local extra field with an "FB" block that the
 * central copy does not repeat, and it writes zero sizes in local headers
 * (bit 3), so local sizes are never used. With CKFS_ZIP_DERIVE_LOCALS a
 * header that would cost a read of its own is derived instead from
 * torch.save's alignment rule, once the headers read showed the archive
 * follows it, and left for the caller to check before its data is used
 * (include/ckfs/zip.h; docs/formats.md). Every offset in the archive is
 * relative to the window start z->base; every offset handed out is absolute.
 * All arithmetic on input values is checked, every structure must lie inside
 * the window, and entry ranges [local header, end of data) must not overlap
 * each other or the central directory.
 *
 * Deflated records are inflated here with zlib rather than through libzip.
 * libzip would re-parse the whole directory on every call with its own
 * rules, and its file sources need either a path (we only hold a borrowed
 * fd) or a FILE * whose file offset is shared with the caller's descriptor,
 * which would break the pread-only contract below. We already hold the
 * validated [data_offset, +comp_size) range, so a raw-deflate loop over
 * pread chunks is all that is needed, and it stops as soon as the output
 * passes the declared size (never more than max), which defuses bombs.
 *
 * Not done here: writing, multi-disk archives, encryption, methods other
 * than stored and deflate, data descriptors (sizes come from the central
 * directory), and anything torch-specific beyond the top folder.
 *
 * Thread safety: after ckfs_zip_open() returns, struct ckfs_zip is never
 * modified and every read uses pread() at explicit offsets, so any number
 * of threads may call ckfs_zip_find/read_record/verify_crc concurrently.
 * No mmap, no reading the file whole: reads are bounded chunks.
 */
#include "ckfs/zip.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckfs/file.h"
#include "ckfs/hash.h"
#include "ckfs/limits.h"

#define ZIP_LOCAL_SIG 0x04034b50u
#define ZIP_CENTRAL_SIG 0x02014b50u
#define ZIP_EOCD_SIG 0x06054b50u
#define ZIP64_EOCD_SIG 0x06064b50u
#define ZIP64_LOCATOR_SIG 0x07064b50u

#define ZIP_LOCAL_LEN 30u
#define ZIP_CENTRAL_LEN 46u
#define ZIP_EOCD_LEN 22u
#define ZIP64_EOCD_LEN 56u
#define ZIP64_LOCATOR_LEN 20u
#define ZIP_MAX_COMMENT 65535u

#define ZIP_EXTRA_ZIP64 0x0001u

/* General purpose flags that mean the data cannot be read as is: bit 0
 * (encrypted), bit 6 (strong encryption), bit 13 (masked local headers). */
#define ZIP_FLAGS_ENCRYPTED 0x2041u

#define ZIP_METHOD_STORED 0u
#define ZIP_METHOD_DEFLATE 8u

/* Largest single read: stored data and CRC checks stream in these. */
#define ZIP_IO_CHUNK (1u << 20)

typedef unsigned long long ull; /* for printf */

/* What the end records say, all relative to the window. */
struct zip_end {
	uint64_t count;     /* entries */
	uint64_t cd_offset; /* central directory start */
	uint64_t cd_size;
	uint64_t cd_limit;  /* the directory must end at or before this */
};

static uint16_t le16(const unsigned char *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/*
 * Read exactly n bytes at window offset rel. The caller has checked that
 * [rel, rel + n) lies inside the window; a short read therefore means the
 * file shrank under us.
 */
static enum ckfs_code zip_pread(const struct ckfs_zip *z, void *buf, size_t n,
				uint64_t rel, struct ckfs_error *err)
{
	uint64_t off = z->base + rel;
	ssize_t got = ckfs_file_pread(z->file, buf, n, off);

	if (got < 0)
		return ckfs_fail_errno(err, "'%s': cannot read at offset %llu",
				       z->label, (ull)off);
	if ((size_t)got < n)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': unexpected end of file at offset %llu",
				 z->label, (ull)(off + (uint64_t)got));
	return CKFS_OK;
}

/* The window must exist in the file (regular files only: we cannot size
 * anything else without reading it). */
static enum ckfs_code zip_check_window(const struct ckfs_zip *z,
				       struct ckfs_error *err)
{
	int64_t size = ckfs_file_size(z->file);

	if (size < 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", z->label);
	if ((uint64_t)size < z->base + z->length)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': file is %llu bytes, zip expected to end at %llu",
				 z->label, (ull)size,
				 (ull)(z->base + z->length));
	return CKFS_OK;
}

/* Legacy torch pickles and the empty file, before looking for a zip. */
static enum ckfs_code zip_check_magic(const struct ckfs_zip *z,
				      unsigned char head[4],
				      struct ckfs_error *err)
{
	size_t n = z->length < 4 ? (size_t)z->length : 4;

	memset(head, 0, 4);
	if (z->length == 0)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': empty file",
				 z->label);
	CKFS_TRY(zip_pread(z, head, n, 0, err));
	if (n >= 2 && head[0] == 0x80 && head[1] == 0x02)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': legacy (non-zip) torch.save format is not supported; re-save with torch >= 1.6",
				 z->label);
	return CKFS_OK;
}

static enum ckfs_code zip_multi_disk(const struct ckfs_zip *z,
				     struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_UNSUPPORTED,
			 "'%s': multi-disk zip archives are not supported",
			 z->label);
}

/*
 * Zip64 end records: the locator sits right before the classic end record
 * and points at the zip64 end record. Values the classic record does not
 * saturate must agree with the zip64 ones.
 */
static enum ckfs_code zip_read_end64(const struct ckfs_zip *z, uint64_t loc_pos,
				     const unsigned char *loc,
				     const unsigned char *eocd,
				     struct zip_end *end, struct ckfs_error *err)
{
	unsigned char rec[ZIP64_EOCD_LEN];
	uint64_t pos = le64(loc + 8), size;

	if (le32(loc + 4) != 0 || le32(loc + 16) > 1)
		return zip_multi_disk(z, err);
	if (pos >= loc_pos)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': zip64 end of central directory offset out of range",
				 z->label);
	if (loc_pos - pos < ZIP64_EOCD_LEN)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': zip64 end of central directory truncated",
				 z->label);
	CKFS_TRY(zip_pread(z, rec, sizeof(rec), pos, err));
	if (le32(rec) != ZIP64_EOCD_SIG)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad zip64 end of central directory signature",
				 z->label);
	size = le64(rec + 4);
	if (size < ZIP64_EOCD_LEN - 12 || size > loc_pos - pos - 12)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad zip64 end of central directory size %llu",
				 z->label, (ull)size);
	if (le32(rec + 16) != 0 || le32(rec + 20) != 0 ||
	    le64(rec + 24) != le64(rec + 32))
		return zip_multi_disk(z, err);

	end->count = le64(rec + 32);
	end->cd_size = le64(rec + 40);
	end->cd_offset = le64(rec + 48);
	end->cd_limit = pos;

	if ((le16(eocd + 10) != 0xffffu && le16(eocd + 10) != end->count) ||
	    (le32(eocd + 12) != 0xffffffffu && le32(eocd + 12) != end->cd_size) ||
	    (le32(eocd + 16) != 0xffffffffu && le32(eocd + 16) != end->cd_offset))
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': zip64 end of central directory disagrees with end of central directory",
				 z->label);
	return CKFS_OK;
}

/*
 * Find the end of central directory record: the last signature, scanning
 * back over at most a maximal comment, whose comment fits in the window.
 * Bytes after the comment are tolerated, as most readers do.
 */
static enum ckfs_code zip_find_end(const struct ckfs_zip *z,
				   const unsigned char head[4],
				   struct zip_end *end, struct ckfs_error *err)
{
	uint64_t tail_len = z->length, tail_start, eocd_pos = 0;
	unsigned char *tail, *eocd = NULL;
	enum ckfs_code rc;
	int cut = 0;

	if (tail_len > ZIP_EOCD_LEN + ZIP_MAX_COMMENT)
		tail_len = ZIP_EOCD_LEN + ZIP_MAX_COMMENT;
	tail_start = z->length - tail_len;
	tail = malloc((size_t)tail_len);
	if (!tail)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	rc = zip_pread(z, tail, (size_t)tail_len, tail_start, err);
	if (rc)
		goto out;

	for (size_t k = 4; k <= tail_len; k++) {
		size_t i = (size_t)tail_len - k;

		if (le32(tail + i) != ZIP_EOCD_SIG)
			continue;
		if (tail_len - i < ZIP_EOCD_LEN ||
		    tail_len - i - ZIP_EOCD_LEN < le16(tail + i + 20)) {
			cut = 1;
			continue;
		}
		eocd = tail + i;
		eocd_pos = tail_start + i;
		break;
	}
	if (!eocd) {
		if (cut)
			rc = ckfs_fail(err, CKFS_E_TRUNCATED,
				       "'%s': zip end of central directory truncated",
				       z->label);
		else if (le32(head) == ZIP_LOCAL_SIG)
			rc = ckfs_fail(err, CKFS_E_TRUNCATED,
				       "'%s': zip end of central directory not found; "
				       "the file looks truncated (%llu bytes)",
				       z->label, (ull)z->length);
		else
			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': not a zip archive", z->label);
		goto out;
	}

	if (eocd_pos >= ZIP64_LOCATOR_LEN) {
		unsigned char loc[ZIP64_LOCATOR_LEN];
		uint64_t loc_pos = eocd_pos - ZIP64_LOCATOR_LEN;

		rc = zip_pread(z, loc, sizeof(loc), loc_pos, err);
		if (rc)
			goto out;
		if (le32(loc) == ZIP64_LOCATOR_SIG) {
			uint16_t disk = le16(eocd + 4), cd_disk = le16(eocd + 6);

			if ((disk != 0 && disk != 0xffffu) ||
			    (cd_disk != 0 && cd_disk != 0xffffu)) {
				rc = zip_multi_disk(z, err);
				goto out;
			}
			rc = zip_read_end64(z, loc_pos, loc, eocd, end, err);
			goto out;
		}
	}

	if (le16(eocd + 4) != 0 || le16(eocd + 6) != 0 ||
	    le16(eocd + 8) != le16(eocd + 10)) {
		rc = zip_multi_disk(z, err);
		goto out;
	}
	end->count = le16(eocd + 10);
	end->cd_size = le32(eocd + 12);
	end->cd_offset = le32(eocd + 16);
	end->cd_limit = eocd_pos;
out:
	free(tail);
	return rc;
}

/* Central directory bounds, before anything is allocated from them. */
static enum ckfs_code zip_check_end(const struct ckfs_zip *z,
				    const struct zip_end *end,
				    struct ckfs_error *err)
{
	if (end->count > CKFS_MAX_ZIP_ENTRIES)
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': zip has %llu entries, more than the limit of %u",
				 z->label, (ull)end->count, CKFS_MAX_ZIP_ENTRIES);
	if (end->cd_offset > end->cd_limit)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': zip central directory offset out of range",
				 z->label);
	if (end->cd_size > end->cd_limit - end->cd_offset)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': zip central directory truncated", z->label);
	if (end->count > end->cd_size / ZIP_CENTRAL_LEN)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': zip entry count %llu does not fit in a central directory of %llu bytes",
				 z->label, (ull)end->count, (ull)end->cd_size);
	if (end->cd_size > CKFS_MAX_ZIP_CD_BYTES)
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': zip central directory is %llu bytes, more than the limit of %llu",
				 z->label, (ull)end->cd_size,
				 (ull)CKFS_MAX_ZIP_CD_BYTES);
	return CKFS_OK;
}

/*
 * Replace saturated 32-bit fields with the zip64 extra field (id 0x0001),
 * which holds only the saturated ones, in the order uncompressed size,
 * compressed size, local header offset. Without that block the saturated
 * values are taken literally (as Python's zipfile does); they are range
 * checked later like any other.
 */
static enum ckfs_code zip_apply_zip64(const struct ckfs_zip *z,
				      const unsigned char *x, size_t xlen,
				      struct ckfs_zip_entry *e, uint64_t *lho,
				      struct ckfs_error *err)
{
	while (xlen >= 4) {
		size_t id = le16(x), len = le16(x + 2);

		if (len > xlen - 4)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': malformed extra field in zip entry '%s'",
					 z->label, e->name);
		if (id == ZIP_EXTRA_ZIP64) {
			const unsigned char *p = x + 4;
			uint64_t *fields[3] = { &e->size, &e->comp_size, lho };

			for (int i = 0; i < 3; i++) {
				if (*fields[i] != 0xffffffffu)
					continue;
				if (len < 8)
					return ckfs_fail(err, CKFS_E_FORMAT,
							 "'%s': zip64 extra field of '%s' is too short",
							 z->label, e->name);
				*fields[i] = le64(p);
				p += 8;
				len -= 8;
			}
			return CKFS_OK;
		}
		x += 4 + len;
		xlen -= 4 + len;
	}
	return CKFS_OK;
}

/* What ckfs reads of an entry: not encrypted, stored or deflated, a
 * stored entry's two sizes equal. */
static enum ckfs_code zip_check_entry(const struct ckfs_zip *z, const struct ckfs_zip_entry *e,
				      struct ckfs_error *err)
{
	if (e->flags & ZIP_FLAGS_ENCRYPTED)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': zip entry '%s' is encrypted",
				 z->label, e->name);
	if (e->method != ZIP_METHOD_STORED && e->method != ZIP_METHOD_DEFLATE)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': zip entry '%s' uses unsupported compression method %u",
				 z->label, e->name, e->method);
	if (e->method == ZIP_METHOD_STORED && e->comp_size != e->size)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': stored zip entry '%s' has compressed size %llu but size %llu",
				 z->label, e->name, (ull)e->comp_size, (ull)e->size);
	return CKFS_OK;
}

/* A walk over the central directory's records: the next is record i of
 * count, at cd + pos, and its name goes to names (the caller's bound
 * leaves room). */
struct zip_cd_walk {
	const unsigned char *cd;
	size_t cd_size, pos;
	size_t i, count;
	char *names;
};

/* The walk's next record into e; the walk moves past it. */
static enum ckfs_code zip_parse_central(const struct ckfs_zip *z, struct zip_cd_walk *w,
					struct ckfs_zip_entry *e, struct ckfs_error *err)
{
	const unsigned char *r = w->cd + w->pos;
	size_t cd_size = w->cd_size, pos = w->pos, i = w->i;
	size_t nlen, xlen, clen;
	uint64_t lho;

	if (cd_size - pos < ZIP_CENTRAL_LEN)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': zip central directory truncated",
				 z->label);
	if (le32(r) != ZIP_CENTRAL_SIG)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad zip central directory signature at entry %zu",
				 z->label, i);
	nlen = le16(r + 28);
	xlen = le16(r + 30);
	clen = le16(r + 32);
	/* Leave 46 bytes for each entry still to come; this also keeps the
	 * names within the caller's bound. */
	if (cd_size - pos - ZIP_CENTRAL_LEN * (w->count - i) < nlen + xlen + clen)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': zip central directory truncated",
				 z->label);
	if (memchr(r + ZIP_CENTRAL_LEN, 0, nlen))
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': name of zip entry %zu contains a NUL byte", z->label, i);
	e->name = w->names;
	memcpy(e->name, r + ZIP_CENTRAL_LEN, nlen);
	e->name[nlen] = '\0';
	e->flags = le16(r + 8);
	e->method = le16(r + 10);
	e->crc32 = le32(r + 16);
	e->comp_size = le32(r + 20);
	e->size = le32(r + 24);
	lho = le32(r + 42);
	if (e->size == 0xffffffffu || e->comp_size == 0xffffffffu || lho == 0xffffffffu)
		CKFS_TRY(zip_apply_zip64(z, r + ZIP_CENTRAL_LEN + nlen, xlen, e, &lho, err));
	e->header_offset = lho;
	CKFS_TRY(zip_check_entry(z, e, err));
	w->pos += ZIP_CENTRAL_LEN + nlen + xlen + clen;
	w->names += nlen + 1;
	w->i++;
	return CKFS_OK;
}

/* Parse the central directory into z->entries; local header offsets are
 * left relative in header_offset for zip_read_locals(). */
static enum ckfs_code zip_read_central(struct ckfs_zip *z,
				       const struct zip_end *end,
				       struct ckfs_error *err)
{
	size_t count = (size_t)end->count, cd_size = (size_t)end->cd_size;
	size_t names_cap;
	unsigned char *cd;
	char *names;
	enum ckfs_code rc;

	if (count == 0) {
		if (cd_size != 0)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': zip central directory has %llu bytes after its 0 entries",
					 z->label, (ull)cd_size);
		return CKFS_OK;
	}
	/* Each record is 46 bytes plus its name, so names with their NULs
	 * need at most cd_size - 45 * count bytes (zip_check_end made sure
	 * 46 * count <= cd_size, and zip_parse_central keeps pos + 46 *
	 * entries left <= cd_size). */
	names_cap = cd_size - (ZIP_CENTRAL_LEN - 1) * count;
	cd = malloc(cd_size);
	names = malloc(names_cap);
	z->entries = calloc(count, sizeof(*z->entries));
	if (!cd || !names || !z->entries) {
		free(cd);
		free(names);
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	}
	rc = zip_pread(z, cd, cd_size, end->cd_offset, err);
	if (rc) {
		free(cd);
		free(names);
		return rc;
	}
	/* From here on, names belongs to z: entry 0's name is the start of
	 * the block that ckfs_zip_release() frees. */
	z->entries[0].name = names;

	struct zip_cd_walk w = { .cd = cd, .cd_size = cd_size, .count = count, .names = names };
	while (w.i < count && rc == CKFS_OK)
		rc = zip_parse_central(z, &w, &z->entries[w.i], err);
	if (rc == CKFS_OK && w.pos != cd_size)
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': zip central directory has %llu bytes after its %zu entries",
			       z->label, (ull)(cd_size - w.pos), count);
	else if (rc == CKFS_OK)
		z->n_entries = count;
	free(cd);
	return rc;
}

/* How far one read of local headers may reach, and how much of a record's
 * data it may read through to reach the next header. */
enum { ZIP_LOCAL_WINDOW = 1 << 20, ZIP_LOCAL_GAP = 16 << 10 };

/*
 * torch.save's writer (caffe2/serialize/inline_container.cc, getPadding)
 * puts after a local header's name miniz's zip64 block when the record's
 * size or the header's offset does not fit 32 bits (4 bytes, then 16 for
 * the two sizes, 8 for the offset), then an "FB" block (4 bytes and the
 * padding) that starts the data at a multiple of 64 bytes of the archive.
 * Where that puts the data of e, whose local header is at lho (relative).
 */
#define ZIP_TORCH_ALIGN 64u
#define ZIP_32_MAX 0xffffffffu

static uint64_t zip_torch_data(const struct ckfs_zip_entry *e, uint64_t lho)
{
	uint64_t at = lho + ZIP_LOCAL_LEN + strlen(e->name) + 4;
	bool big = e->size >= ZIP_32_MAX, far = lho >= ZIP_32_MAX;

	if (big || far)
		at += 4 + (big ? 16 : 0) + (far ? 8 : 0);
	return (at + ZIP_TORCH_ALIGN - 1) / ZIP_TORCH_ALIGN * ZIP_TORCH_ALIGN;
}

/* Which of the rule's four cases e is in: each is trusted only once a
 * header read in the same archive showed it. */
static unsigned zip_torch_case(const struct ckfs_zip_entry *e, uint64_t lho)
{
	return (lho >= ZIP_32_MAX ? 1u : 0u) | (e->size >= ZIP_32_MAX ? 2u : 0u);
}

/* Local headers left to derive (CKFS_ZIP_DERIVE_LOCALS): the entries
 * whose header would be a read of its own, and what the headers read
 * showed of the rule. */
struct zip_derive {
	size_t *idx, n;
	unsigned shown;      /* cases of zip_torch_case seen followed */
	bool broken;         /* a header read did not follow the rule */
};

/* e's data where its header (at lho, relative) says; the checks that need
 * no more than that. */
static enum ckfs_code zip_check_data(struct ckfs_zip *z, const struct zip_end *end,
				     struct ckfs_zip_entry *e, uint64_t lho, uint64_t data,
				     struct ckfs_error *err)
{
	uint64_t data_end;

	if (__builtin_add_overflow(data, e->comp_size, &data_end) || data_end > z->length)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': data of zip entry '%s' extends past end of archive",
				 z->label, e->name);
	if (data_end > end->cd_offset)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': data of zip entry '%s' overlaps the central directory",
				 z->label, e->name);
	e->header_offset = z->base + lho;
	e->data_offset = z->base + data;
	return CKFS_OK;
}

/* The local header fields ckfs checks, at p (ZIP_LOCAL_LEN + the name),
 * against e; the extra field's length in *xlen. */
static enum ckfs_code zip_check_fields(const char *label, const char *name, uint16_t method,
				       const unsigned char *p, size_t *xlen,
				       struct ckfs_error *err)
{
	size_t nlen = strlen(name);

	if (le32(p) != ZIP_LOCAL_SIG)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad local header signature for zip entry '%s'",
				 label, name);
	if (le16(p + 26) != nlen || memcmp(p + ZIP_LOCAL_LEN, name, nlen) != 0)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': local header name of zip entry '%s' differs from the central directory",
				 label, name);
	if (le16(p + 8) != method)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': local header of zip entry '%s' has method %u, central directory %u",
				 label, name, le16(p + 8), method);
	*xlen = le16(p + 28);
	return CKFS_OK;
}

/* Entry e's local header, at p (ZIP_LOCAL_LEN + its name's length bytes
 * read from the file), checked against the central directory; where its
 * data starts, computed. */
static enum ckfs_code zip_check_local(struct ckfs_zip *z, const struct zip_end *end,
				      struct ckfs_zip_entry *e, const unsigned char *p,
				      struct ckfs_error *err)
{
	uint64_t lho = e->header_offset;
	size_t xlen;

	CKFS_TRY(zip_check_fields(z->label, e->name, e->method, p, &xlen, err));
	/* lho < cd_offset <= length < 2^63: no overflow here. */
	return zip_check_data(z, end, e, lho, lho + ZIP_LOCAL_LEN + strlen(e->name) + xlen, err);
}

/* Where entry e's local header (up to the end of its name) ends, when it
 * lies before the central directory; 0 when it does not (why in err, which
 * may be NULL). */
static uint64_t zip_local_end(const struct ckfs_zip *z, const struct zip_end *end,
			      const struct ckfs_zip_entry *e, struct ckfs_error *err)
{
	uint64_t lho = e->header_offset, need = ZIP_LOCAL_LEN + strlen(e->name);

	if (lho >= end->cd_offset) {
		ckfs_fail(err, CKFS_E_FORMAT, "'%s': local header of zip entry '%s' out of range",
			  z->label, e->name);
		return 0;
	}
	if (end->cd_offset - lho < need) {
		ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': local header of zip entry '%s' truncated",
			  z->label, e->name);
		return 0;
	}
	return lho + need;
}

/* Entries [i, j) checked from buf, which holds the archive from start. */
static enum ckfs_code zip_check_run(struct ckfs_zip *z, const struct zip_end *end, size_t i,
				    size_t j, const unsigned char *buf, uint64_t start,
				    struct zip_derive *d, struct ckfs_error *err)
{
	for (size_t k = i; k < j; k++) {
		struct ckfs_zip_entry *e = &z->entries[k];
		uint64_t lho = e->header_offset;

		CKFS_TRY(zip_check_local(z, end, e, buf + (lho - start), err));
		if (e->data_offset - z->base == zip_torch_data(e, lho))
			d->shown |= 1u << zip_torch_case(e, lho);
		else
			d->broken = true;
	}
	return CKFS_OK;
}

/* The headers left to derive: derived where the headers read showed the
 * rule for their case, else read one by one as before. */
static enum ckfs_code zip_derive_rest(struct ckfs_zip *z, const struct zip_end *end,
				      const struct zip_derive *d, unsigned char *buf,
				      struct ckfs_error *err)
{
	for (size_t k = 0; k < d->n; k++) {
		struct ckfs_zip_entry *e = &z->entries[d->idx[k]];
		uint64_t lho = e->header_offset;

		if (!d->broken && (d->shown >> zip_torch_case(e, lho) & 1)) {
			CKFS_TRY(zip_check_data(z, end, e, lho, zip_torch_data(e, lho), err));
			e->derived = true;
			continue;
		}
		CKFS_TRY(zip_pread(z, buf, ZIP_LOCAL_LEN + strlen(e->name), lho, err));
		CKFS_TRY(zip_check_local(z, end, e, buf, err));
	}
	return CKFS_OK;
}

/*
 * Check each local header and compute where the data starts. The headers
 * sit between the records' data, in the central directory's order as
 * torch writes them: the headers of neighbouring small records (a rank
 * file holds tens of thousands) are read together, one read per run of
 * them within ZIP_LOCAL_WINDOW bytes, instead of one pread each. Data of
 * more than ZIP_LOCAL_GAP bytes ends a run, so what is read beside the
 * headers is small records' data only, and an archive in another order
 * just reads more often. The checks and their order are those of one
 * header at a time. With CKFS_ZIP_DERIVE_LOCALS a run of one header past
 * the first (a large record's: a frontier MoE rank file has 37,000) is
 * not read but derived after the others (zip_derive_rest).
 */
static enum ckfs_code zip_read_locals(struct ckfs_zip *z, const struct zip_end *end,
				      unsigned flags, struct ckfs_error *err)
{
	unsigned char *buf = malloc(ZIP_LOCAL_WINDOW);
	struct zip_derive d = { 0 };
	enum ckfs_code rc = CKFS_OK;

	if ((flags & CKFS_ZIP_DERIVE_LOCALS) && z->n_entries > 1)
		d.idx = malloc(z->n_entries * sizeof(*d.idx));
	if (!buf || ((flags & CKFS_ZIP_DERIVE_LOCALS) && z->n_entries > 1 && !d.idx)) {
		free(buf);
		free(d.idx);
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", z->label);
	}
	for (size_t i = 0, j; rc == CKFS_OK && i < z->n_entries; i = j) {
		uint64_t start = z->entries[i].header_offset, stop, next;
		/* ZIP_LOCAL_LEN + a 16-bit name length fit in any window */
		if (!(stop = zip_local_end(z, end, &z->entries[i], err))) {
			rc = err->code;
			break;
		}
		for (j = i + 1; j < z->n_entries; j++) {
			/* a header out of place starts a run of its own, which
			 * reports it */
			const struct ckfs_zip_entry *e = &z->entries[j];
			if (e->header_offset < z->entries[j - 1].header_offset ||
			    !(next = zip_local_end(z, end, e, NULL)) ||
			    next - start > ZIP_LOCAL_WINDOW || e->header_offset > stop + ZIP_LOCAL_GAP)
				break;
			stop = next > stop ? next : stop;
		}
		if (d.idx && i > 0 && j == i + 1) {
			d.idx[d.n++] = i;
			continue;
		}
		rc = zip_pread(z, buf, (size_t)(stop - start), start, err);
		if (rc == CKFS_OK)
			rc = zip_check_run(z, end, i, j, buf, start, &d, err);
	}
	if (rc == CKFS_OK)
		rc = zip_derive_rest(z, end, &d, buf, err);
	free(d.idx);
	free(buf);
	return rc;
}

enum ckfs_code ckfs_zip_check_local_at(struct ckfs_file f, const char *label, const char *name,
				       uint64_t header_offset, uint64_t data_offset,
				       uint16_t method, struct ckfs_error *err)
{
	unsigned char small[512], *p = small;
	uint64_t len = data_offset - header_offset;
	size_t nlen = strlen(name), xlen;
	enum ckfs_code rc = CKFS_OK;
	ssize_t got;

	if (data_offset < header_offset || len < ZIP_LOCAL_LEN + nlen || len > ZIP_LOCAL_LEN + 2 * 65535u)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': zip entry '%s': bad local header span",
				 label, name);
	if (len > sizeof(small) && !(p = malloc((size_t)len)))
		return ckfs_nomem(err);
	got = ckfs_file_pread(f, p, (size_t)len, header_offset);
	if (got < 0)
		rc = ckfs_fail_errno(err, "'%s': cannot read at offset %llu", label,
				     (ull)header_offset);
	else if ((uint64_t)got < len)
		rc = ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': unexpected end of file at offset %llu",
			       label, (ull)(header_offset + (uint64_t)got));
	if (rc == CKFS_OK)
		rc = zip_check_fields(label, name, method, p, &xlen, err);
	if (rc == CKFS_OK && ZIP_LOCAL_LEN + nlen + xlen != len)
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': local header of zip entry '%s' puts its data at %llu, not at "
			       "%llu where torch.save's alignment would", label, name,
			       (ull)(header_offset + ZIP_LOCAL_LEN + nlen + xlen), (ull)data_offset);
	if (p != small)
		free(p);
	return rc;
}

enum ckfs_code ckfs_zip_check_derived(const struct ckfs_zip *z, const struct ckfs_zip_entry *e,
				      struct ckfs_error *err)
{
	if (!e->derived)
		return CKFS_OK;
	return ckfs_zip_check_local_at(z->file, z->label, e->name, e->header_offset,
				       e->data_offset, e->method, err);
}

struct zip_span {
	uint64_t start, end;
	size_t idx;
};

static int zip_span_cmp(const void *a, const void *b)
{
	const struct zip_span *x = a, *y = b;

	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

/* Entry ranges [local header, end of data) must be disjoint: otherwise one
 * byte would belong to two records (zip bombs and scanner evasion rely on
 * exactly that). */
static enum ckfs_code zip_check_overlap(const struct ckfs_zip *z,
					struct ckfs_error *err)
{
	struct zip_span *s;
	enum ckfs_code rc = CKFS_OK;

	if (z->n_entries < 2)
		return CKFS_OK;
	/* torch.save lists its records in file order: then one pass shows
	 * them disjoint (sorting 37,000 a rank file would cost more) */
	size_t i = 1;
	const struct ckfs_zip_entry *e = z->entries;
	while (i < z->n_entries &&
	       e[i - 1].data_offset + e[i - 1].comp_size <= e[i].header_offset &&
	       e[i - 1].header_offset <= e[i - 1].data_offset)
		i++;
	if (i == z->n_entries && e[i - 1].header_offset <= e[i - 1].data_offset)
		return CKFS_OK;
	s = calloc(z->n_entries, sizeof(*s));
	if (!s)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	for (i = 0; i < z->n_entries; i++) {
		s[i].start = z->entries[i].header_offset;
		s[i].end = z->entries[i].data_offset + z->entries[i].comp_size;
		s[i].idx = i;
	}
	qsort(s, z->n_entries, sizeof(*s), zip_span_cmp);
	for (i = 0; i + 1 < z->n_entries; i++) {
		if (s[i].end > s[i + 1].start) {
			size_t a = s[i].idx < s[i + 1].idx ? s[i].idx : s[i + 1].idx;
			size_t b = s[i].idx ^ s[i + 1].idx ^ a;

			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': zip entries '%s' and '%s' overlap",
				       z->label, z->entries[a].name,
				       z->entries[b].name);
			break;
		}
	}
	free(s);
	return rc;
}

struct zip_key {
	const char *name;
	size_t idx;
};

static int zip_key_cmp(const void *a, const void *b)
{
	const struct zip_key *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The hash of s, continuing from h. */
static uint64_t zip_name_hash(uint64_t h, const char *s)
{
	return ckfs_fnv1a(h, s, strlen(s));
}

/* The first duplicate name in sorted order, as the refusal names it;
 * only run once the hash index met a duplicate. */
static enum ckfs_code zip_refuse_duplicate(const struct ckfs_zip *z, struct ckfs_error *err)
{
	size_t n = z->n_entries;
	struct zip_key *k = calloc(n ? n : 1, sizeof(*k));
	enum ckfs_code rc = CKFS_OK;

	if (!k)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", z->label);
	for (size_t i = 0; i < n; i++) {
		k[i].name = z->entries[i].name;
		k[i].idx = i;
	}
	qsort(k, n, sizeof(*k), zip_key_cmp);
	for (size_t i = 1; i < n && rc == CKFS_OK; i++)
		if (strcmp(k[i - 1].name, k[i].name) == 0)
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': duplicate zip entry '%s'",
				       z->label, k[i].name);
	free(k);
	return rc;
}

/* The hash index for ckfs_zip_find; duplicate names are refused because
 * a lookup could then return either copy. A rank file of a MoE actor has
 * tens of thousands of records found one by one: a binary search would
 * compare the long shared "<archive>/data/" prefix each step, and sorting
 * the names only to find duplicates cost as much as the rest of the
 * directory. */
static enum ckfs_code zip_build_index(struct ckfs_zip *z,
				      struct ckfs_error *err)
{
	size_t n = z->n_entries;
	bool dup = false;

	z->hash_cap = 16;
	while (z->hash_cap < 2 * n)
		z->hash_cap *= 2;
	z->hash = calloc(z->hash_cap, sizeof(*z->hash));
	if (!z->hash)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", z->label);
	for (size_t i = 0; i < n && !dup; i++) {
		const char *name = z->entries[i].name;
		size_t j = (size_t)zip_name_hash(CKFS_FNV1A_START, name) & (z->hash_cap - 1);
		while (z->hash[j] && !(dup = strcmp(z->entries[z->hash[j] - 1].name, name) == 0))
			j = (j + 1) & (z->hash_cap - 1);
		z->hash[j] = i + 1;
	}
	return dup ? zip_refuse_duplicate(z, err) : CKFS_OK;
}

/* torch's rule: the top folder is entry 0's name up to its first '/'. */
static enum ckfs_code zip_set_prefix(struct ckfs_zip *z,
				     struct ckfs_error *err)
{
	size_t len = 0;

	if (z->n_entries > 0) {
		const char *slash = strchr(z->entries[0].name, '/');

		if (slash)
			len = (size_t)(slash - z->entries[0].name) + 1;
	}
	z->prefix = malloc(len + 1);
	if (!z->prefix)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	if (len)
		memcpy(z->prefix, z->entries[0].name, len);
	z->prefix[len] = '\0';
	z->prefix_hash = zip_name_hash(CKFS_FNV1A_START, z->prefix);
	return CKFS_OK;
}

enum ckfs_code ckfs_zip_open(struct ckfs_zip *z, struct ckfs_file f, uint64_t base,
			     uint64_t length, const char *label,
			     struct ckfs_error *err)
{
	return ckfs_zip_open_ex(z, f, base, length, label, 0, err);
}

enum ckfs_code ckfs_zip_open_ex(struct ckfs_zip *z, struct ckfs_file f, uint64_t base,
				uint64_t length, const char *label, unsigned flags,
				struct ckfs_error *err)
{
	struct zip_end end = { 0 };
	unsigned char head[4];
	enum ckfs_code rc;

	if (!z)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "ckfs_zip_open: missing argument");
	memset(z, 0, sizeof(*z));
	z->label = label ? label : "(zip)";
	z->file = f;
	z->base = base;
	z->length = length;
	if (!ckfs_file_is_open(f) || base > INT64_MAX || length > INT64_MAX - base)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': bad zip window (offset %llu, length %llu)",
				 z->label, (ull)base, (ull)length);

	rc = zip_check_window(z, err);
	if (!rc)
		rc = zip_check_magic(z, head, err);
	if (!rc)
		rc = zip_find_end(z, head, &end, err);
	if (!rc)
		rc = zip_check_end(z, &end, err);
	if (!rc)
		rc = zip_read_central(z, &end, err);
	if (!rc)
		rc = zip_read_locals(z, &end, flags, err);
	if (!rc)
		rc = zip_check_overlap(z, err);
	if (!rc)
		rc = zip_build_index(z, err);
	if (!rc)
		rc = zip_set_prefix(z, err);
	if (rc) {
		const char *keep = z->label;

		ckfs_zip_release(z);
		z->label = keep;
	}
	return rc;
}

void ckfs_zip_release(struct ckfs_zip *z)
{
	if (!z)
		return;
	/* All names live in one block that starts at entry 0's name (NULL
	 * when open failed before the block was attached). */
	if (z->entries)
		free(z->entries[0].name);
	free(z->entries);
	free(z->prefix);
	free(z->hash);
	z->hash = NULL;
	z->hash_cap = 0;
	memset(z, 0, sizeof(*z));
	z->file = CKFS_FILE_NONE;
}

/* strcmp(name, prefix + record) without building the key. */
static int zip_cmp_key(const char *name, const char *prefix,
		       const char *record)
{
	for (; *prefix; prefix++, name++)
		if (*name != *prefix)
			return (unsigned char)*name - (unsigned char)*prefix;
	return strcmp(name, record);
}

const struct ckfs_zip_entry *ckfs_zip_find(const struct ckfs_zip *z,
					   const char *record)
{
	if (!z || !record || !z->hash || !z->prefix)
		return NULL;
	size_t j = (size_t)zip_name_hash(z->prefix_hash, record) & (z->hash_cap - 1);
	for (; z->hash[j]; j = (j + 1) & (z->hash_cap - 1)) {
		const struct ckfs_zip_entry *e = &z->entries[z->hash[j] - 1];
		if (zip_cmp_key(e->name, z->prefix, record) == 0)
			return e;
	}
	return NULL;
}

typedef void (*zip_sink)(void *ctx, const unsigned char *p, size_t n);

/*
 * Inflate a deflated entry, passing the output to sink in chunks. Stops
 * with an error as soon as the output would pass the declared size, so the
 * work and memory are bounded by e->size however the stream is built.
 */
static enum ckfs_code zip_inflate(const struct ckfs_zip *z,
				  const struct ckfs_zip_entry *e, zip_sink sink,
				  void *ctx, struct ckfs_error *err)
{
	uint64_t in_pos = e->data_offset - z->base, in_left = e->comp_size;
	uint64_t produced = 0;
	size_t in_cap = in_left < ZIP_IO_CHUNK ? (size_t)in_left : ZIP_IO_CHUNK;
	size_t out_cap = e->size < ZIP_IO_CHUNK ? (size_t)e->size + 1
						: ZIP_IO_CHUNK;
	unsigned char *in = malloc(in_cap ? in_cap : 1), *out = malloc(out_cap);
	enum ckfs_code rc = CKFS_OK;
	z_stream zs;
	int zrc;

	memset(&zs, 0, sizeof(zs));
	if (!in || !out || inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
		free(in);
		free(out);
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	}
	for (;;) {
		size_t have;
		uInt avail_before;

		if (zs.avail_in == 0 && in_left > 0) {
			size_t n = in_left < in_cap ? (size_t)in_left : in_cap;

			rc = zip_pread(z, in, n, in_pos, err);
			if (rc)
				break;
			zs.next_in = in;
			zs.avail_in = (uInt)n;
			in_pos += n;
			in_left -= n;
		}
		zs.next_out = out;
		zs.avail_out = (uInt)out_cap;
		avail_before = zs.avail_in;
		zrc = inflate(&zs, Z_NO_FLUSH);
		if (zrc == Z_NEED_DICT || zrc == Z_DATA_ERROR ||
		    zrc == Z_STREAM_ERROR) {
			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': corrupt deflate data in record '%s' (%s)",
				       z->label, e->name,
				       zs.msg ? zs.msg : "unknown error");
			break;
		}
		if (zrc == Z_MEM_ERROR) {
			rc = ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				       z->label);
			break;
		}
		have = out_cap - zs.avail_out;
		if (have > e->size - produced) {
			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': record '%s' inflates past its declared size of %llu bytes",
				       z->label, e->name, (ull)e->size);
			break;
		}
		if (have)
			sink(ctx, out, have);
		produced += have;
		if (zrc == Z_STREAM_END)
			break;
		/* Z_OK or Z_BUF_ERROR. Input is refilled whenever it runs out
		 * and output space is fresh each round, so no progress means
		 * the stream needs bytes past comp_size. */
		if (have == 0 && zs.avail_in == avail_before) {
			rc = ckfs_fail(err, CKFS_E_TRUNCATED,
				       "'%s': deflate data of record '%s' truncated",
				       z->label, e->name);
			break;
		}
	}
	if (!rc && produced != e->size)
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': record '%s' inflates to %llu bytes, not the declared %llu",
			       z->label, e->name, (ull)produced, (ull)e->size);
	inflateEnd(&zs);
	free(in);
	free(out);
	return rc;
}

struct zip_copy {
	unsigned char *p;
};

static void zip_copy_sink(void *ctx, const unsigned char *p, size_t n)
{
	struct zip_copy *c = ctx;

	memcpy(c->p, p, n);
	c->p += n;
}

enum ckfs_code ckfs_zip_read_record(const struct ckfs_zip *z,
				    const struct ckfs_zip_entry *e,
				    uint64_t max, void **out, size_t *len,
				    struct ckfs_error *err)
{
	unsigned char *buf;
	enum ckfs_code rc;

	if (out)
		*out = NULL;
	if (len)
		*len = 0;
	if (!z || !e || !out || !len)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "ckfs_zip_read_record: missing argument");
	if (e->size > max || e->size >= SIZE_MAX)
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': record '%s' is %llu bytes, more than the limit of %llu",
				 z->label, e->name, (ull)e->size, (ull)max);
	CKFS_TRY(ckfs_zip_check_derived(z, e, err));
	buf = malloc((size_t)e->size + 1);
	if (!buf)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory",
				 z->label);
	if (e->method == ZIP_METHOD_STORED) {
		rc = zip_pread(z, buf, (size_t)e->size, e->data_offset - z->base,
			       err);
	} else {
		struct zip_copy c = { buf };

		rc = zip_inflate(z, e, zip_copy_sink, &c, err);
	}
	if (rc) {
		free(buf);
		return rc;
	}
	buf[e->size] = '\0';
	*out = buf;
	*len = (size_t)e->size;
	return CKFS_OK;
}

static void zip_crc_sink(void *ctx, const unsigned char *p, size_t n)
{
	uLong *crc = ctx;

	*crc = crc32(*crc, p, (uInt)n);
}

enum ckfs_code ckfs_zip_verify_crc(const struct ckfs_zip *z, size_t *checked,
				   struct ckfs_error *err)
{
	unsigned char *buf = NULL;
	enum ckfs_code rc = CKFS_OK;
	size_t n_checked = 0;

	if (checked)
		*checked = 0;
	if (!z)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "ckfs_zip_verify_crc: missing argument");
	for (size_t i = 0; i < z->n_entries && !rc; i++) {
		const struct ckfs_zip_entry *e = &z->entries[i];
		uLong crc = crc32(0L, Z_NULL, 0);

		if (e->crc32 == 0)
			continue;
		if ((rc = ckfs_zip_check_derived(z, e, err)) != CKFS_OK)
			break;
		if (e->method == ZIP_METHOD_STORED) {
			uint64_t pos = e->data_offset - z->base;
			uint64_t left = e->size;

			if (!buf && !(buf = malloc(ZIP_IO_CHUNK))) {
				rc = ckfs_fail(err, CKFS_E_NOMEM,
					       "'%s': out of memory", z->label);
				break;
			}
			while (left && !rc) {
				size_t n = left < ZIP_IO_CHUNK ? (size_t)left
							       : ZIP_IO_CHUNK;

				rc = zip_pread(z, buf, n, pos, err);
				if (rc)
					break;
				crc = crc32(crc, buf, (uInt)n);
				pos += n;
				left -= n;
			}
		} else {
			rc = zip_inflate(z, e, zip_crc_sink, &crc, err);
		}
		if (!rc && (uint32_t)crc != e->crc32)
			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': crc mismatch in record '%s'",
				       z->label, e->name);
		if (!rc)
			n_checked++;
	}
	free(buf);
	if (checked)
		*checked = n_checked;
	return rc;
}
