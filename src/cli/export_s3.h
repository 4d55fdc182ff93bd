/* SPDX-License-Identifier: MIT */
/* `ckfs export SRC s3://bucket/prefix` (export_s3.c): the folder written
 * as objects under prefix/, byte for byte a local export's files. */
#ifndef CKFS_CLI_EXPORT_S3_H
#define CKFS_CLI_EXPORT_S3_H

#include <signal.h>
#include <stdbool.h>

#include "ckfs/folder.h"
#include "cli/export_part.h"

struct export_store_opts {
	bool force, quiet;
	int threads;
	struct export_part part;            /* count 0: the whole export */
	const char *src;                    /* SRC as given, for the objects' digest */
	volatile sig_atomic_t *interrupted; /* set by a signal: stop, clean up */
};

enum ckfs_code export_store(const struct export_store_opts *o, const struct ckfs_model *m,
			    const struct ckfs_folder *f, const char *url, struct ckfs_error *err);

#endif
