/* SPDX-License-Identifier: MIT */
/* Placeholder until src/fuse lands: refuses clearly. */
#include <stdio.h>

#include "cli/cli.h"

int ckfs_cmd_mount(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "ckfs: mount is not available in this build\n");
	return 1;
}

int ckfs_cmd_umount(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "ckfs: umount is not available in this build\n");
	return 1;
}
