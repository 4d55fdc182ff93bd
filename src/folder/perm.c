/* SPDX-License-Identifier: MIT */
/*
 * Carried permissions (include/ckfs/perm.h): which classes of a served
 * entry may read it, from the files it is made from and the folders on
 * their paths. Sources' modes and owners were recorded when they were
 * opened (struct ckfs_source, struct ckfs_file_access); folders are
 * stat-ed here, once each (a memo keyed by path).
 */
#include "ckfs/perm.h"
#include "ckfs/s3.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- classes ---- */

enum ckfs_code ckfs_owner_init(struct ckfs_owner *o, uid_t uid, gid_t gid,
			       struct ckfs_error *err)
{
	memset(o, 0, sizeof(*o));
	o->uid = uid;
	o->gid = gid;
	if (uid != geteuid())
		return CKFS_OK; /* someone else's groups: not known */
	int n = getgroups(0, NULL);
	if (n < 0)
		return ckfs_fail_errno(err, "cannot list this process's groups");
	o->groups = malloc(((size_t)n + 1) * sizeof(*o->groups));
	if (!o->groups)
		return ckfs_nomem(err);
	n = getgroups(n, o->groups);
	if (n < 0) {
		ckfs_owner_release(o);
		return ckfs_fail_errno(err, "cannot list this process's groups");
	}
	o->groups[n] = getegid();
	o->n_groups = (size_t)n + 1;
	o->groups_known = true;
	return CKFS_OK;
}

void ckfs_owner_release(struct ckfs_owner *o)
{
	free(o->groups);
	o->groups = NULL;
	o->n_groups = 0;
	o->groups_known = false;
}

static bool owner_in_group(const struct ckfs_owner *o, gid_t gid)
{
	for (size_t i = 0; i < o->n_groups; i++)
		if (o->groups[i] == gid)
			return true;
	return false;
}

/* The classes of an object (owner, group, other) that have perm. */
static unsigned granted(mode_t mode, unsigned perm)
{
	return ((mode >> 6) & perm ? CKFS_CLASS_OWNER : 0) |
	       ((mode >> 3) & perm ? CKFS_CLASS_GROUP : 0) |
	       (mode & perm ? CKFS_CLASS_OTHER : 0);
}

unsigned ckfs_perm_classes(const struct ckfs_owner *o, const struct ckfs_file_access *a,
			   unsigned perm)
{
	const uid_t uid = a->uid;
	const gid_t gid = a->gid;
	unsigned allow = granted(a->mode, perm), out = 0, need;
	/* The object's owner may be anyone but o->uid; the users in o->gid
	 * are all in the object's group when that is o->gid too. */
	unsigned maybe_owner = uid != o->uid ? CKFS_CLASS_OWNER : 0;

	/* An ACL's entries for named users and groups come before "other":
	 * only its owner is judged by the mode bits alone. */
	if (a->acl)
		return uid == o->uid && (allow & CKFS_CLASS_OWNER) ? CKFS_CLASS_OWNER : 0;

	/* The served owner: the one class the kernel puts o->uid in, or
	 * both group and other when its groups are not known. */
	if (uid == o->uid)
		need = CKFS_CLASS_OWNER;
	else if (!o->groups_known)
		need = CKFS_CLASS_GROUP | CKFS_CLASS_OTHER;
	else
		need = owner_in_group(o, gid) ? CKFS_CLASS_GROUP : CKFS_CLASS_OTHER;
	if ((allow & need) == need)
		out |= CKFS_CLASS_OWNER;
	/* The served group: users in o->gid. */
	need = maybe_owner | CKFS_CLASS_GROUP | (gid != o->gid ? CKFS_CLASS_OTHER : 0);
	if ((allow & need) == need)
		out |= CKFS_CLASS_GROUP;
	/* Everyone else: not in o->gid, so in the object's group only when
	 * that is another group. */
	need = maybe_owner | (gid != o->gid ? CKFS_CLASS_GROUP : 0) | CKFS_CLASS_OTHER;
	if ((allow & need) == need)
		out |= CKFS_CLASS_OTHER;
	return out;
}

mode_t ckfs_perm_bits(unsigned classes, unsigned perm)
{
	return (mode_t)(((classes & CKFS_CLASS_OWNER) ? perm << 6 : 0) |
			((classes & CKFS_CLASS_GROUP) ? perm << 3 : 0) |
			((classes & CKFS_CLASS_OTHER) ? perm : 0));
}

/* ---- folders on the way ---- */

