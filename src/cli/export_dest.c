/* SPDX-License-Identifier: MIT */
/*
 * Where `ckfs export` may write, and what earlier exports left there.
 *
 * An export never deletes or overwrites anything it reads. DIR (its real
 * path, through symlinks) must not be the checkpoint or a folder above
 * it, and replacing an existing DIR (--force) must not remove a file the
 * plan reads: a rank file, config.json, a side file, a --config file.
 * verl's docs merge into `actor/huggingface`, the folder holding the
 * config and tokenizer the export reads: that is refused with advice (the
 * export copies them into the new folder anyway). A new DIR inside the
 * checkpoint is fine.
 *
 * An export builds DIR.ckfs-tmp-PID and, with --force, moves the old DIR
 * to DIR.ckfs-old-PID before removing it. It holds an flock on each of
 * those folders while they are its own, so a folder of that name whose
 * lock is free and whose process is gone was left by an export that was
 * killed (SIGKILL, a crash, a power cut). The next export to DIR removes
 * such temporary folders, saying so; an old folder is removed only when
 * DIR exists again (the replacement had completed), else it is kept and
 * pointed out, since it holds the only copy of the previous output.
 */
#include "cli/export_dest.h"
#include "cli/cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The real path dst has or would have: through every symlink, the last
 * component too when it exists. 0, or -1 with errno. */
static int real_dest(const char *dst, char *out, size_t size)
{
	char parent[PATH_MAX], buf[PATH_MAX];
	const char *slash = strrchr(dst, '/');

	if (realpath(dst, buf)) {
		snprintf(out, size, "%s", buf);
		return 0;
	}
	if (errno != ENOENT)
		return -1;
	if (!slash)
		snprintf(parent, sizeof(parent), ".");
	else if (slash == dst)
		snprintf(parent, sizeof(parent), "/");
	else
		snprintf(parent, sizeof(parent), "%.*s", (int)(slash - dst), dst);
	if (!realpath(parent, buf))
		return -1;
	const char *base = slash ? slash + 1 : dst;
	if ((size_t)snprintf(out, size, "%s%s%s", buf, strcmp(buf, "/") ? "/" : "", base) >= size) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

/* A file the plan reads lies in real_dst: name it. */
static enum ckfs_code read_inside(const char *dst, const char *real_dst, const char *path,
				  struct ckfs_error *err)
{
	char real[PATH_MAX];

	if (!path || !realpath(path, real) || !ckfs_path_under(real, real_dst))
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': holds '%s', which this export reads; "
			 "replacing the folder would delete it: export to another folder",
			 dst, path);
}

enum ckfs_code ckfs_export_dest_check(const char *dst, bool replacing,
				      const struct ckfs_model *m,
				      const struct ckfs_folder *f, struct ckfs_error *err)
{
	char real_dst[PATH_MAX], real_hf[PATH_MAX];
	const char *base = strrchr(dst, '/') ? strrchr(dst, '/') + 1 : dst;

	if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': name the folder to write, not "
				 "'.' or '..'", dst);
	if (real_dest(dst, real_dst, sizeof(real_dst)) != 0)
		return ckfs_fail_errno(err, "'%s': cannot resolve", dst);
	if (ckfs_path_under(m->src_dir, real_dst))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': is the checkpoint '%s' or a "
				 "folder above it: export to a new folder", dst, m->src_dir);
	if (!replacing)
		return CKFS_OK;
	if (m->hf_dir && realpath(m->hf_dir, real_hf) && strcmp(real_hf, real_dst) == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': is the checkpoint's Hugging "
				 "Face folder, whose config and tokenizer this export reads "
				 "(and copies): export to a new folder, e.g. '%s/merged'", dst,
				 m->src_dir);
	CKFS_TRY(read_inside(dst, real_dst, m->config_path, err));
	for (size_t i = 0; i < m->n_sources; i++)
		CKFS_TRY(read_inside(dst, real_dst, m->sources[i].path, err));
	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind == CKFS_NODE_PASSTHROUGH)
			CKFS_TRY(read_inside(dst, real_dst, f->nodes[i].src.path, err));
	return CKFS_OK;
}

int ckfs_export_dest_lock(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
			struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int ckfs_export_dest_remove(const char *dir)
{
	return nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* "<base>.ckfs-<kind>-<pid>" -> pid, else 0. */
static long stale_pid(const char *name, const char *base, const char *kind)
{
	size_t bl = strlen(base), kl = strlen(kind);
	char *end;

	if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".ckfs-", 6) != 0 ||
	    strncmp(name + bl + 6, kind, kl) != 0 || name[bl + 6 + kl] != '-')
		return 0;
	const char *digits = name + bl + 6 + kl + 1;
	errno = 0;
	long pid = strtol(digits, &end, 10);
	return errno || end == digits || *end || pid <= 0 ? 0 : pid;
}

/* A folder of an export whose process is gone: its lock is free (we now
 * hold it: *fd) and no process has its pid. */
static int abandoned(const char *path, long pid, int *fd)
{
	struct stat st;

	*fd = -1;
	if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || pid == (long)getpid())
		return 0;
	if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
		return 0; /* alive, or not ours to tell */
	*fd = ckfs_export_dest_lock(path);
	return *fd >= 0;
}

void ckfs_export_dest_clean(const char *dst)
{
	char parent[PATH_MAX], path[2 * PATH_MAX];
	const char *slash = strrchr(dst, '/');
	const char *base = slash ? slash + 1 : dst;
	struct stat st;

	if (!slash)
		snprintf(parent, sizeof(parent), ".");
	else
		snprintf(parent, sizeof(parent), "%.*s", slash == dst ? 1 : (int)(slash - dst), dst);
	DIR *d = opendir(parent);
	if (!d)
		return;
	int dst_exists = lstat(dst, &st) == 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		long tmp_pid = stale_pid(de->d_name, base, "tmp");
		long old_pid = stale_pid(de->d_name, base, "old");
		int fd;
		if (!tmp_pid && !old_pid)
			continue;
		snprintf(path, sizeof(path), "%s/%s", parent, de->d_name);
		if (!abandoned(path, tmp_pid ? tmp_pid : old_pid, &fd))
			continue;
		if (old_pid && !dst_exists)
			ckfs_cli_say("note: '%s' holds what '%s' held before an "
				"interrupted --force export (process %ld, gone); kept: move it "
				"back or remove it", path, dst, old_pid);
		else if (ckfs_export_dest_remove(path) == 0)
			ckfs_cli_say("removed '%s', left by an interrupted export "
				"(process %ld, gone)", path, tmp_pid ? tmp_pid : old_pid);
		else
			ckfs_cli_say("warning: cannot remove '%s', left by an "
				"interrupted export: %s", path, strerror(errno));
		close(fd);
	}
	closedir(d);
}
