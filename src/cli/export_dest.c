/* SPDX-License-Identifier: MIT */
/*
 * Where `ckfs export` may write, and what earlier exports left there.
 *
 * An export never deletes or overwrites anything it reads. DIR (through
 * symlinks) must not be the checkpoint or a folder above it, and
 * replacing an existing DIR (--force) must not remove a file the plan
 * reads: a rank file, a metadata file, config.json, a side file, a
 * --config or --base file, nor anything through a mount point inside it.
 * Folders are compared by identity (st_dev, st_ino), never by name.
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The paths an export reads: every file of the plan (rank files and
 * other sources, the layout's metadata files, config.json, side files)
 * and the folders they are read from (SRC first, its Hugging Face
 * folder), the --base model's too. NULL-terminated, malloc'd; NULL: out
 * of memory. */
static const char **read_paths(const struct ckfs_model *m, const struct ckfs_folder *f)
{
	const struct ckfs_model *b = m->base;
	size_t cap = m->n_sources + m->n_meta_files + f->n_nodes + 8 +
		     (b ? b->n_meta_files : 0), n = 0;
	const char **p = malloc(cap * sizeof(*p));

	if (!p)
		return NULL;
	for (const struct ckfs_model *x = m; x; x = x == m ? b : NULL) {
		p[n++] = x->src_dir;
		p[n++] = x->hf_dir;
		p[n++] = x->config_path;
		for (size_t i = 0; i < x->n_meta_files; i++)
			p[n++] = x->meta_files[i].path;
	}
	for (size_t i = 0; i < m->n_sources; i++)
		p[n++] = m->sources[i].path;
	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind == CKFS_NODE_PASSTHROUGH)
			p[n++] = f->nodes[i].src.path;
	/* drop the absent (no hf_dir, no --base) */
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (p[i])
			p[k++] = p[i];
	p[k] = NULL;
	return p;
}

/* DIR (identity dir) is path's folder or above it: name both. */
static enum ckfs_code above(const char *dst, const struct stat *dir, const char *path,
			    const struct ckfs_model *m, struct ckfs_error *err)
{
	int r = ckfs_path_within(path, dir);

	if (r < 0)
		return ckfs_fail_errno(err, "'%s': cannot resolve", path);
	if (r == 0)
		return CKFS_OK;
	if (strcmp(path, m->src_dir) == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': is the checkpoint '%s' or a "
				 "folder above it: export to a new folder", dst, m->src_dir);
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': holds '%s', which this export reads; "
			 "replacing the folder would delete it: export to another folder",
			 dst, path);
}

/* What the removal of an old DIR would reach, walked the way it walks
 * (ckfs_export_dest_remove: no symlink followed, no other file system
 * entered): a file this export reads, found by identity, or a mount point
 * of the same file system (a bind mount), whose files the removal would
 * delete. nftw takes no context: the CLI checks one DIR at a time. */
static struct {
	struct stat *ids;
	const char **paths;
	size_t n;
	uint64_t mnt_id;
	bool has_mnt_id;
	const char *hit_read;   /* the read path found, or NULL */
	char hit[PATH_MAX];     /* where in DIR */
} walk;

static bool mount_id(const char *path, uint64_t *id)
{
	struct statx sx;

	if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) != 0 ||
	    !(sx.stx_mask & STATX_MNT_ID))
		return false;
	*id = sx.stx_mnt_id;
	return true;
}

static int walk_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	uint64_t id;

	(void)flag;
	for (size_t i = 0; i < walk.n; i++)
		if (walk.ids[i].st_dev == sb->st_dev && walk.ids[i].st_ino == sb->st_ino) {
			walk.hit_read = walk.paths[i];
			snprintf(walk.hit, sizeof(walk.hit), "%s", path);
			return 1;
		}
	if (ftw->level > 0 && S_ISDIR(sb->st_mode) && walk.has_mnt_id &&
	    mount_id(path, &id) && id != walk.mnt_id) {
		snprintf(walk.hit, sizeof(walk.hit), "%s", path);
		return 1;
	}
	return 0;
}