struct dir_memo {
	char *path;
	unsigned classes; /* may search it and every folder above it */
};

struct walk {
	const struct ckfs_owner *o;
	struct dir_memo *dirs;
	size_t n_dirs, cap;
	struct ckfs_error *err;
};

static const struct dir_memo *memo_find(const struct walk *w, const char *path)
{
	/* Newest first: sources come folder by folder. */
	for (size_t i = w->n_dirs; i-- > 0;)
		if (strcmp(w->dirs[i].path, path) == 0)
			return &w->dirs[i];
	return NULL;
}

static enum ckfs_code memo_add(struct walk *w, const char *path, unsigned classes)
{
	if (w->n_dirs == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		struct dir_memo *d = realloc(w->dirs, cap * sizeof(*d));
		if (!d)
			return ckfs_nomem(w->err);
		w->dirs = d;
		w->cap = cap;
	}
	w->dirs[w->n_dirs].path = strdup(path);
	if (!w->dirs[w->n_dirs].path)
		return ckfs_nomem(w->err);
	w->dirs[w->n_dirs++].classes = classes;
	return CKFS_OK;
}

/* The folder holding an absolute path, written to out: "/" for "/x" and
 * for "/". */
static void parent_dir(const char *path, char *out)
{
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	while (n > 1 && path[n - 1] != '/')
		n--;
	while (n > 1 && path[n - 1] == '/')
		n--;
	memcpy(out, path, n);
	out[n] = '\0';
}

static enum ckfs_code search_chain(struct walk *w, const char *dir, bool canonical,
				   unsigned *out);

/* Who may use the folder (or file) at path, stat-ed now. */
static enum ckfs_code stat_access(struct walk *w, const char *path,
				  struct ckfs_file_access *a)
{
	struct stat st;

	if (ckfs_stat(path, &st) != 0)
		return ckfs_fail_errno(w->err, "'%s': cannot stat", path);
	a->path = path;
	a->mode = st.st_mode;
	a->uid = st.st_uid;
	a->gid = st.st_gid;
	a->acl = !ckfs_s3_is_url(path) && ckfs_path_has_acl(path);
	return CKFS_OK;
}

/* dir resolved (symlinks, "..") when that names another path. */
static enum ckfs_code resolved_chain(struct walk *w, const char *path, unsigned *out)
{
	char *real = realpath(path, NULL);
	enum ckfs_code rc = CKFS_OK;

	*out = CKFS_CLASS_ALL;
	if (!real)
		return ckfs_fail_errno(w->err, "'%s': cannot resolve", path);
	if (strcmp(real, path) != 0)
		rc = search_chain(w, real, true, out);
	free(real);
	return rc;
}

/* acc (the classes that may search every folder above prefix) narrowed
 * to those that may also search prefix itself, and, unless canonical,
 * every folder on its resolved path; memoized. */
static enum ckfs_code prefix_classes(struct walk *w, const char *prefix, bool canonical,
				     unsigned *acc)
{
	const struct dir_memo *hit = memo_find(w, prefix);
	struct ckfs_file_access a;
	unsigned resolved = CKFS_CLASS_ALL;

	if (hit) {
		*acc = hit->classes;
		return CKFS_OK;
	}
	CKFS_TRY(stat_access(w, prefix, &a));
	if (!canonical)
		CKFS_TRY(resolved_chain(w, prefix, &resolved));
	*acc &= ckfs_perm_classes(w->o, &a, CKFS_PERM_SEARCH) & resolved;
	return memo_add(w, prefix, *acc);
}

/* Classes that may search dir (absolute) and every folder above it,
 * lexically and, unless canonical, along its resolved path too. Walked
 * from / down, one prefix at a time, so a deep path costs no stack. */
static enum ckfs_code search_chain(struct walk *w, const char *dir, bool canonical,
				   unsigned *out)
{
	size_t n = strlen(dir);
	char *prefix;
	enum ckfs_code rc = CKFS_OK;

	*out = CKFS_CLASS_ALL;
	if (dir[0] != '/')
		return ckfs_fail(w->err, CKFS_E_INVALID, "'%s': not an absolute path", dir);
	prefix = malloc(n + 1);
	if (!prefix)
		return ckfs_nomem(w->err);
	for (size_t end = 1; end <= n && rc == CKFS_OK; end++) {
		if (end < n && dir[end] != '/')
			continue;
		if (end > 1 && dir[end - 1] == '/')
			continue; /* "//" or a trailing "/": the same folder */
		memcpy(prefix, dir, end);
		prefix[end] = '\0';
		rc = prefix_classes(w, prefix, canonical, out);
	}
	free(prefix);
	return rc;
}

