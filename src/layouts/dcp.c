/* SPDX-License-Identifier: MIT */
/*
 * torch.distributed.checkpoint folders (formats.md section 5): SRC/.metadata
 * (a pickled Metadata) and __<rank>_<i>.distcp data files, as written by
 * torch.distributed.checkpoint.save with the default FileSystemWriter.
 *
 * .metadata is run through the pickle VM (protocol 4/5). Its Metadata
 * holds state_dict_metadata {fqn: TensorStorageMetadata |
 * BytesStorageMetadata} (the output order), planner_data {fqn: path tuple}
 * and storage_data {MetadataIndex(fqn, offset, index): _StorageInfo
 * (relative_path, offset, length[, transform_descriptors])}. Each tensor
 * item is a complete torch.save zip at [offset, offset + length) of its
 * file whose data.pkl is one bare tensor: it is opened in place and its
 * view becomes a chunk at the ChunkStorageMetadata offsets, through the
 * same code as a ShardedTensor's local shard (placement.c), so strides,
 * storage offsets and the neg bit are honoured.
 *
 * Names: a checkpoint saved as {"model": state_dict, ...} has FQNs
 * "model.<key>"; planner_data maps each to ("model", <key>) and the key is
 * recovered from that path (inner keys contain dots, so the FQN is never
 * split). When any path starts with "model", entries outside it ("optim",
 * "extra_state", ...) are dropped with a warning; otherwise every FQN is a
 * name as is, less torch wrapper names (names.c). Non-tensor (bytes)
 * entries are skipped with a warning. The
 * tie rule of verl's merger applies (lm_head.weight dropped when tied: the
 * row's flag, applied by open.c).
 *
 * Refused: items with transform_descriptors (compressed items), relative
 * paths leaving SRC, chunks without a storage entry, items that are not
 * one plain tensor of the declared dtype and chunk shape.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layouts/layouts.h"

/* ---- pickle tree helpers ---- */

/* Field of a dataclass object: its BUILD state dict, or the
 * (dict_or_None, slots_dict) pair of slotted classes. */
static const struct ckfs_pv *field(const struct ckfs_pv *obj, const char *name)
{
	const struct ckfs_pv *st;

	if (!obj || obj->kind != CKFS_PV_OBJECT || !(st = obj->u.obj.state))
		return NULL;
	if (st->kind == CKFS_PV_DICT)
		return ckfs_pv_dict_get(st, name);
	if (st->kind == CKFS_PV_TUPLE && st->u.seq.n == 2) {
		const struct ckfs_pv *v = ckfs_pv_dict_get(st->u.seq.items[0], name);
		return v ? v : ckfs_pv_dict_get(st->u.seq.items[1], name);
	}
	return NULL;
}

static int is_dcp_class(const struct ckfs_pv *obj, const char *name)
{
	return obj && obj->kind == CKFS_PV_OBJECT &&
	       ckfs_pv_is_global_named(obj->u.obj.cls, "torch.distributed.checkpoint",
				       name);
}

/* A torch.Size (evaluated to a tuple) or list of non-negative ints. */
static int get_dims(const struct ckfs_pv *t, int64_t *dims, int *ndim)
{
	if (!t || (t->kind != CKFS_PV_TUPLE && t->kind != CKFS_PV_LIST) ||
	    t->u.seq.n > CKFS_MAX_DIMS)
		return 0;
	for (size_t i = 0; i < t->u.seq.n; i++)
		if (!ckfs_pv_get_int(t->u.seq.items[i], &dims[i]) || dims[i] < 0)
			return 0;
	*ndim = (int)t->u.seq.n;
	return 1;
}

/* ---- storage_data index ---- */

struct item {
	const char *fqn;
	int ndim;                       /* -1: no offset (a bytes entry) */
	int64_t off[CKFS_MAX_DIMS];
	const struct ckfs_pv *info;     /* _StorageInfo */
	size_t file;                    /* index into files */
};

struct file {
	const char *rel;
	int64_t source;                 /* -1 until opened */
};

