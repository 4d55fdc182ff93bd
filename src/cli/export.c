/* SPDX-License-Identifier: MIT */
/*
 * ckfs export SRC DIR: writes the folder the mount shows. Files are built
 * in a temporary sibling folder and renamed into place only when all of
 * them are written and synced, so a failure (full disk, a source that
 * changed, Ctrl-C) leaves no partial output. Weight files are assembled
 * by worker threads, each owning one block buffer: memory stays at
 * threads x block size whatever the model size.
 *
 * Permissions carry over as they do on a mount (include/ckfs/perm.h): the
 * exporting user keeps rw, and group and others get read only where
 * every source the file is made from let them read it (0644 at most,
 * 0755 for the folder, less the process umask). Exporting a private
 * checkpoint to a shared folder never makes it readable there; chmod
 * publishes it on purpose. Weight files end read-only (0444 at most): a
 * merged model is not edited in place, and --since hard-links them into
 * the next export, so a write into one would change both.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/io.h"
#include "ckfs/layouts.h"
#include "ckfs/log.h"
#include "ckfs/perm.h"
#include "ckfs/units.h"

#include "ckfs/run.h"
#include "ckfs/s3.h"
#include "cli/cli.h"
#include "cli/export_dest.h"
#include "cli/export_part.h"
#include "cli/export_s3.h"
#include "cli/export_since.h"
#include "cli/options.h"

#define EXPORT_BLOCK (8u << 20)

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* Ctrl-C, a kill or a hang-up: stop, clean up, exit 130. */
static void catch_signals(void)
{
	struct sigaction sa = { .sa_handler = on_signal };

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

struct job {
	const struct ckfs_folder *folder;
	const struct ckfs_node *node;
	int fd;
	int dfd; /* the same file opened O_DIRECT, or -1 */
	uint64_t n_blocks;
	atomic_uint_fast64_t next_block;
	atomic_uint_fast64_t bytes_done;
	atomic_int workers_left;
	struct ckfs_first_error fail;
};

static enum ckfs_code write_all(int fd, const void *buf, size_t len, uint64_t off,
				const char *path, struct ckfs_error *err)
{
	if (ckfs_pwrite_full(fd, buf, len, off) != (ssize_t)len)
		return ckfs_fail_errno(err, "'%s': write failed", path);
	return CKFS_OK;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	struct ckfs_read_scratch scratch = { 0 };
	struct ckfs_error err;
	void *buf = NULL;

	ckfs_error_clear(&err);
	/* Page-aligned, for O_DIRECT. */
	if (posix_memalign(&buf, 4096, EXPORT_BLOCK) != 0)
		buf = NULL;
	if (!buf) {
		ckfs_nomem(&err);
		ckfs_first_error_set(&j->fail, &err);
	}
	while (buf && !atomic_load(&j->fail.failed) && !interrupted) {
		uint64_t b = atomic_fetch_add(&j->next_block, 1);
		if (b >= j->n_blocks)
			break;
		uint64_t off = b * EXPORT_BLOCK;
		size_t got;
		if (ckfs_folder_read(j->folder, j->node, off, EXPORT_BLOCK, buf, &got,
				     &scratch, &err) != CKFS_OK) {
			ckfs_first_error_set(&j->fail, &err);
			break;
		}
		/* Whole blocks go straight to the disk (no copy into the page
		 * cache, no dirty pages to write back); the short last one, or
		 * all of them where the file system refuses O_DIRECT, through
		 * the page cache, started back at once so the final fsync has
		 * little left (a hint: fsync reports any error). */
		ssize_t w = -1;
		if (j->dfd >= 0 && got == EXPORT_BLOCK) {
			do
				w = pwrite(j->dfd, buf, got, (off_t)off);
			while (w < 0 && errno == EINTR);
		}
		if (w != (ssize_t)got) {
			size_t done = w > 0 ? (size_t)w : 0;
			if (write_all(j->fd, (const char *)buf + done, got - done, off + done,
				      j->node->name, &err) != CKFS_OK) {
				ckfs_first_error_set(&j->fail, &err);
				break;
			}
			sync_file_range(j->fd, (off_t)off, (off_t)got, SYNC_FILE_RANGE_WRITE);
		}
		atomic_fetch_add(&j->bytes_done, got);
	}
	free(buf);
	ckfs_read_scratch_release(&scratch);
	atomic_fetch_sub(&j->workers_left, 1);
	return NULL;
}

struct progress {
	int enabled;
	uint64_t total, base;
	struct timespec start;
};

static double since(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

static void progress_draw(const struct progress *p, uint64_t done, const char *name)
{
	char a[32], b[32];
	double secs = since(&p->start);

	if (!p->enabled)
		return;
	ckfs_format_bytes((double)(p->base + done), a, sizeof(a));
	ckfs_format_bytes((double)p->total, b, sizeof(b));
	fprintf(stderr, "\r%3.0f%%  %s / %s  %.0f MB/s  %-40.40s",
		p->total ? 100.0 * (double)(p->base + done) / (double)p->total : 100.0,
		a, b, secs > 0 ? (double)(p->base + done) / secs / 1e6 : 0.0, name);
	fflush(stderr);
}

/* The modes an export is written with. */
struct export_modes {
	mode_t *files;  /* per node: 0600 plus the carried group/other read */
	mode_t dir;     /* 0700 plus the carried group/other read and search */
	gid_t gid;      /* the group they were carried for: the folder's */
};

/* Carry the sources' permissions to the files of tmp (just created), for
 * this user and the group tmp's files get (tmp's own: the process's, or
 * the parent's when it is setgid). */
static enum ckfs_code carry_modes(const struct ckfs_folder *f, const char *tmp,
				  struct export_modes *em, struct ckfs_error *err)
{
	struct ckfs_owner owner;
	struct stat st;
	mode_t root;
	enum ckfs_code rc;

	if (stat(tmp, &st) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", tmp);
	em->gid = st.st_gid;
	em->files = calloc(f->n_nodes ? f->n_nodes : 1, sizeof(*em->files));
	if (!em->files)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_owner_init(&owner, geteuid(), st.st_gid, err));
	rc = ckfs_folder_modes(f, &owner, em->files, &root, err);
	ckfs_owner_release(&owner);
	em->dir = 0700 | (root & 0055);
	for (size_t i = 0; i < f->n_nodes; i++)
		em->files[i] = f->nodes[i].kind == CKFS_NODE_DIR ? em->dir
							 : 0600 | (em->files[i] & 0044);
	return rc;
}

/* A weight file once written: read-only (0444 at most), as a merged model
 * is not edited in place, and --since hard-links it into later exports. */
static mode_t read_only(mode_t mode)
{
	return mode & ~(mode_t)0222;
}

static enum ckfs_code write_node(const struct ckfs_folder *f, const struct ckfs_node *n,
				 const char *dir, const struct export_modes *em,
				 int threads, struct export_since *prev, struct progress *prog,
				 struct ckfs_error *err)
{
	char path[PATH_MAX];
	enum ckfs_code rc = CKFS_OK;
	mode_t mode = em->files[n - f->nodes];
	struct stat st;

	if (snprintf(path, sizeof(path), "%s/%s", dir, n->name) >= (int)sizeof(path))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': path too long", dir);
	if (n->kind == CKFS_NODE_DIR) /* before what it holds: nodes are in path order */
		return mkdir(path, mode) == 0 ? CKFS_OK
					      : ckfs_fail_errno(err, "'%s': cannot create", path);
	if (prev && n->kind == CKFS_NODE_WEIGHTS) { /* only what changed since PREV */
		/* created read-only (the creator's descriptor still writes), so
		 * that PREV's read-only files match it and are linked */
		enum ckfs_code rc2 = export_since_write(prev, f, n, path, read_only(mode), em->gid,
							threads, &interrupted, err);
		prog->base += n->size;
		progress_draw(prog, 0, n->name);
		return rc2;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
	if (fd < 0)
		return ckfs_fail_errno(err, "'%s': cannot create", path);
	/* Group read was carried for the folder's group; a file given another
	 * one (an unusual file system) keeps it closed. */
	if ((mode & 0040) && (fstat(fd, &st) != 0 || st.st_gid != em->gid) &&
	    fchmod(fd, mode & ~0070) != 0) {
		close(fd);
		return ckfs_fail_errno(err, "'%s': cannot set its mode", path);
	}
	/* Reserve the space first so a full disk fails before any work. */
	if (n->size) {
		int e = posix_fallocate(fd, 0, (off_t)n->size);
		if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
			errno = e;
			close(fd);
			return ckfs_fail_errno(err, "'%s': cannot reserve %llu bytes",
					       path, (unsigned long long)n->size);
		}
	}
	struct job j = { .folder = f, .node = n, .fd = fd, .dfd = -1 };
	if (n->kind == CKFS_NODE_WEIGHTS && n->size >= EXPORT_BLOCK)
		j.dfd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1: buffered */
	j.n_blocks = (n->size + EXPORT_BLOCK - 1) / EXPORT_BLOCK;
	ckfs_first_error_init(&j.fail);
	int nt = n->kind == CKFS_NODE_WEIGHTS ? threads : 1;
	if ((uint64_t)nt > j.n_blocks)
		nt = j.n_blocks ? (int)j.n_blocks : 1;
	pthread_t tids[256];
	int started = 0;
	atomic_store(&j.workers_left, nt);
	for (int i = 0; i < nt; i++) {
		if (pthread_create(&tids[i], NULL, worker, &j) != 0) {
			atomic_fetch_sub(&j.workers_left, nt - i);
			ckfs_first_error_no_thread(&j.fail);
			break;
		}
		started++;
	}
	while (atomic_load(&j.workers_left) > 0) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		progress_draw(prog, atomic_load(&j.bytes_done), n->name);
	}
	for (int i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	prog->base += atomic_load(&j.bytes_done);
	if (j.fail.err.code != CKFS_OK) {
		*err = j.fail.err;
		rc = err->code;
	} else if (interrupted) {
		rc = ckfs_fail(err, CKFS_E_IO, "interrupted");
	} else if (n->kind == CKFS_NODE_WEIGHTS && fchmod(fd, read_only(mode)) != 0) {
		rc = ckfs_fail_errno(err, "'%s': cannot set its mode", path);
	} else if (fsync(fd) != 0) {
		rc = ckfs_fail_errno(err, "'%s': fsync failed", path);
	}
	ckfs_first_error_destroy(&j.fail);
	if (j.dfd >= 0 && close(j.dfd) != 0 && rc == CKFS_OK)
		rc = ckfs_fail_errno(err, "'%s': close failed", path);
	if (close(fd) != 0 && rc == CKFS_OK)
		rc = ckfs_fail_errno(err, "'%s': close failed", path);
	return rc;
}

/* Remove a folder ckfs created: what it holds before each folder. */
static void remove_tree(const char *dir, const struct ckfs_folder *f)
{
	char path[PATH_MAX];

	for (size_t i = f ? f->n_nodes : 0; i-- > 0;) {
		const struct ckfs_node *n = &f->nodes[i];
		if (snprintf(path, sizeof(path), "%s/%s", dir, n->name) < (int)sizeof(path)) {
			if (n->kind == CKFS_NODE_DIR)
				rmdir(path);
			else
				unlink(path);
		}
	}
	rmdir(dir);
}

static int sync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	close(fd);
	return rc;
}

static void parent_of(const char *path, char *out, size_t size)
{
	snprintf(out, size, "%s", path);
	char *slash = strrchr(out, '/');
	while (slash && slash > out && slash[1] == '\0') { /* trailing slashes */
		*slash = '\0';
		slash = strrchr(out, '/');
	}
	if (!slash)
		snprintf(out, size, ".");
	else if (slash == out)
		out[1] = '\0';
	else
		*slash = '\0';
}

struct export_args {
	struct cli_common c;
	bool force, quiet;
	int threads;
	const char *since;
	struct export_part part;
};

static const struct cli_opt opt_force = {
	.id = OPT_FORCE, .name = "force", .letter = 'f',
	.help = "replace DIR if it exists (a folder holding nothing the export reads), "
		"once the new one is complete"
};
static const struct cli_opt opt_threads = {
	.id = OPT_EXPORT_THREADS, .name = "threads", .arg = "N",
	.kind = CLI_COUNT, .lo = 1, .hi = 256,
	.help = "threads assembling the weights (default: the CPUs, at most 16; 16 for an s3:// source)"
};
static const struct cli_opt opt_since = {
	.id = OPT_SINCE,
	.name = "since",
	.arg = "PREV",
	.kind = CLI_TEXT,
	.help = "PREV is an earlier export of this model with the same options (local "
		"folders only: not yet for an s3:// DIR or PREV): "
		"compare every weight file with it and write only what changed (files "
		"unchanged hard-linked or reflinked from PREV); DIR is the same folder"
};
static const struct cli_opt opt_part = {
	.id = OPT_PART,
	.name = "part",
	.arg = "I/N",
	.kind = CLI_TEXT,
	.help = "write part I of N (0 <= I < N) of the export, each process its share of the "
		"weight files by bytes to read, into DIR.ckfs-parts; part 0 then writes the rest "
		"and puts DIR in place. auto: I and N from RANK and WORLD_SIZE or "
		"SLURM_ARRAY_TASK_ID and _COUNT; auto/N: I alone, or JOB_COMPLETION_INDEX"
};
static const struct cli_opt opt_quiet = {
	.id = OPT_QUIET, .name = "quiet", .letter = 'q', .help = "no progress, warnings or summary"
};

static const struct cli_opt *const export_opts[] = {
	&cli_opt_dtype,
	&cli_opt_max_shard_size,
	&cli_opt_transformers_version,
	CLI_SOURCE_OPTS,
	&opt_force,
	&opt_threads,
	&opt_since,
	&opt_part,
	&opt_quiet,
	CLI_MODEL_OPTS,
	&cli_opt_format,
	&cli_opt_model_name,
	&cli_opt_log_level,
	NULL,
};

static int export_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v);

