/* SPDX-License-Identifier: MIT */
/* ckfs inspect of a run or of one step (inspect_run.c). */
#ifndef CKFS_CLI_INSPECT_RUN_H
#define CKFS_CLI_INSPECT_RUN_H

#include <stdbool.h>

#include "cli/options.h"

/* Print what the mount of src would show; single: src is one step.
 * Returns the exit status. */
int ckfs_inspect_run(const char *src, bool single, const struct cli_common *c);

#endif