static int cmp_item(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	int c = strcmp(x->fqn, y->fqn);

	if (c)
		return c;
	if (x->ndim != y->ndim)
		return x->ndim < y->ndim ? -1 : 1;
	for (int k = 0; k < x->ndim; k++)
		if (x->off[k] != y->off[k])
			return x->off[k] < y->off[k] ? -1 : 1;
	return 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_file(const void *a, const void *b)
{
	return strcmp(((const struct file *)a)->rel, ((const struct file *)b)->rel);
}

/* "__<rank>_<i>.distcp" -> rank; 0 for other names. */
static int rank_of(const char *rel)
{
	long r = 0;
	const char *p = rel + 2;

	if (strncmp(rel, "__", 2) != 0)
		return 0;
	for (; *p >= '0' && *p <= '9' && r < CKFS_MAX_RANKS; p++)
		r = r * 10 + (*p - '0');
	return *p == '_' && p > rel + 2 && r < CKFS_MAX_RANKS ? (int)r : 0;
}

struct dcp {
	struct ckfs_model *m;
	const char *md_path;            /* SRC/.metadata, for messages */
	struct ckfs_arena tmp;          /* pickle tree, indexes */
	struct item *items;
	size_t n_items;
	struct file *files;
	size_t n_files;
	const struct ckfs_pv *planner;  /* planner_data dict or NULL */
	size_t *planner_order;          /* planner keys' indices sorted by key */
	/* ckfs_dcp_read_raw (megatron_dist.c): the folder holding the files
	 * (m->src_dir otherwise), its name relative to SRC, the entries to
	 * read, and what was left out. */
	const char *dir, *rel_dir;
	int (*keep)(const char *fqn);
	bool raw;
	size_t n_left_out, n_bytes;
};

/* A relative_path must name a file directly inside SRC: a file name
 * (at most NAME_MAX bytes, no NUL), no '/', no "..". */
static int safe_rel(const struct ckfs_pv *s)
{
	return s && s->kind == CKFS_PV_STR && s->u.str.len > 0 &&
	       s->u.str.len < 256 && strlen(s->u.str.s) == s->u.str.len &&
	       !strchr(s->u.str.s, '/') && strcmp(s->u.str.s, ".") != 0 &&
	       strcmp(s->u.str.s, "..") != 0 && strstr(s->u.str.s, "..") == NULL;
}

static enum ckfs_code index_storage(struct dcp *d, const struct ckfs_pv *sd,
				    struct ckfs_error *err)
{
	size_t n = sd->u.dict.n;
	const char **names;

	/* n is bounded by the pickle VM's container limits. */
	d->items = ckfs_arena_calloc(&d->tmp, n + 1, sizeof(*d->items));
	names = ckfs_arena_calloc(&d->tmp, n + 1, sizeof(*names));
	if (!d->items || !names)
		return ckfs_nomem(err);
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_pv *key = sd->u.dict.keys[i], *val = sd->u.dict.vals[i];
		const struct ckfs_pv *fqn = field(key, "fqn"), *off = field(key, "offset");
		const struct ckfs_pv *rel = field(val, "relative_path");
		struct item *it = &d->items[i];

		if (!is_dcp_class(key, "MetadataIndex") || !fqn || fqn->kind != CKFS_PV_STR ||
		    strlen(fqn->u.str.s) != fqn->u.str.len)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': storage_data key %zu is not a "
					 "MetadataIndex", d->md_path, i);
		it->fqn = fqn->u.str.s;
		it->info = val;
		it->ndim = -1;
		if (!ckfs_pv_is_none(off) && !get_dims(off, it->off, &it->ndim))
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': bad offset in the storage entry of '%s'",
					 d->md_path, it->fqn);
		if (!is_dcp_class(val, "_StorageInfo"))
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': storage entry of '%s' is not a "
					 "_StorageInfo", d->md_path, it->fqn);
		if (!safe_rel(rel))
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': storage entry of '%s' has a bad "
					 "relative_path%s%s%s (must name a file in "
					 "the checkpoint folder)", d->md_path, it->fqn,
					 rel && rel->kind == CKFS_PV_STR ? " '" : "",
					 rel && rel->kind == CKFS_PV_STR ? rel->u.str.s : "",
					 rel && rel->kind == CKFS_PV_STR ? "'" : "");
		names[i] = rel->u.str.s;
	}
	d->n_items = n;
	qsort(d->items, n, sizeof(*d->items), cmp_item);
	for (size_t i = 1; i < n; i++)
		if (cmp_item(&d->items[i - 1], &d->items[i]) == 0)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': two storage entries for the same "
					 "chunk of '%s'", d->md_path, d->items[i].fqn);

	/* Distinct files, then each item's file. */
	qsort(names, n, sizeof(*names), cmp_str_ptr);
	d->files = ckfs_arena_calloc(&d->tmp, n + 1, sizeof(*d->files));
	if (!d->files)
		return ckfs_nomem(err);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
			d->files[d->n_files++] = (struct file){ names[i], -1 };
	int max_rank = -1;
	for (size_t i = 0; i < n; i++) {
		struct file key = { field(d->items[i].info, "relative_path")->u.str.s, 0 };
		struct file *f = bsearch(&key, d->files, d->n_files, sizeof(key), cmp_file);
		d->items[i].file = (size_t)(f - d->files);
		int r = rank_of(key.rel);
		if (r > max_rank)
			max_rank = r;
	}
	d->m->world_size = max_rank + 1;
	d->m->sources = ckfs_arena_calloc(&d->m->arena, d->n_files + 1,
					  sizeof(*d->m->sources));
	return d->m->sources ? CKFS_OK : ckfs_nomem(err);
}

