/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount: the FUSE handlers, their userdata the
 * struct ckfs_run (src/fuse/run_int.h for the whole).
 *
 * Inodes. A step shown gets a serial number that is never reused; its
 * inodes are serial << 32 (the step folder), | (role + 1) << 20 (a role
 * folder), | (node + 1) (node of the role's folder). The top is 1 and
 * `latest` 2. A step whose roles change, or whose files differ from what
 * its first plan described when the plan is built again, gets a new
 * serial: the kernel's old inodes then answer ENOENT, never other bytes.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/fs.h"
#include "fuse/run.h"
#include "fuse/run_int.h"

#define RUN_TOP_TIMEOUT 1.0     /* the top folder: steps come and go */
#define RUN_STEP_TIMEOUT 86400.0 /* inside a step: fixed per serial */
#define RUN_BLKSIZE (1u << 20)

/* ---- inodes ---- */

enum ino_kind { INO_NONE, INO_TOP, INO_LINK, INO_STEP, INO_ROLE, INO_NODE };

struct ino_ref {
	enum ino_kind kind;
	uint64_t serial;
	size_t role;    /* INO_ROLE, INO_NODE */
	size_t node;    /* INO_NODE */
};

static struct ino_ref ino_decode(struct ckfs_run *run, fuse_ino_t ino)
{
	struct ino_ref r = { INO_NONE, 0, 0, 0 };
	uint64_t role = (ino >> ROLE_SHIFT) & ((1u << (SERIAL_SHIFT - ROLE_SHIFT)) - 1);
	uint64_t node = ino & ((1u << ROLE_SHIFT) - 1);

	if (ino == FUSE_ROOT_ID) {
		/* One step mounted alone: the top is that step (under its
		 * current serial: a change of its files renews it). */
		if (run->single) {
			r.kind = INO_STEP;
			pthread_mutex_lock(&run->lock);
			r.serial = run->n_steps ? run->steps[0]->serial : 0;
			pthread_mutex_unlock(&run->lock);
		} else {
			r.kind = INO_TOP;
		}
		return r;
	}
	if (ino == INO_LATEST && !run->single) {
		r.kind = INO_LINK;
		return r;
	}
	r.serial = ino >> SERIAL_SHIFT;
	if (r.serial == 0)
		return r;
	if (role == 0)
		r.kind = node == 0 ? INO_STEP : INO_NONE;
	else
		r.kind = node == 0 ? INO_ROLE : INO_NODE;
	r.role = role ? role - 1 : 0;
	r.node = node ? node - 1 : 0;
	return r;
}

static fuse_ino_t step_ino(const struct ckfs_run *run, uint64_t serial)
{
	return run->single ? FUSE_ROOT_ID : (fuse_ino_t)(serial << SERIAL_SHIFT);
}

static fuse_ino_t role_ino(uint64_t serial, size_t r)
{
	return (fuse_ino_t)(serial << SERIAL_SHIFT | (uint64_t)(r + 1) << ROLE_SHIFT);
}

static fuse_ino_t node_ino(uint64_t serial, size_t r, size_t i)
{
	return role_ino(serial, r) | (fuse_ino_t)(i + 1);
}

static void stat_base(const struct ckfs_run *run, struct stat *st, fuse_ino_t ino)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = run->fs.uid;
	st->st_gid = run->fs.gid;
	st->st_blksize = RUN_BLKSIZE;
}

static void stat_dir(const struct ckfs_run *run, struct stat *st, fuse_ino_t ino, mode_t mode,
		     nlink_t subdirs)
{
	stat_base(run, st, ino);
	st->st_mode = S_IFDIR | mode;
	st->st_nlink = 2 + subdirs;
	st->st_size = 4096;
	st->st_blocks = 8;
}

/*
 * Attributes of ino: 0, or an errno. For roles and nodes the plan is
 * built when needed; *plan_out (when not NULL) receives it with a
 * reference, for INO_ROLE and INO_NODE.
 */
static int ino_stat(struct ckfs_run *run, fuse_ino_t ino, struct stat *st,
		    struct run_plan **plan_out)
{
	struct ino_ref r = ino_decode(run, ino);
	bool broken;