const struct cli_command ckfs_cmd_export_def = {
	.name = "export",
	.args = "SRC DIR",
	.n_args = 2,
	.brief = "write the merged Hugging Face folder",
	.about = "Write the merged Hugging Face folder of checkpoint SRC to DIR, the\n"
		 "files the mount shows, byte for byte. DIR appears only once every\n"
		 "file is written and synced. Group and others may read a file only\n"
		 "where they may read every source it is made from (0644 and 0755 at\n"
		 "most, less the umask). DIR may be s3://bucket/prefix: the files go\n"
		 "to the store as multipart uploads, config.json last.",
	.opts = export_opts,
	.run = ckfs_cmd_export,
};

static int export_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	struct export_args *a = ctx;
	int rc = cli_apply_common(&ckfs_cmd_export_def, &a->c, o, v);

	if (rc >= 0)
		return rc;
	switch (o->id) {
	case OPT_FORCE: a->force = true; return 0;
	case OPT_QUIET: a->quiet = true; return 0;
	case OPT_SINCE: a->since = v->text; return 0;
	case OPT_PART: {
		const char *why = NULL;
		if (!export_part_parse(v->text, &a->part, &why))
			return ckfs_cli_usage_error("export", "bad --part '%s' (%s)", v->text, why);
		return 0;
	}
	case OPT_EXPORT_THREADS:
		a->threads = (int)v->n;
		return 0;
	default:
		return 0;
	}
}

