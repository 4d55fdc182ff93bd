/* SPDX-License-Identifier: MIT */
/*
 * Read-only view of a zip archive stored at [base, base + length) of an open
 * file: a torch.save file (base 0) or a torch.save item embedded in a DCP
 * .distcp file. The central directory is parsed here (zip64 aware) because
 * libzip does not expose where an entry's data starts; tensor bytes are then
 * read in place with pread at ckfs_zip_entry.data_offset and never loaded
 * whole. Small records (data.pkl, version) are read with
 * ckfs_zip_read_record(), which inflates deflated entries (with zlib; see
 * src/fmt/zip.c for why not libzip) and caps the size.
 * ckfs_zip_verify_crc() checks stored CRC32s with zlib.
 *
 * Thread safety: the struct is read-only after ckfs_zip_open() and all reads
 * use pread(), so concurrent find/read_record/verify_crc calls are fine.
 *
 * Not done here: anything torch-specific beyond the common top folder.
 */
#ifndef CKFS_ZIP_H
#define CKFS_ZIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/err.h"
#include "ckfs/file.h"

struct ckfs_zip_entry {
	char *name;               /* full name, e.g. "archive/data/0" */
	uint64_t header_offset;   /* local header, absolute file offset */
	uint64_t data_offset;     /* first data byte, absolute file offset */
	uint64_t comp_size;       /* stored bytes */
	uint64_t size;            /* uncompressed bytes */
	uint32_t crc32;           /* 0 means none was written */
	uint16_t method;          /* 0 stored, 8 deflate */
	uint16_t flags;
	/* data_offset derived from torch.save's alignment rule, the local
	 * header not read (CKFS_ZIP_DERIVE_LOCALS): ckfs_zip_check_derived
	 * must pass before a byte of the data is used */
	bool derived;
};

struct ckfs_zip {
	const char *label;        /* for messages, borrowed */
	struct ckfs_file file;    /* borrowed; the caller keeps it open */
	uint64_t base, length;
	size_t n_entries;
	struct ckfs_zip_entry *entries; /* in central directory order */
	char *prefix;             /* top folder incl. '/', "" if none */
	uint64_t prefix_hash;     /* the name hash's state after prefix */
	size_t *hash;             /* open addressing by name: index + 1, 0 empty */
	size_t hash_cap;          /* a power of two, at least 2 n_entries */
};

/*
 * Parse the directory of the zip at [base, base+length) of f. label names
 * the file in error messages. Validates every entry: offsets and sizes inside
 * the window, local header signature and name equal to the central one,
 * no overlapping data. The top folder is the text before the first '/' of
 * entry 0 (as torch does). Files that are not zips give CKFS_E_FORMAT; a
 * legacy torch pickle (starts with 0x80 0x02) gives CKFS_E_UNSUPPORTED
 * "legacy (non-zip) torch.save format is not supported".
 */
enum ckfs_code ckfs_zip_open(struct ckfs_zip *z, struct ckfs_file f, uint64_t base,
			     uint64_t length, const char *label,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_zip_release(struct ckfs_zip *z);

/*
 * ckfs_zip_open with flags. CKFS_ZIP_DERIVE_LOCALS: a local header that
 * would cost a read of its own (it follows a large record) is not read
 * when the archive's other local headers show torch.save's writer (data
 * aligned to 64 bytes of the archive after an "FB" padding block, zip64
 * blocks where torch puts them): its data_offset is derived, every check
 * that needs only the offsets is run on it, and the entry is marked
 * derived; the caller must run ckfs_zip_check_derived (or
 * ckfs_zip_check_local_at) before using a byte of its data. Headers read
 * are checked as ckfs_zip_open checks them; an archive whose headers do
 * not follow the rule has every header read.
 */
enum ckfs_zip_open_flags {
	CKFS_ZIP_DERIVE_LOCALS = 1u << 0,
};
enum ckfs_code ckfs_zip_open_ex(struct ckfs_zip *z, struct ckfs_file f, uint64_t base,
				uint64_t length, const char *label, unsigned flags,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * The local header at header_offset (absolute) of the entry named name,
 * checked as ckfs_zip_open checks one (signature, name, method) and
 * required to end exactly at data_offset (absolute): one read of
 * data_offset - header_offset bytes. CKFS_E_FORMAT naming label and the
 * entry when it does not.
 */
enum ckfs_code ckfs_zip_check_local_at(struct ckfs_file f, const char *label, const char *name,
				       uint64_t header_offset, uint64_t data_offset,
				       uint16_t method, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* CKFS_OK for an entry whose header was read; for a derived one, its
 * header checked now (ckfs_zip_check_local_at; nothing is remembered). */
enum ckfs_code ckfs_zip_check_derived(const struct ckfs_zip *z, const struct ckfs_zip_entry *e,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Entry named prefix + record ("data.pkl", "data/3"), or NULL. */
const struct ckfs_zip_entry *ckfs_zip_find(const struct ckfs_zip *z,
					   const char *record);

/*
 * Read a whole record into a new malloc'd buffer (caller frees), inflating
 * if needed; refuses records larger than max bytes with CKFS_E_LIMIT.
 * A NUL is appended after the data (not counted in *len).
 */
enum ckfs_code ckfs_zip_read_record(const struct ckfs_zip *z,
				    const struct ckfs_zip_entry *e,
				    uint64_t max, void **out, size_t *len,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Recompute the CRC32 of every entry whose stored CRC is non-zero.
 * *checked receives how many were checked. */
enum ckfs_code ckfs_zip_verify_crc(const struct ckfs_zip *z, size_t *checked,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Re-read the directory with libzip and require the same records, sizes,
 * methods and CRCs (for ckfs verify). Archives embedded at base > 0 are
 * not checked. */
enum ckfs_code ckfs_zip_crosscheck(const struct ckfs_zip *z,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