	if (plan_out)
		*plan_out = NULL;
	switch (r.kind) {
	case INO_NONE:
		return ENOENT;
	case INO_TOP:
		pthread_mutex_lock(&run->lock);
		stat_dir(run, st, ino, run->dir_mode, (nlink_t)run->n_steps);
		st->st_mtim = st->st_atim = st->st_ctim = run->scan.mtime;
		pthread_mutex_unlock(&run->lock);
		return 0;
	case INO_LINK:
		pthread_mutex_lock(&run->lock);
		bool has = run->latest[0] != '\0';
		size_t len = strlen(run->latest);
		pthread_mutex_unlock(&run->lock);
		if (!has)
			return ENOENT;
		stat_base(run, st, ino);
		pthread_mutex_lock(&run->lock);
		st->st_mtim = st->st_atim = st->st_ctim = run->scan.mtime;
		pthread_mutex_unlock(&run->lock);
		st->st_mode = S_IFLNK | 0777;
		st->st_nlink = 1;
		st->st_size = (off_t)len;
		return 0;
	case INO_STEP: {
		/* The role count of the listing: a step's attributes cost no
		 * readdir of it (ls -l of a run of many steps). */
		pthread_mutex_lock(&run->lock);
		struct run_step *s = run_step_by_serial(run, r.serial);
		nlink_t k = s ? (nlink_t)(s->roles_listed ? s->n_roles : s->n_roles_seen) : 0;
		struct timespec mt = s ? s->mtime : (struct timespec){ 0, 0 };
		pthread_mutex_unlock(&run->lock);
		if (!s)
			return ENOENT;
		stat_dir(run, st, ino, run->dir_mode, k);
		st->st_mtim = st->st_atim = st->st_ctim = mt;
		return 0;
	}
	case INO_ROLE:
	case INO_NODE: {
		struct run_plan *p = run_role_plan(run, r.serial, r.role, &broken);
		if (!p) {
			if (!broken || r.kind != INO_ROLE)
				return ENOENT;
			/* A role that cannot be served: an empty folder. */
			stat_dir(run, st, ino, run->dir_mode, 0);
			return 0;
		}
		if (r.kind == INO_ROLE) {
			ckfs_fs_stat_node(p->f, NULL, p->root_mode, run->fs.uid, run->fs.gid, ino,
					  st);
		} else if (r.node >= p->f->n_nodes) {
			run_plan_put(run, p);
			return ENOENT;
		} else {
			ckfs_fs_stat_node(p->f, &p->f->nodes[r.node], p->modes[r.node], run->fs.uid,
					  run->fs.gid, ino, st);
		}
		if (plan_out)
			*plan_out = p;
		else
			run_plan_put(run, p);
		return 0;
	}
	}
	return ENOENT;
}

/* ---- handlers ---- */

