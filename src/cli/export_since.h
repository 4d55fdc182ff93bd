/* SPDX-License-Identifier: MIT */
/*
 * ckfs export --since PREV (export_since.c): an export that writes only
 * what changed since PREV, an earlier export of the same model with the
 * same options. Every weight file is still assembled from the sources and
 * compared with PREV's bytes (never judged by names or timestamps); the
 * ranges that differ are written, the rest comes from PREV: the whole
 * file hard-linked (or reflinked) when nothing in it changed, else its
 * unchanged ranges reflinked where the file system can, copied in the
 * kernel where it cannot. The folder is byte for byte the full export's.
 */
#ifndef CKFS_CLI_EXPORT_SINCE_H
#define CKFS_CLI_EXPORT_SINCE_H

#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckfs/folder.h"

struct export_since;

/* What an export since PREV did, against a full export's bytes. */
struct export_since_totals {
	uint64_t full;          /* bytes a full export writes */
	uint64_t written;       /* bytes written: assembled and written, the
				 * other files, and ranges copied from PREV */
	uint64_t copied;        /* of written: copied from PREV in the kernel */
	uint64_t linked;        /* whole files hard-linked from PREV */
	uint64_t cloned;        /* reflinked from PREV (shared blocks) */
	size_t files_linked, files_cloned;
	size_t tensors, tensors_unchanged;
};

/* Open PREV for an export of folder f from src: every weight file of f
 * must be in PREV with f's size and header bytes (else the export is
 * refused: PREV is not an export of this model with these options). */
enum ckfs_code export_since_open(const char *prev, const char *src, const struct ckfs_folder *f,
				 struct export_since **out, struct ckfs_error *err) CKFS_WARN_UNUSED;
void export_since_close(struct export_since *s);

/* Write weight node n of f at path (not there yet) with mode (for group
 * gid), assembling it on `threads` threads; stops early when *stop is set
 * (the caller reports the interruption). */
enum ckfs_code export_since_write(struct export_since *s, const struct ckfs_folder *f,
				  const struct ckfs_node *n, const char *path, mode_t mode,
				  gid_t gid, int threads, volatile sig_atomic_t *stop,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;

const struct export_since_totals *export_since_totals(const struct export_since *s);

#endif