/* Classes that may do perm on the object a describes (as recorded) and
 * search every folder on its way there. */
static enum ckfs_code reach(struct walk *w, const struct ckfs_file_access *a,
			    unsigned perm, unsigned *out)
{
	const char *path = a->path;
	char parent[PATH_MAX];
	char *real;
	unsigned lexical, resolved = CKFS_CLASS_ALL;

	if (ckfs_s3_is_url(path)) { /* no folders on the way to an object */
		*out = ckfs_perm_classes(w->o, a, perm);
		return CKFS_OK;
	}
	if (path[0] != '/' || strlen(path) >= sizeof(parent))
		return ckfs_fail(w->err, CKFS_E_INVALID, "'%s': not an absolute path", path);
	parent_dir(path, parent);
	CKFS_TRY(search_chain(w, parent, false, &lexical));
	/* A symlink to a file elsewhere: the folders above its target. */
	real = realpath(path, NULL);
	if (!real)
		return ckfs_fail_errno(w->err, "'%s': cannot resolve", path);
	enum ckfs_code rc = CKFS_OK;
	if (strcmp(real, path) != 0) {
		parent_dir(real, parent);
		rc = search_chain(w, parent, true, &resolved);
	}
	free(real);
	CKFS_TRY(rc);
	*out = ckfs_perm_classes(w->o, a, perm) & lexical & resolved;
	return CKFS_OK;
}

/* reach() for a folder, stat-ed now. */
static enum ckfs_code reach_dir(struct walk *w, const char *dir, unsigned perm,
				unsigned *out)
{
	struct ckfs_file_access a;

	CKFS_TRY(stat_access(w, dir, &a));
	return reach(w, &a, perm, out);
}

/* Classes that may read a file recorded when it was read. */
static enum ckfs_code reach_recorded(struct walk *w, const struct ckfs_file_access *a,
				     unsigned *out)
{
	*out = 0; /* nothing recorded: closed */
	if (!a->path)
		return CKFS_OK;
	return reach(w, a, CKFS_PERM_READ, out);
}

/* Classes that may read an opened source. */
static enum ckfs_code reach_source(struct walk *w, const struct ckfs_source *s,
				   unsigned *out)
{
	const struct ckfs_file_access a = {
		.path = s->path, .mode = s->mode, .uid = s->uid, .gid = s->gid, .acl = s->acl,
	};
	return reach(w, &a, CKFS_PERM_READ, out);
}

/* ---- the folder ---- */

#define UNKNOWN 0xffu

/* Classes that may read source i, computed once (cache[i] == UNKNOWN
 * until then). */
static enum ckfs_code source_classes(struct walk *w, const struct ckfs_model *m,
				     uint32_t i, unsigned char *cache, unsigned *out)
{
	if (cache[i] == UNKNOWN) {
		unsigned c;
		CKFS_TRY(reach_source(w, &m->sources[i], &c));
		cache[i] = (unsigned char)c;
	}
	*out = cache[i];
	return CKFS_OK;
}

/* A tensor: the sources of its chunks, and of what a view computes it
 * from (a fused LoRA pair, the weight FP8 scales are made of, ...). */
static enum ckfs_code tensor_classes(struct walk *w, const struct ckfs_model *m,
				     const struct ckfs_tensor *t, unsigned char *cache,
				     unsigned *out)
{
	for (uint32_t k = 0; k < t->n_chunks && *out; k++) {
		unsigned c;
		CKFS_TRY(source_classes(w, m, t->chunks[k].source, cache, &c));
		*out &= c;
	}
	const struct ckfs_tensor *in[2];
	size_t n = t->view ? t->view->inputs(t, in) : 0;
	for (size_t k = 0; k < n && *out; k++)
		CKFS_TRY(tensor_classes(w, m, in[k], cache, out));
	return CKFS_OK;
}

/* A weight file: the sources of its tensors. */
static enum ckfs_code weights_classes(struct walk *w, const struct ckfs_model *m,
				      const struct ckfs_st_file *sf, unsigned char *cache,
				      unsigned *out)
{
	for (size_t t = 0; t < sf->n_tensors && *out; t++)
		CKFS_TRY(tensor_classes(w, m, sf->tensors[t], cache, out));
	return CKFS_OK;
}

