/* SPDX-License-Identifier: MIT */
/*
 * ckfs umount MNT: unmount a ckfs mount, as root directly, as a user
 * through fusermount3; a dead mount (its daemon killed) is cleaned up.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/options.h"
#include "fuse/fs.h"

static int is_fuse_type(const char *type)
{
	return strcmp(type, "fuse") == 0 || strncmp(type, "fuse.", 5) == 0;
}

/* Non-root: fusermount3 (setuid) unmounts mounts the user made. */
static int run_fusermount(const char *mnt, int lazy)
{
	char *argv[6];
	int argc = 0;
	pid_t pid;
	int st;

	argv[argc++] = "fusermount3";
	argv[argc++] = "-u";
	if (lazy)
		argv[argc++] = "-z";
	argv[argc++] = "--";
	argv[argc++] = (char *)mnt;
	argv[argc] = NULL;
	pid = fork();
	if (pid < 0) {
		ckfs_cli_say("cannot fork: %s", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		execvp(argv[0], argv);
		ckfs_cli_say("cannot run fusermount3: %s", strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static const struct cli_opt opt_lazy = {
	.id = OPT_LAZY, .name = "lazy", .letter = 'z',
	.help = "detach a busy mount now; the daemon exits when the last file is closed"
};
static const struct cli_opt *const umount_opts[] = { &opt_lazy, NULL };

const struct cli_command ckfs_cmd_umount_def = {
	.name = "umount",
	.args = "MNT",
	.n_args = 1,
	.brief = "unmount (-z: lazily, while files are open)",
	.about = "Unmount a ckfs mount. A busy mount (files open) is refused unless -z\n"
		 "detaches it now and lets the daemon exit when the last file is\n"
		 "closed. A dead mount (daemon killed) is cleaned up.",
	.opts = umount_opts,
	.run = ckfs_cmd_umount,
};

static int umount_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	(void)v;
	*(int *)ctx |= o->id == OPT_LAZY;
	return 0;
}

int ckfs_cmd_umount(int argc, char **argv)
{
	char mnt[PATH_MAX], type[128];
	int lazy = 0, first;

	int rc = cli_parse(&ckfs_cmd_umount_def, argc, argv, umount_apply, &lazy, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	const char *arg = argv[first];
	if (ckfs_abs_path(arg, mnt, sizeof(mnt)) != 0) {
		ckfs_cli_say("'%s': %s", arg, strerror(errno));
		return 1;
	}
	switch (ckfs_mountinfo_lookup(mnt, type, sizeof(type), NULL, 0)) {
	case 0:
		ckfs_cli_say("'%s': not mounted", arg);
		return 1;
	case 1:
		if (!is_fuse_type(type)) {
			ckfs_cli_say("'%s': not a ckfs mount (%s)", arg, type);
			return 1;
		}
		break;
	default:
		break; /* cannot tell: let the kernel decide */
	}
	if (geteuid() != 0)
		return run_fusermount(mnt, lazy);
	if (umount2(mnt, lazy ? MNT_DETACH : 0) == 0)
		return 0;
	if (errno == EBUSY)
		ckfs_cli_say("'%s': busy (files are open); 'ckfs umount -z %s' detaches it now",
			     arg, arg);
	else
		ckfs_cli_say("'%s': cannot unmount: %s", arg, strerror(errno));
	return 1;
}