static enum ckfs_code walk_dest(const char *dst, const char **paths, struct ckfs_error *err)
{
	size_t n = 0;
	enum ckfs_code rc = CKFS_OK;

	while (paths[n])
		n++;
	memset(&walk, 0, sizeof(walk));
	walk.ids = malloc((n + 1) * sizeof(*walk.ids));
	walk.paths = malloc((n + 1) * sizeof(*walk.paths));
	if (!walk.ids || !walk.paths)
		rc = ckfs_nomem(err);
	for (size_t i = 0; i < n && rc == CKFS_OK; i++)
		if (stat(paths[i], &walk.ids[walk.n]) == 0)
			walk.paths[walk.n++] = paths[i];
		else
			rc = ckfs_fail_errno(err, "'%s': cannot resolve", paths[i]);
	walk.has_mnt_id = mount_id(dst, &walk.mnt_id);
	int r = rc == CKFS_OK ? nftw(dst, walk_entry, 16, FTW_PHYS | FTW_MOUNT) : 0;
	if (r < 0)
		rc = ckfs_fail_errno(err, "'%s': cannot list", dst);
	else if (r > 0 && walk.hit_read)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': holds %s'%s' (as '%s')%s; replacing "
			       "the folder would delete it: export to another folder", dst,
			       walk.hit_read == paths[0] ? "the checkpoint " : "", walk.hit_read,
			       walk.hit, walk.hit_read == paths[0] ? "" : ", which this export reads");
	else if (r > 0)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': holds a mount point, '%s'; replacing "
			       "the folder would delete files through it: unmount it or export "
			       "to another folder", dst, walk.hit);
	free(walk.ids);
	free(walk.paths);
	memset(&walk, 0, sizeof(walk));
	return rc;
}

/* The checks by identity, (st_dev, st_ino), not by name: a bind mount or
 * an export mounted twice shows one folder under two names, and "DIR is
 * not SRC" by name then deleted SRC (issue #22). */
static enum ckfs_code check_identity(const char *dst, const struct stat *dir, bool replacing,
				     const struct ckfs_model *m, const char **paths,
				     struct ckfs_error *err)
{
	struct stat hf;

	CKFS_TRY(above(dst, dir, m->src_dir, m, err));
	if (!replacing)
		return CKFS_OK;
	if (m->hf_dir && stat(m->hf_dir, &hf) == 0 && hf.st_dev == dir->st_dev &&
	    hf.st_ino == dir->st_ino)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': is the checkpoint's Hugging "
				 "Face folder, whose config and tokenizer this export reads "
				 "(and copies): export to a new folder, e.g. '%s/merged'", dst,
				 m->src_dir);
	for (size_t i = 0; paths[i]; i++)
		CKFS_TRY(above(dst, dir, paths[i], m, err));
	/* Walking up from each read file misses a DIR above another name of
	 * its folder (DIR holds d, and SRC is b/ckpt with b bound to d): the
	 * walk down through what the removal would reach does not. */
	return walk_dest(dst, paths, err);
}

enum ckfs_code ckfs_export_dest_check(const char *dst, bool replacing,
				      const struct ckfs_model *m,
				      const struct ckfs_folder *f, struct ckfs_error *err)
{
	const char *base = strrchr(dst, '/') ? strrchr(dst, '/') + 1 : dst;
	struct stat dir;

	if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': name the folder to write, not "
				 "'.' or '..'", dst);
	if (stat(dst, &dir) != 0)
		/* nothing there (or a dangling link): above nothing */
		return errno == ENOENT ? CKFS_OK : ckfs_fail_errno(err, "'%s': cannot resolve", dst);
	const char **paths = read_paths(m, f);
	if (!paths)
		return ckfs_nomem(err);
	enum ckfs_code rc = check_identity(dst, &dir, replacing, m, paths, err);
	free(paths);
	return rc;
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