/* The written folder tmp given its mode, it and its folders synced. */
static enum ckfs_code seal_folder(const struct ckfs_folder *f, const char *tmp, mode_t mode,
				  struct ckfs_error *err)
{
	if (chmod(tmp, mode) != 0)
		return ckfs_fail_errno(err, "'%s': cannot set its mode", tmp);
	for (size_t i = 0; i < f->n_nodes; i++) {
		char path[PATH_MAX];
		if (f->nodes[i].kind == CKFS_NODE_DIR &&
		    snprintf(path, sizeof(path), "%s/%s", tmp, f->nodes[i].name) <
			    (int)sizeof(path) &&
		    sync_dir(path) != 0)
			return ckfs_fail_errno(err, "'%s': fsync failed", path);
	}
	return sync_dir(tmp) != 0 ? ckfs_fail_errno(err, "'%s': fsync failed", tmp) : CKFS_OK;
}

/* Every file of f into the folder tmp, with the carried modes, synced. */
static enum ckfs_code write_folder(const struct export_args *a, const struct ckfs_folder *f,
				   const char *tmp, struct export_since *prev,
				   struct progress *prog, struct ckfs_error *err)
{
	struct export_modes em = { 0 };
	mode_t process_umask = umask(0); /* read it (no threads yet) */
	enum ckfs_code rc;

