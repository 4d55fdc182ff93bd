/* SPDX-License-Identifier: MIT */
/*
 * A served folder: opening one checkpoint for a mount, and the read-error
 * log of its files (src/fuse/served.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckfs/perm.h"
#include "ckfs/run.h"
#include "fuse/fs.h"
#include "fuse/served.h"

/* Seconds between two error lines about the same file. */
#define CKFS_ERR_LOG_INTERVAL 10

/* The modes shown: umask= as given, or carried from the sources for the
 * owner shown. */
static enum ckfs_code open_modes(struct ckfs_served *s, const struct ckfs_mount_options *opt,
				 uid_t uid, gid_t gid, struct ckfs_error *err)
{
	const struct ckfs_folder *f = s->f;
	struct ckfs_owner owner;
	enum ckfs_code rc;

	s->modes = calloc(f->n_nodes ? f->n_nodes : 1, sizeof(*s->modes));
	if (!s->modes)
		return ckfs_nomem(err);
	if (opt->has_umask) {
		for (size_t i = 0; i < f->n_nodes; i++)
			s->modes[i] = 0444 & ~opt->umask;
		s->root_mode = 0555 & ~opt->umask;
		return CKFS_OK;
	}
	CKFS_TRY(ckfs_owner_init(&owner, uid, gid, err));
	rc = ckfs_folder_modes(f, &owner, s->modes, &s->root_mode, err);
	ckfs_owner_release(&owner);
	return rc;
}

/* A uint32 per slice of each weight file: slice sizes are far below
 * 4 GiB (cli/mount.c bounds them). */
static enum ckfs_code open_replied(struct ckfs_served *s, uint64_t slice_size,
				   struct ckfs_error *err)
{
	const struct ckfs_folder *f = s->f;

	s->replied = calloc(f->n_nodes ? f->n_nodes : 1, sizeof(*s->replied));
	if (!s->replied)
		return ckfs_nomem(err);
	for (size_t i = 0; i < f->n_nodes; i++) {
		if (f->nodes[i].kind != CKFS_NODE_WEIGHTS)
			continue;
		uint64_t n = (f->nodes[i].size + slice_size - 1) / slice_size;
		s->replied[i] = calloc(n ? n : 1, sizeof(**s->replied));
		if (!s->replied[i])
			return ckfs_nomem(err);
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_served_open(struct ckfs_served *s, const struct ckfs_mount_options *opt,
				const char *role_dir, const char *label, uid_t uid, gid_t gid,
				struct ckfs_error *err)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->label, sizeof(s->label), "%s", label);
	CKFS_TRY(role_dir ? ckfs_run_open_role(opt->src, role_dir, &opt->model, &s->m, err)
			  : ckfs_model_open(opt->src, &opt->model, &s->m, err));
	for (size_t i = 0; i < s->m->n_warnings; i++)
		ckfs_log(CKFS_LOG_WARNING, "%s%swarning: %s", s->label, s->label[0] ? ": " : "",
			 s->m->warnings[i]);
	CKFS_TRY(ckfs_folder_build(s->m, &opt->folder, &s->f, err));
	s->err_logged_at = calloc(s->f->n_nodes ? s->f->n_nodes : 1, sizeof(*s->err_logged_at));
	if (!s->err_logged_at)
		return ckfs_nomem(err);
	CKFS_TRY(open_replied(s, opt->slice_size, err));
	return open_modes(s, opt, uid, gid, err);
}

void ckfs_served_close(struct ckfs_served *s)
{
	if (s->replied && s->f)
		for (size_t i = 0; i < s->f->n_nodes; i++)
			free((void *)s->replied[i]);
	free(s->replied);
	free(s->err_logged_at);
	free(s->modes);
	ckfs_folder_free(s->f);
	ckfs_model_free(s->m);
	memset(s, 0, sizeof(*s));
}

const char *ckfs_served_sep(const struct ckfs_served *s)
{
	return s->label[0] ? "/" : "";
}

void ckfs_served_log_read_error(struct ckfs_served *s, size_t node, uint64_t off, size_t len,
				const struct ckfs_error *err)
{
	struct timespec now;
	int_fast64_t last, sec;

	clock_gettime(CLOCK_MONOTONIC, &now);
	sec = (int_fast64_t)now.tv_sec + 1; /* 0 means "never logged" */
	last = atomic_load(&s->err_logged_at[node]);
	if (last && sec - last < CKFS_ERR_LOG_INTERVAL)
		return;
	if (!atomic_compare_exchange_strong(&s->err_logged_at[node], &last, sec))
		return;
	ckfs_log(CKFS_LOG_ERR, "'%s%s%s': read of %zu bytes at %" PRIu64 " failed (%s): %s",
		 s->label, ckfs_served_sep(s), s->f->nodes[node].name, len, off,
		 strerror(ckfs_err_to_errno(err)), err->msg[0] ? err->msg : ckfs_strerror(err->code));
}