static const struct item *find_item(const struct dcp *d, const char *fqn, int ndim,
				    const int64_t *off)
{
	struct item key = { .fqn = fqn, .ndim = ndim };

	memcpy(key.off, off, sizeof(int64_t) * (size_t)ndim);
	return bsearch(&key, d->items, d->n_items, sizeof(key), cmp_item);
}

/* ---- planner_data: FQN -> path tuple ---- */

static int cmp_planner(const void *a, const void *b, void *ctx)
{
	const struct ckfs_pv *pd = ctx;
	return strcmp(pd->u.dict.keys[*(const size_t *)a]->u.str.s,
		      pd->u.dict.keys[*(const size_t *)b]->u.str.s);
}

static enum ckfs_code index_planner(struct dcp *d, const struct ckfs_pv *pd,
				    struct ckfs_error *err)
{
	if (ckfs_pv_is_none(pd))
		return CKFS_OK;
	if (pd->kind != CKFS_PV_DICT)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': planner_data is a %s, "
				 "not a dict", d->md_path, ckfs_pv_kind_name(pd->kind));
	d->planner_order = ckfs_arena_calloc(&d->tmp, pd->u.dict.n + 1, sizeof(size_t));
	if (!d->planner_order)
		return ckfs_nomem(err);
	for (size_t i = 0; i < pd->u.dict.n; i++) {
		const struct ckfs_pv *k = pd->u.dict.keys[i], *v = pd->u.dict.vals[i];
		if (!k || k->kind != CKFS_PV_STR || !v ||
		    (v->kind != CKFS_PV_TUPLE && v->kind != CKFS_PV_LIST))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': planner_data entry "
					 "%zu is not a name and a path", d->md_path, i);
		d->planner_order[i] = i;
	}
	qsort_r(d->planner_order, pd->u.dict.n, sizeof(size_t), cmp_planner,
		(void *)pd);
	d->planner = pd;
	return CKFS_OK;
}