	umask(process_umask);
	rc = carry_modes(f, tmp, &em, err);
	prog->enabled = !a->quiet && isatty(STDERR_FILENO);
	clock_gettime(CLOCK_MONOTONIC, &prog->start);
	for (size_t i = 0; i < f->n_nodes; i++)
		prog->total += f->nodes[i].size;
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++)
		rc = write_node(f, &f->nodes[i], tmp, &em, a->threads, prev, prog, err);
	if (prog->enabled)
		fputc('\n', stderr);
	if (rc == CKFS_OK)
		rc = seal_folder(f, tmp, em.dir & ~process_umask, err);
	free(em.files);
	return rc;
}

/* Rename the written folder tmp to dst; with --force, the old dst is moved
 * to `old` first (locked as this export's while it is there) and removed
 * once the new one is in place. *placed tells tmp is gone. */
static enum ckfs_code put_in_place(const char *tmp, const char *dst, const char *old,
				   bool force, bool *placed, struct ckfs_error *err)
{
	char parent[PATH_MAX];
	struct stat st;
	int replaced = 0, old_lock = -1;
	enum ckfs_code rc = CKFS_OK;

	parent_of(dst, parent, sizeof(parent));
	if (force && lstat(dst, &st) == 0) {
		old_lock = S_ISDIR(st.st_mode) ? ckfs_export_dest_lock(dst) : -1;
		if (rename(dst, old) != 0) {
			rc = ckfs_fail_errno(err, "'%s': cannot move aside", dst);
			goto out;
		}
		replaced = 1;
	}
	if (rename(tmp, dst) != 0) {
		rc = ckfs_fail_errno(err, "'%s': cannot rename into place", dst);
		if (replaced)
			rename(old, dst);
		goto out;
	}
	*placed = true;
	sync_dir(parent);
	/* The old folder may hold files ckfs did not write. */
	if (replaced && ckfs_export_dest_remove(old) != 0)
		ckfs_cli_say("warning: could not remove '%s'", old);
out:
	if (old_lock >= 0)
		close(old_lock);
	return rc;
}