static struct ckfs_run *req_run(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static void reply_entry(fuse_req_t req, struct ckfs_run *run, fuse_ino_t ino, double timeout)
{
	struct fuse_entry_param e;
	int rc;

	memset(&e, 0, sizeof(e));
	e.entry_timeout = timeout;
	if (ino) {
		rc = ino_stat(run, ino, &e.attr, NULL);
		if (rc == ENOENT) {
			/* Gone between the name and its attributes: a negative
			 * entry that times out like the top's. */
			e.entry_timeout = RUN_TOP_TIMEOUT;
			fuse_reply_entry(req, &e);
			return;
		}
		if (rc) {
			fuse_reply_err(req, rc);
			return;
		}
		e.ino = ino;
		e.generation = 1;
		e.attr_timeout = timeout;
	}
	fuse_reply_entry(req, &e);
}

static void run_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, parent);
	fuse_ino_t ino = 0;

	switch (r.kind) {
	case INO_TOP:
		pthread_mutex_lock(&run->lock);
		if (strcmp(name, "latest") == 0) {
			ino = run->latest[0] ? INO_LATEST : 0;
		} else {
			struct run_step *s = run_step_by_name(run, name);
			ino = s ? step_ino(run, s->serial) : 0;
		}
		pthread_mutex_unlock(&run->lock);
		reply_entry(req, run, ino, RUN_TOP_TIMEOUT);
		return;
	case INO_STEP: {
		pthread_mutex_lock(&run->lock);
		struct run_step *s = run_step_by_serial(run, r.serial);
		pthread_mutex_unlock(&run->lock);
		if (!s) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		if (run_step_roles(run, s) != 0) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		pthread_mutex_lock(&run->lock);
		s = run_step_by_serial(run, r.serial);
		for (size_t i = 0; s && i < s->n_roles; i++)
			if (strcmp(s->roles[i].name, name) == 0)
				ino = role_ino(r.serial, i);
		pthread_mutex_unlock(&run->lock);
		reply_entry(req, run, ino, run->single ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT);
		return;
	}
	case INO_ROLE:
	case INO_NODE: {
		bool broken;
		struct run_plan *p = run_role_plan(run, r.serial, r.role, &broken);
		if (!p) {
			if (broken && r.kind == INO_ROLE)
				reply_entry(req, run, 0, RUN_TOP_TIMEOUT);
			else
				fuse_reply_err(req, ENOENT);
			return;
		}
		const struct ckfs_node *dir = NULL;
		if (r.kind == INO_NODE) {
			dir = r.node < p->f->n_nodes ? &p->f->nodes[r.node] : NULL;
			if (!dir || dir->kind != CKFS_NODE_DIR) {
				run_plan_put(run, p);
				fuse_reply_err(req, dir ? ENOTDIR : ENOENT);
				return;
			}
		}
		const struct ckfs_node *n = ckfs_folder_lookup(p->f, dir, name);
		ino = n ? node_ino(r.serial, r.role, (size_t)(n - p->f->nodes)) : 0;
		run_plan_put(run, p);
		reply_entry(req, run, ino, RUN_STEP_TIMEOUT);
		return;
	}
	case INO_LINK:
		fuse_reply_err(req, ENOTDIR);
		return;
	case INO_NONE:
		break;
	}
	fuse_reply_err(req, ENOENT);
}

static void run_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct stat st;
	struct ino_ref r = ino_decode(run, ino);
	int rc;

	(void)fi;
	rc = ino_stat(run, ino, &st, NULL);
	if (rc)
		fuse_reply_err(req, rc);
	else
		fuse_reply_attr(req, &st, r.kind == INO_TOP || r.kind == INO_LINK ||
					  (run->single && r.kind == INO_STEP)
					  ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT);
}

static void run_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct ckfs_run *run = req_run(req);
	char target[40];

	pthread_mutex_lock(&run->lock);
	snprintf(target, sizeof(target), "%s", run->latest);
	pthread_mutex_unlock(&run->lock);
	if (ino != INO_LATEST || run->single || !target[0])
		fuse_reply_err(req, ino == INO_LATEST ? ENOENT : EINVAL);
	else
		fuse_reply_readlink(req, target);
}

/* Per open file: the read-ahead state and the plan it reads. */
struct run_handle {
	struct ckfs_handle ra;
	struct run_plan *plan;
	uint64_t file_id;
};

static void run_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, ino);
	struct run_plan *p = NULL;
	struct stat st;
	int rc;

	if (r.kind != INO_NODE) {
		fuse_reply_err(req, r.kind == INO_NONE ? ENOENT
				    : r.kind == INO_LINK ? ELOOP : EISDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND))) {
		fuse_reply_err(req, EROFS);
		return;
	}
	rc = ino_stat(run, ino, &st, &p);
	if (rc || !p) {
		run_plan_put(run, p);
		fuse_reply_err(req, rc ? rc : ENOENT);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		run_plan_put(run, p);
		fuse_reply_err(req, EISDIR);
		return;
	}
	struct run_handle *h = calloc(1, sizeof(*h));
	if (!h) {
		run_plan_put(run, p);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	h->plan = p; /* the reference travels with the handle */
	h->ra.node = r.node;
	h->file_id = p->id << ROLE_SHIFT | r.node;
	pthread_mutex_init(&h->ra.lock, NULL);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->keep_cache = 1; /* a serial's files never change */
	fi->noflush = 1;
	atomic_fetch_add(&run->fs.stats.opens, 1);
	atomic_fetch_add(&p->stats->opens, 1);
	if (fuse_reply_open(req, fi) != 0) {
		pthread_mutex_destroy(&h->ra.lock);
		run_plan_put(run, h->plan);
		free(h);
	}
}