static const struct ckfs_pv *planner_path(const struct dcp *d, const char *fqn)
{
	size_t lo = 0, hi = d->planner ? d->planner->u.dict.n : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2, k = d->planner_order[mid];
		int c = strcmp(d->planner->u.dict.keys[k]->u.str.s, fqn);
		if (c == 0)
			return d->planner->u.dict.vals[k];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int path_in_model(const struct ckfs_pv *p)
{
	return p && p->u.seq.n >= 2 && ckfs_pv_is_str(p->u.seq.items[0], "model");
}

/* Path components from `from` on, joined with '.' (ints in decimal). */
static const char *join_path(struct ckfs_model *m, const struct ckfs_pv *p,
			     size_t from)
{
	char buf[CKFS_MAX_NAME + 1];
	size_t len = 0;

	for (size_t i = from; i < p->u.seq.n; i++) {
		const struct ckfs_pv *c = p->u.seq.items[i];
		int w;
		if (c->kind == CKFS_PV_STR)
			w = snprintf(buf + len, sizeof(buf) - len, "%s%s",
				     i > from ? "." : "", c->u.str.s);
		else if (c->kind == CKFS_PV_INT)
			w = snprintf(buf + len, sizeof(buf) - len, "%s%lld",
				     i > from ? "." : "", (long long)c->u.i);
		else
			return NULL;
		if (w < 0 || (size_t)w >= sizeof(buf) - len)
			return NULL;
		len += (size_t)w;
	}
	return ckfs_arena_strndup(&m->arena, buf, len);
}

/* ---- sources ---- */

static enum ckfs_code open_file(struct dcp *d, size_t fi, struct ckfs_error *err)
{
	struct ckfs_model *m = d->m;
	struct file *f = &d->files[fi];

	if (f->source >= 0)
		return CKFS_OK;
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", d->dir ? d->dir : m->src_dir,
					     f->rel);
	const char *rel = d->rel_dir ? ckfs_arena_printf(&m->arena, "%s/%s", d->rel_dir, f->rel)
				     : ckfs_arena_strdup(&m->arena, f->rel);
	if (!path || !rel)
		return ckfs_nomem(err);
	enum ckfs_code rc = ckfs_source_open(&m->sources[m->n_sources], &m->policy, path, rel,
					     err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (named by .metadata)",
				 path);
	}
	CKFS_TRY(rc);
	f->source = (int64_t)m->n_sources++;
	return CKFS_OK;
}

/* ---- one tensor ---- */

/* The chunk cmeta describes of t (its dtype and global shape set), read
 * from its .distcp item into out. */
static enum ckfs_code chunk_of(struct dcp *d, const char *fqn, const struct ckfs_tensor *t,
			       const struct ckfs_pv *cmeta, struct ckfs_chunk_list *out,
			       struct ckfs_error *err)
{
	enum ckfs_dtype dtype = t->stored_dtype;
	const int64_t *gshape = t->shape;
	int ndim = t->ndim;
	struct ckfs_sharded_info si = { .ndim = ndim, .have_local = true };
	struct ckfs_sd_entry e;
	struct ckfs_torch_file tf;
	int n1 = -1, n2 = -1;
	uint64_t numel = 1;
	int64_t off, len;
	char at[256];