/* What --since saved, against a full export. */
static void say_since(const struct export_since_totals *t)
{
	char w[32], full[32], l[32], c[32], cp[32];

	ckfs_format_bytes((double)t->written, w, sizeof(w));
	ckfs_format_bytes((double)t->full, full, sizeof(full));
	ckfs_format_bytes((double)t->linked, l, sizeof(l));
	ckfs_format_bytes((double)t->cloned, c, sizeof(c));
	ckfs_format_bytes((double)t->copied, cp, sizeof(cp));
	ckfs_cli_say("since PREV: wrote %s of a full export's %s (%.1f%%), %zu of %zu tensors "
		     "unchanged; from PREV: %zu files hard-linked (%s), %s reflinked (%zu whole "
		     "files), %s copied", w, full,
		     t->full ? 100.0 * (double)t->written / (double)t->full : 0.0,
		     t->tensors_unchanged, t->tensors, t->files_linked, l, c, t->files_cloned, cp);
}

/* Build DIR.ckfs-tmp-PID beside dst from f, then put it in place. */
static enum ckfs_code export_folder(const struct export_args *a, const struct ckfs_folder *f,
				    const char *dst, struct export_since *prev,
				    struct ckfs_error *err)
{
	/* Room for DIR and the suffix: dst is shorter than PATH_MAX. */
	char tmp[PATH_MAX + 32], old[PATH_MAX + 32];
	struct progress prog = { 0 };
	bool placed = false;
	enum ckfs_code rc;

	snprintf(tmp, sizeof(tmp), "%s.ckfs-tmp-%ld", dst, (long)getpid());
	snprintf(old, sizeof(old), "%s.ckfs-old-%ld", dst, (long)getpid());
	if (mkdir(tmp, 0700) != 0)
		return ckfs_fail_errno(err, "'%s': cannot create", tmp);
	/* Held until the end: a later export tells a live export's folder
	 * from one a killed export left (export_dest.c). */
	int tmp_lock = ckfs_export_dest_lock(tmp);
	rc = tmp_lock < 0 ? ckfs_fail_errno(err, "'%s': cannot lock", tmp)
			  : write_folder(a, f, tmp, prev, &prog, err);
	if (rc == CKFS_OK)
		rc = put_in_place(tmp, dst, old, a->force, &placed, err);
	if (!placed)
		remove_tree(tmp, f);
	if (tmp_lock >= 0)
		close(tmp_lock);
	if (rc == CKFS_OK && !a->quiet) {
		char size[32];
		ckfs_format_bytes((double)prog.total, size, sizeof(size));
		size_t files = 0;
		for (size_t i = 0; i < f->n_nodes; i++)
			files += f->nodes[i].kind != CKFS_NODE_DIR;
		ckfs_cli_say("wrote %zu files (%s) to '%s' in %.2f s", files, size, dst,
			     since(&prog.start));
		if (prev)
			say_since(export_since_totals(prev));
	}
	return rc;
}