static void run_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct run_handle *h = (struct run_handle *)(uintptr_t)fi->fh;

	(void)ino;
	if (h) {
		pthread_mutex_destroy(&h->ra.lock);
		run_plan_put(run, h->plan);
		free(h);
	}
	fuse_reply_err(req, 0);
}

static void log_read_error(struct run_plan *p, const struct ckfs_node *n, uint64_t off,
			   size_t len, const struct ckfs_error *err)
{
	struct timespec now;
	int_fast64_t last, sec;

	clock_gettime(CLOCK_MONOTONIC, &now);
	sec = (int_fast64_t)now.tv_sec + 1;
	last = atomic_load(&p->err_logged_at);
	if ((last && sec - last < 10) ||
	    !atomic_compare_exchange_strong(&p->err_logged_at, &last, sec))
		return;
	ckfs_log(CKFS_LOG_ERR, "'%s/%s': read of %zu bytes at %" PRIu64 " failed (%s): %s",
		 p->label, n->name, len, off, strerror(ckfs_err_to_errno(err)),
		 err->msg[0] ? err->msg : ckfs_strerror(err->code));
}

static void run_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct run_handle *h = (struct run_handle *)(uintptr_t)fi->fh;
	struct run_plan *p = h->plan;
	const struct ckfs_node *n = &p->f->nodes[h->ra.node];
	struct ckfs_error err;
	size_t got = 0;

	(void)ino;
	atomic_fetch_add(&run->fs.stats.reads, 1);
	atomic_fetch_add(&p->stats->reads, 1);
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if ((uint64_t)off >= n->size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	size_t len = n->size - (uint64_t)off < size ? (size_t)(n->size - (uint64_t)off) : size;
	ckfs_error_clear(&err);
	if (n->kind == CKFS_NODE_WEIGHTS) {
		if (ckfs_fs_read_cached(req, &run->fs, &h->ra, h->file_id,
					p->replied[h->ra.node], n->size,
					(uint64_t)off, len, &err) == CKFS_OK) {
			atomic_fetch_add(&p->stats->bytes_read, len);
			return;
		}
	} else if (n->kind == CKFS_NODE_RENDERED) {
		atomic_fetch_add(&run->fs.stats.bytes_read, len);
		atomic_fetch_add(&p->stats->bytes_read, len);
		fuse_reply_buf(req, n->data + off, len);
		return;
	} else {
		struct ckfs_read_scratch *scratch = ckfs_fs_scratch(&run->fs);
		char *buf = malloc(len);
		if (!buf || !scratch)
			ckfs_nomem(&err);
		else if (ckfs_folder_read(p->f, n, (uint64_t)off, len, buf, &got, scratch,
					  &err) == CKFS_OK) {
			atomic_fetch_add(&run->fs.stats.bytes_read, got);
			atomic_fetch_add(&p->stats->bytes_read, got);
			fuse_reply_buf(req, buf, got);
			free(buf);
			return;
		}
		free(buf);
	}
	atomic_fetch_add(&run->fs.stats.errors, 1);
	atomic_fetch_add(&p->stats->errors, 1);
	log_read_error(p, n, (uint64_t)off, len, &err);
	fuse_reply_err(req, ckfs_err_to_errno(&err));
}

static void run_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, ino);

	if (r.kind == INO_NONE || r.kind == INO_LINK) {
		fuse_reply_err(req, r.kind == INO_NONE ? ENOENT : ENOTDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	/* Inside a step the listing is fixed for its serial. */
	fi->cache_readdir = r.kind != INO_TOP && !(run->single && r.kind == INO_STEP);
	fi->keep_cache = fi->cache_readdir;
	fuse_reply_open(req, fi);
}

/* One listing: names and inodes, made under the lock, replied after. */
struct listing {
	size_t n;
	char **names;
	fuse_ino_t *inos;
};

static void listing_free(struct listing *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->inos);
}

static int listing_add(struct listing *l, size_t cap, const char *name, fuse_ino_t ino)
{
	if (l->n >= cap)
		return 0;
	if (!(l->names[l->n] = strdup(name)))
		return -1;
	l->inos[l->n++] = ino;
	return 0;
}