/* A GGUF file: its tensors, config.json and the side files it is made from. */
static enum ckfs_code gguf_classes(struct walk *w, const struct ckfs_model *m,
				   const struct ckfs_gguf_file *g, unsigned char *cache,
				   unsigned *out)
{
	unsigned c;

	for (size_t t = 0; t < g->n_tensors && *out; t++) {
		const struct ckfs_gguf_tensor *gt = &g->tensors[t];
		CKFS_TRY(tensor_classes(w, m, gt->src, cache, out));
		for (int64_t e = 1; e < gt->n_expert && *out; e++) /* a stack's other experts */
			CKFS_TRY(tensor_classes(w, m, gt->experts[e], cache, out));
	}
	for (size_t i = 0; i < g->n_from && *out; i++) {
		CKFS_TRY(reach_recorded(w, &g->from[i], &c));
		*out &= c;
	}
	if (m->config_access.path) {
		CKFS_TRY(reach_recorded(w, &m->config_access, &c));
		*out &= c;
	}
	return CKFS_OK;
}

static enum ckfs_code root_classes(struct walk *w, const struct ckfs_model *m,
				   mode_t *root_mode)
{
	unsigned list, search, hf = CKFS_CLASS_ALL;

	CKFS_TRY(reach_dir(w, m->src_dir, CKFS_PERM_READ, &list));
	CKFS_TRY(reach_dir(w, m->src_dir, CKFS_PERM_SEARCH, &search));
	/* The side files' names are listed in the root too. */
	if (m->hf_dir)
		CKFS_TRY(reach_dir(w, m->hf_dir, CKFS_PERM_READ, &hf));
	*root_mode = ckfs_perm_bits(list & hf, CKFS_PERM_READ) |
		     ckfs_perm_bits(search, CKFS_PERM_SEARCH);
	return CKFS_OK;
}

static enum ckfs_code node_classes(struct walk *w, const struct ckfs_folder *f,
				   const struct ckfs_node *n, unsigned meta,
				   unsigned char *cache, unsigned *out)
{
	switch (n->kind) {
	case CKFS_NODE_WEIGHTS:
		*out = meta;
		if (n->gguf)
			return gguf_classes(w, f->model, n->gguf, cache, out);
		return weights_classes(w, f->model, n->st, cache, out);
	case CKFS_NODE_RENDERED: {
		/* From a file (config.json), from weight files (the index,
		 * adapter_config.json), or both. */
		const struct ckfs_st_layout *l = n->from_weights;
		*out = l ? meta : CKFS_CLASS_ALL;
		for (size_t i = 0; l && i < l->n_files && *out; i++)
			CKFS_TRY(weights_classes(w, f->model, &l->files[i], cache, out));
		if (n->from) {
			unsigned c;
			CKFS_TRY(reach_recorded(w, n->from, &c));
			*out &= c;
		}
		return CKFS_OK;
	}
	case CKFS_NODE_PASSTHROUGH:
		return reach_source(w, &n->src, out);
	case CKFS_NODE_DIR:
		*out = 0; /* given the top folder's mode (ckfs_folder_modes) */
		return CKFS_OK;
	}
	*out = 0;
	return CKFS_OK;
}

enum ckfs_code ckfs_folder_modes(const struct ckfs_folder *f, const struct ckfs_owner *o,
				 mode_t *node_modes, mode_t *root_mode,
				 struct ckfs_error *err)
{
	const struct ckfs_model *m = f->model;
	struct walk w = { .o = o, .err = err };
	unsigned meta = CKFS_CLASS_ALL;
	unsigned char *cache = malloc(m->n_sources ? m->n_sources : 1);
	enum ckfs_code rc = CKFS_OK;

	if (!cache)
		return ckfs_nomem(err);
	memset(cache, UNKNOWN, m->n_sources);
	for (size_t i = 0; i < m->n_meta_files && rc == CKFS_OK; i++) {
		unsigned c;
		rc = reach_recorded(&w, &m->meta_files[i], &c);
		meta &= c;
	}
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++) {
		unsigned c = 0;
		rc = node_classes(&w, f, &f->nodes[i], meta, cache, &c);
		node_modes[i] = ckfs_perm_bits(c, CKFS_PERM_READ);
	}
	if (rc == CKFS_OK)
		rc = root_classes(&w, m, root_mode);
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++)
		if (f->nodes[i].kind == CKFS_NODE_DIR)
			node_modes[i] = *root_mode;
	for (size_t i = 0; i < w.n_dirs; i++)
		free(w.dirs[i].path);
	free(w.dirs);
	free(cache);
	return rc;
}