/* ---- --part I/N (export_part.h) ---- */

/* This part's weight files into stage, each written in its own folder
 * `own` and renamed in once synced: a file in stage is complete, so a
 * part run again after a crash writes only what is missing. */
static enum ckfs_code write_share(const struct export_args *a, const struct ckfs_folder *f,
				  const char *stage, const unsigned *owner,
				  const struct export_modes *em, struct progress *prog,
				  struct ckfs_error *err)
{
	char own[PATH_MAX + 64], from[2 * PATH_MAX], to[2 * PATH_MAX];
	enum ckfs_code rc = CKFS_OK;
	struct stat st;

	snprintf(own, sizeof(own), "%s/.ckfs-part-%u.tmp", stage, a->part.index);
	ckfs_export_dest_remove(own); /* what a killed run of this part left */
	if (mkdir(own, 0700) != 0)
		return ckfs_fail_errno(err, "'%s': cannot create", own);
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++) {
		const struct ckfs_node *n = &f->nodes[i];
		if (!export_part_file(f, i) || owner[i] != a->part.index)
			continue;
		snprintf(to, sizeof(to), "%s/%s", stage, n->name);
		if (lstat(to, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == n->size) {
			prog->base += n->size;
			continue;
		}
		snprintf(from, sizeof(from), "%s/%s", own, n->name);
		rc = write_node(f, n, own, em, a->threads, NULL, prog, err);
		if (rc == CKFS_OK && rename(from, to) != 0)
			rc = ckfs_fail_errno(err, "'%s': cannot rename into place", to);
	}
	if (prog->enabled)
		fputc('\n', stderr);
	if (rc == CKFS_OK && sync_dir(stage) != 0)
		rc = ckfs_fail_errno(err, "'%s': fsync failed", stage);
	ckfs_export_dest_remove(own);
	return rc;
}

/* Part 0, its share written: wait for every part's marker, check their
 * files, write the rest (folders, config.json, the index, side files). */
static enum ckfs_code write_rest(const struct export_args *a, const struct ckfs_folder *f,
				 const char *stage, const struct export_modes *em,
				 struct progress *prog, struct ckfs_error *err)
{
	char path[2 * PATH_MAX];
	struct stat st;
	bool said = false;

	for (unsigned p = 0; p < a->part.count; p++)
		while (!export_part_is_done(stage, p, a->part.count)) {
			if (interrupted)
				return ckfs_fail(err, CKFS_E_IO, "interrupted");
			if (!said && !a->quiet)
				ckfs_cli_say(
					"part 0/%u: waiting for the other parts' files in '%s'",
					a->part.count, stage);
			said = true;
			struct timespec ts = { 0, 250 * 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
	for (size_t i = 0; i < f->n_nodes; i++) {
		const struct ckfs_node *n = &f->nodes[i];
		snprintf(path, sizeof(path), "%s/%s", stage, n->name);
		if (export_part_file(f, i)) {
			if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
			    (uint64_t)st.st_size != n->size)
				return ckfs_fail(err, CKFS_E_IO,
						 "'%s': missing or cut short, though "
						 "its part is marked done",
						 path);
			continue;
		}
		/* what a killed run of part 0 wrote of the rest, written again */
		if (n->kind == CKFS_NODE_DIR ? rmdir(path) != 0 && errno == ENOTEMPTY
					     : unlink(path) != 0 && errno != ENOENT)
			ckfs_export_dest_remove(path);
		CKFS_TRY(write_node(f, n, stage, em, a->threads, NULL, prog, err));
	}
	return CKFS_OK;
}

/* The staging folder DIR.ckfs-parts, shared by the parts: made by the
 * first, this user's, a folder. */
static enum ckfs_code open_stage(const char *stage, struct ckfs_error *err)
{
	struct stat st;