/* The entries of folder ino ("." and ".." first); an errno on failure. */
static int make_listing(struct ckfs_run *run, fuse_ino_t ino, struct listing *l)
{
	struct ino_ref r = ino_decode(run, ino);
	struct run_plan *p = NULL;
	size_t cap = 0;
	int rc = 0;
	bool broken;

	memset(l, 0, sizeof(*l));
	if (r.kind == INO_STEP) {
		pthread_mutex_lock(&run->lock);
		struct run_step *s = run_step_by_serial(run, r.serial);
		pthread_mutex_unlock(&run->lock);
		if (!s)
			return ENOENT;
		if (run_step_roles(run, s) != 0)
			return ENOMEM;
	} else if (r.kind == INO_ROLE || r.kind == INO_NODE) {
		p = run_role_plan(run, r.serial, r.role, &broken);
		if (!p && !(broken && r.kind == INO_ROLE))
			return ENOENT;
		if (p && r.kind == INO_NODE &&
		    (r.node >= p->f->n_nodes || p->f->nodes[r.node].kind != CKFS_NODE_DIR)) {
			run_plan_put(run, p);
			return ENOTDIR;
		}
	} else if (r.kind != INO_TOP) {
		return ENOENT;
	}
	pthread_mutex_lock(&run->lock);
	struct run_step *s = r.kind == INO_STEP ? run_step_by_serial(run, r.serial) : NULL;
	if (r.kind == INO_TOP)
		cap = run->n_steps + 3;
	else if (r.kind == INO_STEP)
		cap = (s ? s->n_roles : 0) + 2;
	else if (!p)
		cap = 2;
	else if (r.kind == INO_ROLE)
		cap = p->f->n_top + 2;
	else
		cap = p->f->nodes[r.node].n_children + 2;
	l->names = calloc(cap, sizeof(*l->names));
	l->inos = calloc(cap, sizeof(*l->inos));
	if (!l->names || !l->inos) {
		rc = ENOMEM;
		goto out;
	}
	fuse_ino_t parent = r.kind == INO_TOP ? FUSE_ROOT_ID
			    : r.kind == INO_STEP ? FUSE_ROOT_ID
			    : r.kind == INO_ROLE ? step_ino(run, r.serial)
			    : p->f->nodes[r.node].parent
				  ? node_ino(r.serial, r.role, p->f->nodes[r.node].parent - 1)
				  : role_ino(r.serial, r.role);
	if (listing_add(l, cap, ".", ino) || listing_add(l, cap, "..", parent)) {
		rc = ENOMEM;
		goto out;
	}
	if (r.kind == INO_TOP) {
		for (size_t i = 0; i < run->n_steps && !rc; i++)
			rc = listing_add(l, cap, run->steps[i]->name,
					 step_ino(run, run->steps[i]->serial)) ? ENOMEM : 0;
		if (!rc && run->latest[0])
			rc = listing_add(l, cap, "latest", INO_LATEST) ? ENOMEM : 0;
	} else if (r.kind == INO_STEP) {
		for (size_t i = 0; s && i < s->n_roles && !rc; i++)
			rc = listing_add(l, cap, s->roles[i].name, role_ino(r.serial, i))
				     ? ENOMEM : 0;
	} else if (p) {
		const size_t *list = r.kind == INO_ROLE ? p->f->top : p->f->nodes[r.node].children;
		size_t n = r.kind == INO_ROLE ? p->f->n_top : p->f->nodes[r.node].n_children;
		for (size_t i = 0; i < n && !rc; i++)
			rc = listing_add(l, cap, p->f->nodes[list[i]].base,
					 node_ino(r.serial, r.role, list[i])) ? ENOMEM : 0;
	}
out:
	pthread_mutex_unlock(&run->lock);
	run_plan_put(run, p);
	if (rc)
		listing_free(l);
	return rc;
}