	memcpy(si.global_shape, gshape, sizeof(si.global_shape));
	if (!is_dcp_class(cmeta, "ChunkStorageMetadata") ||
	    !get_dims(field(cmeta, "offsets"), si.offsets, &n1) ||
	    !get_dims(field(cmeta, "sizes"), si.sizes, &n2) || n1 != ndim || n2 != ndim)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad chunk metadata of '%s'",
				 d->md_path, fqn);
	for (int k = 0; k < ndim; k++)
		if (si.offsets[k] > gshape[k] || si.sizes[k] > gshape[k] - si.offsets[k])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': a chunk of '%s' "
					 "lies outside its global shape", d->md_path, fqn);
	for (int k = 0; k < ndim; k++)
		numel *= (uint64_t)si.sizes[k]; /* <= the global numel, checked */
	if (numel == 0)
		return CKFS_OK; /* an empty shard holds nothing */
	ckfs_format_dims(ndim, si.offsets, "[", "]", at, sizeof(at));
	const struct item *it = find_item(d, fqn, ndim, si.offsets);
	if (!it)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no storage_data entry for "
				 "the chunk of '%s' at %s", d->md_path, fqn, at);
	const struct ckfs_pv *td = field(it->info, "transform_descriptors");
	if (!ckfs_pv_is_none(td) && !((td->kind == CKFS_PV_LIST || td->kind == CKFS_PV_TUPLE) &&
			      td->u.seq.n == 0)) {
		const struct ckfs_pv *t0 = (td->kind == CKFS_PV_LIST ||
					    td->kind == CKFS_PV_TUPLE) && td->u.seq.n
						   ? td->u.seq.items[0] : NULL;
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': '%s' is stored with transforms (%s); "
				 "transformed DCP items are not supported", d->md_path,
				 fqn, t0 && t0->kind == CKFS_PV_STR ? t0->u.str.s : "?");
	}
	if (!ckfs_pv_get_int(field(it->info, "offset"), &off) ||
	    !ckfs_pv_get_int(field(it->info, "length"), &len) || off < 0 || len < 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': storage entry of '%s' at %s "
				 "has no valid offset and length", d->md_path, fqn, at);
	CKFS_TRY(open_file(d, it->file, err));
	const struct ckfs_source *s = &d->m->sources[d->files[it->file].source];
	if ((uint64_t)off > s->size || (uint64_t)len > s->size - (uint64_t)off)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': the item of '%s' at %s "
				 "(bytes %lld+%lld) lies outside the file (%llu bytes)",
				 s->path, fqn, at, (long long)off, (long long)len,
				 (unsigned long long)s->size);
	char label[CKFS_MAX_NAME + 64];
	snprintf(label, sizeof(label), "%s@%lld", s->path, (long long)off);
	const struct ckfs_torch_open_opts o = {
		.label = label, .root = CKFS_TORCH_ROOT_ITEM,
		.item = { .base = (uint64_t)off, .length = (uint64_t)len, .key = fqn, .out = &e },
	};
	CKFS_TRY(ckfs_torch_open(&tf, s->f, &o, err));
	enum ckfs_code rc = CKFS_OK;
	int same = e.local.ndim == ndim;
	for (int k = 0; same && k < ndim; k++)
		same = e.local.shape[k] == si.sizes[k];
	if (e.local.dtype != dtype || !same) {
		char got[256], want[256];
		ckfs_format_dims(e.local.ndim, e.local.shape, "[", "]", got, sizeof(got));
		ckfs_format_dims(ndim, si.sizes, "[", "]", want, sizeof(want));
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': the item of '%s' at %s holds "
			       "%s %s, .metadata declares %s %s", label, fqn, at,
			       ckfs_dtype_torch_name(e.local.dtype), got,
			       ckfs_dtype_torch_name(dtype), want);
	}
	if (rc == CKFS_OK) {
		e.kind = CKFS_ENTRY_SHARDED;
		e.key = fqn;
		e.sharded = &si;
		rc = ckfs_entry_chunks(&e, NULL, (uint32_t)d->files[it->file].source,
				       rank_of(d->files[it->file].rel), out, err);
	}
	ckfs_torch_close(&tf);
	return rc;
}

static const char *describe_chunks(const struct ckfs_tensor *t)
{
	static const char *const by_dim[] = { "chunks(dim 0)", "chunks(dim 1)",
					      "chunks(dim 2)", "chunks(dim 3)" };
	int dim = -1;

	if (t->n_chunks <= 1)
		return "whole";
	for (uint32_t i = 0; i < t->n_chunks; i++)
		for (int k = 0; k < t->ndim; k++)
			if (t->chunks[i].offset[k] != 0) {
				if (dim >= 0 && dim != k)
					return "chunks";
				dim = k;
			}
	return dim >= 0 && dim < 4 ? by_dim[dim] : "chunks";
}