	if (mkdir(stage, 0700) != 0 && errno != EEXIST)
		return ckfs_fail_errno(err, "'%s': cannot create", stage);
	if (lstat(stage, &st) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", stage);
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': not a folder of this user's: "
				 "not used as the staging folder of --part",
				 stage);
	return CKFS_OK;
}

/* Part I of N: its weight files; part 0 then the rest, and DIR in place. */
static enum ckfs_code export_parts(const struct export_args *a, const struct ckfs_folder *f,
				   const char *dst, struct ckfs_error *err)
{
	char stage[PATH_MAX + 32], lock[PATH_MAX + 64], old[PATH_MAX + 32];
	unsigned *owner = calloc(f->n_nodes + 1, sizeof(*owner));
	uint64_t *bytes = calloc(a->part.count, sizeof(*bytes));
	struct export_modes em = { 0 };
	struct progress prog = { 0 };
	mode_t process_umask = umask(0);
	bool placed = false;
	int lock_fd = -1;
	enum ckfs_code rc;

	umask(process_umask);
	snprintf(stage, sizeof(stage), "%s.ckfs-parts", dst);
	snprintf(lock, sizeof(lock), "%s/.ckfs-part-%u.lock", stage, a->part.index);
	snprintf(old, sizeof(old), "%s.ckfs-old-%ld", dst, (long)getpid());
	if (!owner || !bytes) {
		rc = ckfs_nomem(err);
		goto out;
	}
	if ((rc = open_stage(stage, err)) != CKFS_OK ||
	    (rc = export_part_plan(stage, f, a->part.count, err)) != CKFS_OK)
		goto out;
	lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
		rc = ckfs_fail_errno(err, "'%s': part %u is being written by another process",
				     stage, a->part.index);
		goto out;
	}
	export_part_assign(f, a->part.count, owner, bytes);
	size_t mine = 0, all = 0;
	for (size_t i = 0; i < f->n_nodes; i++) {
		all += export_part_file(f, i);
		mine += export_part_file(f, i) && owner[i] == a->part.index;
	}
	if (!mine && !a->quiet)
		ckfs_cli_say("note: part %u/%u has no weight file to write (the export has %zu%s)",
			     a->part.index, a->part.count, all,
			     a->c.folder.gguf ? "" : "; a smaller --max-shard-size makes more");
	prog.enabled = !a->quiet && isatty(STDERR_FILENO);
	clock_gettime(CLOCK_MONOTONIC, &prog.start);
	for (size_t i = 0; i < f->n_nodes; i++)
		if (export_part_file(f, i) ? owner[i] == a->part.index : a->part.index == 0)
			prog.total += f->nodes[i].size;
	if ((rc = carry_modes(f, stage, &em, err)) != CKFS_OK ||
	    (rc = write_share(a, f, stage, owner, &em, &prog, err)) != CKFS_OK ||
	    (rc = export_part_mark_done(stage, &a->part, err)) != CKFS_OK)
		goto out;
	if (sync_dir(stage) != 0) {
		rc = ckfs_fail_errno(err, "'%s': fsync failed", stage);
		goto out;
	}
	if (a->part.index != 0) {
		char size[32], read[32];
		ckfs_format_bytes((double)prog.total, size, sizeof(size));
		ckfs_format_bytes((double)bytes[a->part.index], read, sizeof(read));
		if (!a->quiet)
			ckfs_cli_say("part %u/%u: wrote its weight files (%s, %s of sources) into "
				     "'%s' in %.2f s; part 0 puts '%s' in place",
				     a->part.index, a->part.count, size, read, stage,
				     since(&prog.start), dst);
		goto out;
	}
	if ((rc = write_rest(a, f, stage, &em, &prog, err)) != CKFS_OK ||
	    (rc = seal_folder(f, stage, em.dir & ~process_umask, err)) != CKFS_OK)
		goto out;
	export_part_forget(stage, a->part.count);
	rc = put_in_place(stage, dst, old, a->force, &placed, err);
	if (rc == CKFS_OK && !a->quiet)
		ckfs_cli_say("wrote '%s' from %u parts (%.2f s in this one)", dst, a->part.count,
			     since(&prog.start));
out:
	if (lock_fd >= 0)
		close(lock_fd);
	free(em.files);
	free(owner);
	free(bytes);
	return rc;
}