static void run_reply_dir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct ckfs_run *run = req_run(req);
	struct listing l;
	size_t pos = 0;
	char *buf;
	int rc = make_listing(run, ino, &l);

	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	if (off < 0 || (uint64_t)off >= l.n) {
		listing_free(&l);
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	buf = malloc(size ? size : 1);
	if (!buf) {
		listing_free(&l);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (size_t k = (size_t)off; k < l.n; k++) {
		size_t want;
		struct stat st;
		memset(&st, 0, sizeof(st));
		if (plus && k >= 2) {
			struct fuse_entry_param e;
			struct ino_ref r = ino_decode(run, l.inos[k]);
			memset(&e, 0, sizeof(e));
			/* Entries carry attributes only where no plan must be
			 * built for them (a role's needs its plan): listing the
			 * top or a step stays cheap; the kernel looks the rest
			 * up when used. */
			if (r.kind == INO_ROLE) {
				e.attr.st_ino = l.inos[k];
				e.attr.st_mode = S_IFDIR;
			} else if (ino_stat(run, l.inos[k], &e.attr, NULL) == 0) {
				double t = r.kind == INO_STEP || r.kind == INO_LINK
						   ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT;
				e.ino = l.inos[k];
				e.generation = 1;
				e.attr_timeout = t;
				e.entry_timeout = t;
			}
			want = fuse_add_direntry_plus(req, buf + pos, size - pos, l.names[k], &e,
						      (off_t)k + 1);
		} else {
			st.st_ino = l.inos[k];
			struct ino_ref r = ino_decode(run, l.inos[k]);
			st.st_mode = r.kind == INO_LINK ? S_IFLNK
				     : r.kind == INO_NODE ? 0 : S_IFDIR;
			if (plus) {
				/* "." and "..": no entry, only their numbers. */
				struct fuse_entry_param e;
				memset(&e, 0, sizeof(e));
				e.attr = st;
				want = fuse_add_direntry_plus(req, buf + pos, size - pos, l.names[k],
							      &e, (off_t)k + 1);
			} else {
				want = fuse_add_direntry(req, buf + pos, size - pos, l.names[k], &st,
							 (off_t)k + 1);
			}
		}
		if (want > size - pos)
			break;
		pos += want;
	}
	fuse_reply_buf(req, buf, pos);
	free(buf);
	listing_free(&l);
}

static void run_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	(void)fi;
	run_reply_dir(req, ino, size, off, 0);
}

static void run_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	(void)fi;
	run_reply_dir(req, ino, size, off, 1);
}

static void run_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;

	(void)ino;
	memset(&st, 0, sizeof(st));
	st.f_bsize = RUN_BLKSIZE;
	st.f_frsize = 4096;
	st.f_namemax = NAME_MAX;
	st.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &st);
}

static void run_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct ckfs_run *run = req_run(req);

	if (ino_decode(run, ino).kind == INO_NONE)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

/* ---- stats: the front end's and the cache's counters, and per step ---- */

static void json_str(struct ckfs_strbuf *b, const char *s)
{
	ckfs_strbuf_json(b, s);
}

/* The per-step object of step s (under run->lock). */
static void step_json(struct ckfs_strbuf *b, const struct run_step *s, bool first)
{
	struct run_stats *st = s->stats;
	uint64_t v[CKFS_STEP_ROWS] = { 0 };

	for (size_t r = 0; r < s->n_roles; r++)
		v[CKFS_STEP_PLANS_CACHED] += s->roles[r].plan != NULL;
	v[CKFS_STEP_PLANS_BUILT] = atomic_load(&st->plans_built);
	v[CKFS_STEP_PLAN_ERRORS] = atomic_load(&st->plan_errors);
	v[CKFS_STEP_OPENS] = atomic_load(&st->opens);
	v[CKFS_STEP_READS] = atomic_load(&st->reads);
	v[CKFS_STEP_BYTES_READ] = atomic_load(&st->bytes_read);
	v[CKFS_STEP_ERRORS] = atomic_load(&st->errors);
	ckfs_strbuf_fmt(b, "%s{\"step\":%" PRIu64 ",\"name\":", first ? "" : ",", s->step);
	json_str(b, s->name);
	ckfs_stats_put(b, ckfs_step_stat_rows, CKFS_STEP_ROWS, v);
	ckfs_strbuf_str(b, ",\"broken\":[");
	first = true;
	for (size_t r = 0; r < s->n_roles; r++) {
		if (!s->roles[r].error)
			continue;
		ckfs_strbuf_str(b, first ? "{\"role\":" : ",{\"role\":");
		json_str(b, s->roles[r].name);
		ckfs_strbuf_str(b, ",\"error\":");
		json_str(b, s->roles[r].error);
		ckfs_strbuf_str(b, "}");
		first = false;
	}
	ckfs_strbuf_str(b, "]}");
}