static enum ckfs_code add_tensor(struct dcp *d, const char *fqn, const char *name,
				 const struct ckfs_pv *tsm, struct ckfs_error *err)
{
	struct ckfs_model *m = d->m;
	struct ckfs_tensor *t = &m->tensors[m->n_tensors];
	struct ckfs_chunk_list list = { 0 };
	const struct ckfs_pv *props = field(tsm, "properties");
	const struct ckfs_pv *chunks = field(tsm, "chunks");
	const struct ckfs_pv *dt = NULL;
	enum ckfs_code rc = CKFS_OK;

	/* TensorProperties: a 5-tuple state (dtype first) from its
	 * __getstate__, or a dict state in older releases. */
	if (props && props->kind == CKFS_PV_OBJECT && props->u.obj.state &&
	    props->u.obj.state->kind == CKFS_PV_TUPLE && props->u.obj.state->u.seq.n)
		dt = props->u.obj.state->u.seq.items[0];
	else
		dt = field(props, "dtype");
	if (!dt || dt->kind != CKFS_PV_GLOBAL || strcmp(dt->u.global.module, "torch") != 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has no dtype",
				 d->md_path, fqn);
	enum ckfs_dtype dtype = ckfs_dtype_from_torch_name(dt->u.global.name);
	int64_t shape[CKFS_MAX_DIMS];
	int ndim;
	if (dtype == CKFS_DTYPE_INVALID)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' has unsupported "
				 "dtype %s", d->md_path, fqn, dt->u.global.name);
	if (!get_dims(field(tsm, "size"), shape, &ndim))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad size of '%s'",
				 d->md_path, fqn);
	if (!ckfs_tensor_set(t, dtype, ndim, shape))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': size of '%s' "
				 "overflows", d->md_path, fqn);
	if (!chunks || chunks->kind != CKFS_PV_LIST)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has no chunk list",
				 d->md_path, fqn);
	if (chunks->u.seq.n > CKFS_MAX_RANKS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': '%s' has %zu chunks",
				 d->md_path, fqn, chunks->u.seq.n);
	for (size_t i = 0; i < chunks->u.seq.n && rc == CKFS_OK; i++)
		rc = chunk_of(d, fqn, t, chunks->u.seq.items[i], &list, err);
	if (rc == CKFS_OK) {
		t->chunks = ckfs_model_chunks(m, list.v, list.n, t->ndim);
		if (!t->chunks)
			rc = ckfs_nomem(err);
	}
	if (rc == CKFS_OK) {
		t->n_chunks = (uint32_t)list.n;
		t->name = name;
		t->placement = describe_chunks(t);
		rc = ckfs_plan_validate_tensor(m, t, err);
		if (rc != CKFS_OK)
			ckfs_error_prefix(err, "'%s'", d->md_path);
	}
	free(list.v);
	if (rc == CKFS_OK)
		m->n_tensors++;
	return rc;
}

/* ---- the folder ---- */

/* The name rule of torch state-dict keys (names.c) over the tensors'
 * names: wrapper names removed. */
static enum ckfs_code hf_names(struct dcp *d, struct ckfs_error *err)
{
	struct ckfs_model *m = d->m;
	const char **keys = ckfs_arena_calloc(&d->tmp, m->n_tensors + 1, sizeof(*keys));
	const char **names = ckfs_arena_calloc(&d->tmp, m->n_tensors + 1, sizeof(*names));

	if (!keys || !names)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++)
		keys[i] = m->tensors[i].name;
	CKFS_TRY(ckfs_hf_names(m, d->md_path, keys, names, m->n_tensors, true, err));
	for (size_t i = 0; i < m->n_tensors; i++)
		m->tensors[i].name = names[i];
	return CKFS_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(const struct ckfs_tensor *const *)a)->name,
		      (*(const struct ckfs_tensor *const *)b)->name);
}

static enum ckfs_code warn_list(struct ckfs_model *m, struct ckfs_error *err,
				const char *what, size_t n, const char *const *names,
				size_t n_names)
{
	char buf[512] = "";

	for (size_t i = 0; i < n_names && i < 3; i++) {
		size_t k = strlen(buf);
		snprintf(buf + k, sizeof(buf) - k, "%s'%s'", i ? ", " : "", names[i]);
	}
	return ckfs_model_warn(m, err, "skipped %zu %s (%s%s)", n, what, buf,
			       n_names > 3 ? ", ..." : "");
}