int ckfs_cmd_export(int argc, char **argv)
{
	struct export_args a = { 0 }; /* the defaults are in the option rows */
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct export_since *prev = NULL;
	struct ckfs_error err;
	struct stat st;
	char dst[PATH_MAX];
	int first;

	ckfs_error_clear(&err);
	int rc = cli_parse(&ckfs_cmd_export_def, argc, argv, export_apply, &a, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = cli_common_settle(&ckfs_cmd_export_def, &a.c)) != 0)
		return rc;
	if (a.since && a.c.folder.gguf)
		return ckfs_cli_usage_error("export", "--since is for --format safetensors");
	if (a.since && a.part.count)
		return ckfs_cli_usage_error("export", "--since and --part do not go together");
	if ((rc = cli_attach_stores(&a.c, (const char *const *)argv + first, 1)) != 0)
		return rc;
	const char *src = argv[first];
	if (snprintf(dst, sizeof(dst), "%s", argv[first + 1]) >= (int)sizeof(dst))
		return ckfs_cli_usage_error("export", "DIR is too long");
	/* "out/" is "out": the temporary folder goes beside it, not in it. */
	for (size_t n = strlen(dst); n > 1 && dst[n - 1] == '/'; n--)
		dst[n - 1] = '\0';
	bool to_store = ckfs_s3_is_url(dst);
	/* PREV and DIR in one place: a local PREV's bytes cannot be copied
	 * in a store, nor a store's linked on disk */
	if (to_store && a.since)
		return ckfs_cli_usage_error("export", "--since is for a local DIR (not yet s3://)");
	if (a.since && ckfs_s3_is_url(a.since))
		return ckfs_cli_usage_error("export", "--since s3://PREV is for an s3:// DIR, "
						      "which it does not support yet");
	if (!a.threads) {
		/* A store's reads and writes wait on the network, not the
		 * CPUs: 16 in flight, as object-store tools keep several. */
		long n = ckfs_s3_is_url(src) || to_store ? 16 : sysconf(_SC_NPROCESSORS_ONLN);
		a.threads = n < 1 ? 1 : n > 16 ? 16 : (int)n;
	}
	int exists = !to_store && lstat(dst, &st) == 0;
	if (exists && !a.force)
		ckfs_fail(&err, CKFS_E_EXISTS, "'%s': already exists; use --force to "
			  "replace it", dst);
	else if (exists && !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode))
		ckfs_fail(&err, CKFS_E_INVALID, "'%s': not a folder; --force replaces only "
			  "a folder", dst);
	else if (ckfs_run_kind(src) == CKFS_RUN_RUN)
		/* One folder per export: say which, rather than why SRC is no
		 * checkpoint. */
		ckfs_fail(&err, CKFS_E_INVALID, "'%s': a training run (global_step_<N>/ "
			  "folders); export one role of a step, e.g. '%s/global_step_<N>/actor', "
			  "or mount the run", src, src);
	else if (ckfs_model_open(src, &a.c.model, &m, &err) == CKFS_OK) {
		for (size_t i = 0; i < m->n_warnings && !a.quiet; i++)
			ckfs_cli_say("warning: %s", m->warnings[i]);
		if (ckfs_folder_build(m, &a.c.folder, &f, &err) == CKFS_OK && to_store) {
			struct export_store_opts so = { .force = a.force,
							.quiet = a.quiet,
							.threads = a.threads,
							.part = a.part,
							.src = src,
							.interrupted = &interrupted };
			catch_signals();
			export_store(&so, m, f, dst, &err);
		} else if (f && ckfs_export_dest_check(dst, exists, m, f, &err) == CKFS_OK &&
			   (!a.since ||
			    export_since_open(a.since, src, f, &prev, &err) == CKFS_OK)) {
			ckfs_export_dest_clean(dst);
			catch_signals();
			if (a.part.count)
				export_parts(&a, f, dst, &err);
			else
				export_folder(&a, f, dst, prev, &err);
		}
	}
	export_since_close(prev);
	ckfs_folder_free(f);
	ckfs_model_free(m);
	if (err.code != CKFS_OK)
		return interrupted ? 130 : ckfs_cli_report(&err);
	return 0;
}