static void stats_json(struct ckfs_run *run, struct ckfs_strbuf *b)
{
	uint64_t v[CKFS_STAT_ROWS] = { 0 };

	ckfs_strbuf_str(b, "{\"source\":");
	json_str(b, run->opt->src);
	ckfs_strbuf_fmt(b, ",\"run\":true,\"pid\":%ld", (long)getpid());
	ckfs_stats_put_uptime(&run->fs, b);
	pthread_mutex_lock(&run->lock);
	for (struct run_plan *p = run->all; p; p = p->all_next) {
		v[CKFS_STAT_PLANS_OPEN]++;
		v[CKFS_STAT_FILES] += p->f->n_nodes;
	}
	ckfs_strbuf_str(b, ",\"latest\":");
	if (run->latest[0])
		json_str(b, run->latest);
	else
		ckfs_strbuf_str(b, "null");
	v[CKFS_STAT_STEPS_SHOWN] = run->n_steps;
	v[CKFS_STAT_PLANS_CACHED] = run->n_lru;
	v[CKFS_STAT_MAX_PLANS] = (uint64_t)run->opt->max_plans;
	ckfs_stats_put(b, &ckfs_stat_rows[CKFS_STAT_STEPS_SHOWN], 4, &v[CKFS_STAT_STEPS_SHOWN]);
	ckfs_stats_put(b, &ckfs_stat_rows[CKFS_STAT_FILES], 1, &v[CKFS_STAT_FILES]);
	ckfs_stats_counters(&run->fs, v);
	ckfs_stats_put(b, ckfs_stat_rows, CKFS_STAT_COUNTERS, v);
	ckfs_strbuf_str(b, ",\"steps\":[");
	for (size_t i = 0; i < run->n_steps; i++)
		step_json(b, run->steps[i], i == 0);
	pthread_mutex_unlock(&run->lock);
	ckfs_strbuf_str(b, "]}\n");
}

static void run_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct ckfs_run *run = req_run(req);
	struct ckfs_strbuf b;
	const char *value;
	size_t len;

	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ino_decode(run, ino).kind == INO_NONE ? ENOENT : ENODATA);
		return;
	}
	memset(&b, 0, sizeof(b));
	if (strcmp(name, CKFS_STATS_XATTR) == 0) {
		stats_json(run, &b);
		if (b.failed || !b.p) {
			free(b.p);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		value = b.p;
		len = b.len;
	} else if (strcmp(name, CKFS_SOURCE_XATTR) == 0) {
		value = run->opt->src;
		len = strlen(value);
	} else {
		fuse_reply_err(req, ENODATA);
		return;
	}
	/* The size query answers an upper bound: counters move between the
	 * query and the read. */
	ckfs_fs_reply_xattr(req, value, len, size, len + 4096);
	free(b.p);
}

static void run_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	(void)ino;
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

static struct fuse_lowlevel_ops run_ops;

/* ckfs_ll_ops with the handlers that know the run; the rest (EROFS for
 * every write, init, forget, releasedir) are the same. */
static void run_ops_init(void)
{
	run_ops = ckfs_ll_ops;
	run_ops.lookup = run_lookup;
	run_ops.getattr = run_getattr;
	run_ops.readlink = run_readlink;
	run_ops.open = run_open;
	run_ops.read = run_read;
	run_ops.release = run_release;
	run_ops.opendir = run_opendir;
	run_ops.readdir = run_readdir;
	run_ops.readdirplus = run_readdirplus;
	run_ops.statfs = run_statfs;
	run_ops.getxattr = run_getxattr;
	run_ops.listxattr = run_listxattr;
	run_ops.access = run_access;
}

const struct fuse_lowlevel_ops *ckfs_run_ops(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, run_ops_init);
	return &run_ops;
}