static enum ckfs_code build(struct dcp *d, const char *bytes, size_t len,
			    const struct ckfs_model_options *opt, struct ckfs_error *err)
{
	struct ckfs_model *m = d->m;
	const struct ckfs_pv *root;

	CKFS_TRY(ckfs_pickle_load(bytes, len, d->md_path, &d->tmp,
				  (struct ckfs_pv **)&root, err));
	if (!is_dcp_class(root, "Metadata"))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a torch.distributed."
				 "checkpoint Metadata (the pickle holds a %s)",
				 d->md_path, ckfs_pv_kind_name(root->kind));
	const struct ckfs_pv *sdm = field(root, "state_dict_metadata");
	const struct ckfs_pv *sd = field(root, "storage_data");
	if (!sdm || sdm->kind != CKFS_PV_DICT || !sd || sd->kind != CKFS_PV_DICT)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': Metadata lacks "
				 "state_dict_metadata or storage_data", d->md_path);
	if (sdm->u.dict.n > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': %zu entries (limit %u)",
				 d->md_path, sdm->u.dict.n, CKFS_MAX_TENSORS);
	CKFS_TRY(index_storage(d, sd, err));
	CKFS_TRY(index_planner(d, field(root, "planner_data"), err));

	/* Saved as {"model": ..., ...}: keep what is under "model". */
	int model_prefix = 0;
	for (size_t i = 0; !d->raw && d->planner && i < d->planner->u.dict.n; i++)
		model_prefix |= path_in_model(d->planner->u.dict.vals[i]);

	size_t n = sdm->u.dict.n, n_bytes = 0, n_other = 0, n_other_names = 0,
	       n_bytes_names = 0;
	const char **other = ckfs_arena_calloc(&d->tmp, 4, sizeof(char *));
	const char **byte_names = ckfs_arena_calloc(&d->tmp, 4, sizeof(char *));
	m->tensors = ckfs_arena_calloc(&m->arena, n + 1, sizeof(*m->tensors));
	if (!other || !byte_names || !m->tensors)
		return ckfs_nomem(err);
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_pv *k = sdm->u.dict.keys[i], *v = sdm->u.dict.vals[i];
		if (!k || k->kind != CKFS_PV_STR || strlen(k->u.str.s) != k->u.str.len)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': state_dict_metadata "
					 "key %zu is not a name", d->md_path, i);
		const char *fqn = k->u.str.s;
		const struct ckfs_pv *path = planner_path(d, fqn);
		const char *name;
		if (d->keep && !d->keep(fqn)) {
			d->n_left_out++;
			continue;
		}
		if (model_prefix && !path_in_model(path)) {
			const struct ckfs_pv *top = path && path->u.seq.n ? path->u.seq.items[0] : NULL;
			const char *tname = top && top->kind == CKFS_PV_STR ? top->u.str.s : fqn;
			int seen = 0;
			for (size_t j = 0; j < n_other_names; j++)
				seen |= strcmp(other[j], tname) == 0;
			if (!seen && n_other_names < 4)
				other[n_other_names++] = tname;
			n_other++;
			continue;
		}
		if (is_dcp_class(v, "BytesStorageMetadata")) {
			if (n_bytes_names < 4)
				byte_names[n_bytes_names++] = fqn;
			n_bytes++;
			continue;
		}
		if (!is_dcp_class(v, "TensorStorageMetadata"))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' has unknown "
					 "storage metadata", d->md_path, fqn);
		name = model_prefix ? join_path(m, path, 1) : ckfs_arena_strdup(&m->arena, fqn);
		if (!name)
			return model_prefix ? ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad "
							"planner_data path of '%s'",
							d->md_path, fqn)
					    : ckfs_nomem(err);
		if (strlen(name) > CKFS_MAX_NAME)
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': name of '%s' too long",
					 d->md_path, fqn);
		CKFS_TRY(add_tensor(d, fqn, name, v, err));
	}
	if (m->n_tensors == 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no tensors%s", d->md_path,
				 model_prefix ? " under 'model'" : "");

	if (!d->raw) /* Megatron's sharded keys (megatron_dist.c) have no wrappers */
		CKFS_TRY(hf_names(d, err));

	/* Names must stay distinct after the prefix is removed. */
	const struct ckfs_tensor **by = ckfs_arena_calloc(&d->tmp, m->n_tensors,
							  sizeof(*by));
	if (!by)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++)
		by[i] = &m->tensors[i];
	qsort(by, m->n_tensors, sizeof(*by), cmp_tensor_name);
	for (size_t i = 1; i < m->n_tensors; i++)
		if (strcmp(by[i]->name, by[i - 1]->name) == 0)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': two entries are named "
					 "'%s'", d->md_path, by[i]->name);

	if (d->raw) {
		d->n_bytes = n_bytes;
		return CKFS_OK;
	}
	CKFS_TRY(ckfs_model_load_config(m, opt->config_path, err));
	if (n_other)
		CKFS_TRY(warn_list(m, err, "entries outside 'model'", n_other, other,
				   n_other_names));
	if (n_bytes)
		CKFS_TRY(warn_list(m, err, "non-tensor (bytes) entries", n_bytes,
				   byte_names, n_bytes_names));
	return CKFS_OK;
}

enum ckfs_code ckfs_dcp_build_from(struct ckfs_model *m,
				   const struct ckfs_model_options *opt,
				   const char *bytes, size_t len,
				   struct ckfs_error *err)
{
	struct dcp d = { .m = m };

	ckfs_arena_init(&d.tmp);
	d.md_path = ckfs_arena_printf(&m->arena, "%s/.metadata", m->src_dir);
	enum ckfs_code rc = d.md_path ? build(&d, bytes, len, opt, err) : ckfs_nomem(err);
	ckfs_arena_release(&d.tmp);
	return rc;
}

static enum ckfs_code dcp_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
				struct ckfs_error *err)
{
	char *bytes = NULL, *path;
	size_t len = 0;

	path = ckfs_arena_printf(&m->arena, "%s/.metadata", m->src_dir);
	if (!path)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_model_read_meta(m, path, CKFS_MAX_METADATA_BYTES, &bytes, &len, err));
	enum ckfs_code rc = ckfs_dcp_build_from(m, opt, bytes, len, err);
	free(bytes);
	return rc;
}

enum ckfs_code ckfs_dcp_read_raw(struct ckfs_model *m, struct ckfs_dcp_raw *raw,
				 const struct ckfs_model_options *opt,
				 struct ckfs_error *err)
{
	struct dcp d = { .m = m, .dir = raw->dir, .rel_dir = raw->rel_dir, .keep = raw->keep,
			 .raw = true };
	char *bytes = NULL;
	size_t len = 0;

	ckfs_arena_init(&d.tmp);
	d.md_path = ckfs_arena_printf(&m->arena, "%s/.metadata", raw->dir);
	enum ckfs_code rc = d.md_path ? ckfs_model_read_meta(m, d.md_path, CKFS_MAX_METADATA_BYTES,
							     &bytes, &len, err)
				      : ckfs_nomem(err);
	if (rc == CKFS_OK)
		rc = build(&d, bytes, len, opt, err);
	free(bytes);
	ckfs_arena_release(&d.tmp);
	raw->n_left_out = d.n_left_out;
	raw->n_bytes = d.n_bytes;
	return rc;
}

static int dcp_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	char path[4096];

	(void)pol;
	return (size_t)snprintf(path, sizeof(path), "%s/.metadata", dir) < sizeof(path) &&
	       ckfs_path_exists(path);
}

const struct ckfs_layout ckfs_layout_dcp = {
	.name = "dcp",
	.what = "a torch.distributed.checkpoint folder",
	.looks_for = ".metadata",
	.detect = dcp_detect,
	.build = dcp_build,
	.describe = ckfs_facts_saved_by,
	.flags = CKFS_LAYOUT_HELD_NAMES,
};
