/* SPDX-License-Identifier: MIT */
/*
 * torch.save files as metadata: zip directory + data.pkl, interpreted into
 * state-dict entries (include/ckfs/torch.h). This is the only module that
 * knows torch's object graphs (formats.md sections 2-4): the rebuild
 * functions, storage persistent ids, DTensor's _spec, DeviceMesh and
 * placements, ShardedTensor's local shards. It reads no tensor bytes; it
 * records where they are and checks that every view stays inside its
 * storage record. Class paths moved between torch releases, so classes are
 * matched by final name under any torch.distributed module. One door,
 * ckfs_torch_open, for every kind of root. A rank file read by rank 0's
 * template (no pickle run) is torch_like.c's; the offsets it may differ
 * at are noted here, by the decode that knows them.
 */
#include "ckfs/torch.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt/torch_int.h"

#define TORCH_MAX_DEPTH 32 /* rebuild calls nest 3-4 deep in practice */

static const char *vlabel(const struct ckfs_torch_file *tf)
{
	return tf->label ? tf->label : "?";
}

/* The BUILD state of an OBJECT or CALL node, or NULL. */
static const struct ckfs_pv *obj_state(const struct ckfs_pv *obj)
{
	return obj && obj->kind == CKFS_PV_OBJECT ? obj->u.obj.state
	       : obj && obj->kind == CKFS_PV_CALL ? obj->u.call.state : NULL;
}

/* Attribute of a pickled object: BUILD state as a dict, or the
 * (dict_or_None, slots_dict) pair Python >= 3.11 writes for slotted classes. */
static struct ckfs_pv *attr(const struct ckfs_pv *obj, const char *name)
{
	const struct ckfs_pv *st;

	if (!obj)
		return NULL;
	if (obj->kind == CKFS_PV_DICT)
		return ckfs_pv_dict_get(obj, name);
	st = obj_state(obj);
	if (!st)
		return NULL;
	if (st->kind == CKFS_PV_DICT)
		return ckfs_pv_dict_get(st, name);
	if (st->kind == CKFS_PV_TUPLE && st->u.seq.n == 2) {
		struct ckfs_pv *v = ckfs_pv_dict_get(st->u.seq.items[0], name);
		return v ? v : ckfs_pv_dict_get(st->u.seq.items[1], name);
	}
	return NULL;
}

static const struct ckfs_pv *obj_class(const struct ckfs_pv *obj)
{
	if (!obj)
		return NULL;
	if (obj->kind == CKFS_PV_OBJECT)
		return obj->u.obj.cls;
	if (obj->kind == CKFS_PV_CALL)
		return obj->u.call.fn;
	return NULL;
}

static int is_dist_class(const struct ckfs_pv *g, const char *name)
{
	return ckfs_pv_is_global_named(g, "torch.distributed", name);
}

static const struct ckfs_pv *tuple_item(const struct ckfs_pv *t, size_t i)
{
	if (!t || (t->kind != CKFS_PV_TUPLE && t->kind != CKFS_PV_LIST) ||
	    i >= t->u.seq.n)
		return NULL;
	return t->u.seq.items[i];
}

static int get_int(const struct ckfs_pv *v, int64_t *out)
{
	if (!v || (v->kind != CKFS_PV_INT && v->kind != CKFS_PV_BOOL))
		return 0;
	*out = v->u.i;
	return 1;
}

/* A tuple/list of non-negative ints into dims[]. */
static enum ckfs_code get_dims(const struct ckfs_pv *t, int64_t *dims, int *ndim,
			       const char *what, const char *key,
			       const struct ckfs_torch_file *tf,
			       struct ckfs_error *err)
{
	size_t n = ckfs_pv_seq_len(t);

	if (!t || (t->kind != CKFS_PV_TUPLE && t->kind != CKFS_PV_LIST))
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': %s of '%s' is not a tuple", vlabel(tf),
				 what, key);
	if (n > CKFS_MAX_DIMS)
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': '%s' has %zu dims (limit %d)",
				 vlabel(tf), key, n, CKFS_MAX_DIMS);
	for (size_t i = 0; i < n; i++) {
		if (!get_int(t->u.seq.items[i], &dims[i]) || dims[i] < 0)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': bad %s of '%s'", vlabel(tf),
					 what, key);
	}
	*ndim = (int)n;
	return CKFS_OK;
}

enum ckfs_code ckfs_view_check_bounds(const struct ckfs_tensor_view *v,
				      const char *what, struct ckfs_error *err)
{
	uint64_t last = (uint64_t)v->storage_offset, esize = ckfs_dtype_size(v->dtype);

	for (int k = 0; k < v->ndim; k++) {
		uint64_t step;
		if (v->shape[k] == 0)
			return CKFS_OK; /* no element is ever read */
		if (__builtin_mul_overflow((uint64_t)(v->shape[k] - 1),
					   (uint64_t)v->stride[k], &step) ||
		    __builtin_add_overflow(last, step, &last))
			goto out_of_range;
	}
	/* last is the largest element index; it must fit in the storage. */
	uint64_t end_bytes;
	if (__builtin_add_overflow(last, 1, &end_bytes) ||
	    __builtin_mul_overflow(end_bytes, esize, &end_bytes) ||
	    end_bytes > v->storage_bytes)
		goto out_of_range;
	return CKFS_OK;
out_of_range:
	return ckfs_fail(err, CKFS_E_FORMAT,
			 "%s: view reaches past the end of its storage "
			 "(%llu bytes)", what,
			 (unsigned long long)v->storage_bytes);
}

/* Resolve a storage persistent id ('storage', cls, key, location, numel). */
static enum ckfs_code decode_storage(struct ckfs_torch_file *tf,
				     const struct ckfs_pv *p, enum ckfs_dtype v3_dtype,
				     const char *key, struct ckfs_tensor_view *view,
				     struct ckfs_error *err)
{
	const struct ckfs_pv *pid, *cls, *skey;
	int64_t numel;

	if (!p || p->kind != CKFS_PV_PERSID)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': tensor '%s' has no storage reference",
				 vlabel(tf), key);
	pid = p->u.persid.pid;
	cls = tuple_item(pid, 1);
	skey = tuple_item(pid, 2);
	if (ckfs_pv_seq_len(pid) < 5 || !ckfs_pv_is_str(tuple_item(pid, 0), "storage") ||
	    !cls || cls->kind != CKFS_PV_GLOBAL || !skey ||
	    skey->kind != CKFS_PV_STR || !get_int(tuple_item(pid, 4), &numel) ||
	    numel < 0)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': malformed storage id for '%s'",
				 vlabel(tf), key);

	enum ckfs_dtype dt;
	uint64_t nbytes;
	if (strcmp(cls->u.global.name, "UntypedStorage") == 0) {
		dt = v3_dtype;
		nbytes = (uint64_t)numel; /* untyped storages count bytes */
	} else {
		dt = ckfs_dtype_from_storage_class(cls->u.global.name);
		if (dt == CKFS_DTYPE_INVALID)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' uses unsupported storage %s.%s",
					 vlabel(tf), key, cls->u.global.module,
					 cls->u.global.name);
		if (v3_dtype != CKFS_DTYPE_INVALID)
			dt = v3_dtype;
		if (__builtin_mul_overflow((uint64_t)numel,
					   (uint64_t)ckfs_dtype_size(dt), &nbytes))
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': storage size overflow for '%s'",
					 vlabel(tf), key);
	}
	if (dt == CKFS_DTYPE_INVALID)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': '%s' has an unsupported dtype",
				 vlabel(tf), key);

	const struct ckfs_zip_entry *e;
	CKFS_TRY(torch_storage_record(tf, skey->u.str.s, skey->u.str.len, nbytes, key, &e, err));
	view->dtype = dt;
	view->storage_pos = e->data_offset;
	view->storage_bytes = nbytes;
	view->storage_key = skey->u.str.s;
	view->storage_entry = e;
	return CKFS_OK;
}

/* tf's record data/<skey> in *out, checked to hold nbytes for key. */
enum ckfs_code torch_storage_record(const struct ckfs_torch_file *tf, const char *skey,
				    size_t skey_len, uint64_t nbytes, const char *key,
				    const struct ckfs_zip_entry **out, struct ckfs_error *err)
{
	char record[300];
	if (skey_len > 256)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': storage key too long",
				 vlabel(tf));
	memcpy(record, "data/", 5); /* no snprintf: once per storage, 37,000 a rank file */
	memcpy(record + 5, skey, skey_len);
	record[5 + skey_len] = '\0';
	const struct ckfs_zip_entry *e = ckfs_zip_find(&tf->zip, record);
	if (!e)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': storage record '%s' of '%s' is missing",
				 vlabel(tf), record, key);
	if (e->method != 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': storage record '%s' is compressed",
				 vlabel(tf), record);
	if (e->size < nbytes)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': storage record '%s' holds %llu bytes, "
				 "its id declares %llu",
				 vlabel(tf), record, (unsigned long long)e->size,
				 (unsigned long long)nbytes);
	*out = e;
	return CKFS_OK;
}

static enum ckfs_code decode_plain(struct ckfs_torch_file *tf,
				   const struct ckfs_pv *v, const char *key,
				   int depth, struct ckfs_tensor_view *view,
				   struct ckfs_error *err);

/* _rebuild_tensor / _v2 / _v3 argument tuples. */
static enum ckfs_code decode_rebuild(struct ckfs_torch_file *tf,
				     const char *fn, const struct ckfs_pv *args,
				     const char *key, struct ckfs_tensor_view *view,
				     struct ckfs_error *err)
{
	int v3 = strcmp(fn, "_rebuild_tensor_v3") == 0;
	enum ckfs_dtype v3_dtype = CKFS_DTYPE_INVALID;
	const struct ckfs_pv *meta = NULL;
	int ndim_stride = 0;

	if (ckfs_pv_seq_len(args) < 4)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': short %s call for '%s'", vlabel(tf), fn,
				 key);
	if (v3) {
		const struct ckfs_pv *dt = tuple_item(args, 6);
		if (!dt || dt->kind != CKFS_PV_GLOBAL ||
		    (v3_dtype = ckfs_dtype_from_torch_name(dt->u.global.name)) ==
			    CKFS_DTYPE_INVALID)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' has an unsupported dtype%s%s",
					 vlabel(tf), key, dt && dt->kind == CKFS_PV_GLOBAL ? " " : "",
					 dt && dt->kind == CKFS_PV_GLOBAL ? dt->u.global.name : "");
		meta = tuple_item(args, 7);
	} else if (strcmp(fn, "_rebuild_tensor_v2") == 0) {
		meta = tuple_item(args, 6);
	}
	CKFS_TRY(decode_storage(tf, tuple_item(args, 0), v3_dtype, key, view, err));
	if (!get_int(tuple_item(args, 1), &view->storage_offset) ||
	    view->storage_offset < 0)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad storage offset of '%s'", vlabel(tf), key);
	CKFS_TRY(get_dims(tuple_item(args, 2), view->shape, &view->ndim, "size",
			  key, tf, err));
	CKFS_TRY(get_dims(tuple_item(args, 3), view->stride, &ndim_stride,
			  "stride", key, tf, err));
	if (ndim_stride != view->ndim)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': size and stride of '%s' disagree",
				 vlabel(tf), key);
	if (meta && meta->kind == CKFS_PV_DICT) {
		const struct ckfs_pv *neg = ckfs_pv_dict_get(meta, "neg");
		const struct ckfs_pv *conj = ckfs_pv_dict_get(meta, "conj");
		if (conj && conj->kind == CKFS_PV_BOOL && conj->u.i)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' has the conj bit set",
					 vlabel(tf), key);
		view->neg = neg && neg->kind == CKFS_PV_BOOL && neg->u.i;
	}
	char what[CKFS_MAX_NAME + 64];
	snprintf(what, sizeof(what), "'%s': tensor '%s'", vlabel(tf), key);
	return ckfs_view_check_bounds(view, what, err);
}

static enum ckfs_code decode_plain(struct ckfs_torch_file *tf,
				   const struct ckfs_pv *v, const char *key,
				   int depth, struct ckfs_tensor_view *view,
				   struct ckfs_error *err)
{
	const struct ckfs_pv *fn, *args;

	if (depth > TORCH_MAX_DEPTH)
		return ckfs_fail(err, CKFS_E_LIMIT,
				 "'%s': '%s' nests rebuild calls too deeply",
				 vlabel(tf), key);
	if (!v || v->kind != CKFS_PV_CALL)
		goto unknown;
	fn = v->u.call.fn;
	args = v->u.call.args;
	if (!fn || fn->kind != CKFS_PV_GLOBAL)
		goto unknown;
	if (strcmp(fn->u.global.module, "torch._utils") == 0) {
		const char *name = fn->u.global.name;
		if (strcmp(name, "_rebuild_tensor") == 0 ||
		    strcmp(name, "_rebuild_tensor_v2") == 0 ||
		    strcmp(name, "_rebuild_tensor_v3") == 0)
			return decode_rebuild(tf, name, args, key, view, err);
		if (strcmp(name, "_rebuild_parameter") == 0 ||
		    strcmp(name, "_rebuild_parameter_with_state") == 0)
			return decode_plain(tf, tuple_item(args, 0), key,
					    depth + 1, view, err);
	}
	if (ckfs_pv_is_global(fn, "torch._tensor", "_rebuild_from_type_v2")) {
		/* A tensor subclass without special layout: rebuild the inner
		 * call (func, args) and ignore the subclass state. */
		struct ckfs_pv inner = { .kind = CKFS_PV_CALL };
		inner.u.call.fn = (struct ckfs_pv *)tuple_item(args, 0);
		inner.u.call.args = (struct ckfs_pv *)tuple_item(args, 2);
		return decode_plain(tf, &inner, key, depth + 1, view, err);
	}
unknown:
	/* Name the callee or the class with its module: "call os.system"
	 * says what the pickle asked for (nothing is ever called). */
	fn = v && v->kind == CKFS_PV_CALL ? v->u.call.fn
	     : v && v->kind == CKFS_PV_OBJECT ? v->u.obj.cls : NULL;
	if (fn && fn->kind != CKFS_PV_GLOBAL)
		fn = NULL;
	return ckfs_fail(err, CKFS_E_UNSUPPORTED,
			 "'%s': value of '%s' is not a supported tensor (%s%s%s%s%s)",
			 vlabel(tf), key, v ? ckfs_pv_kind_name(v->kind) : "nothing",
			 fn ? " " : "", fn ? fn->u.global.module : "", fn ? "." : "",
			 fn ? fn->u.global.name : "");
}

/* ---- what each torch release pickles ----
 *
 * The distributed classes changed between releases; every BUILD-state key
 * ckfs knows is listed here, by class, with the releases that write it
 * (docs/formats.md "torch releases"; a real file of each release is in
 * tests/fixtures/matrix). A key not listed is refused, naming it: a newer
 * torch may have changed what the known ones mean.
 */
static const char *const mesh_keys[] = {
	/* 2.4-2.9: the ranks as an n-d tensor (2.4-2.7 _dim_group_infos, 2.8 on
	 * _dim_group_names; 2.4 _parent_mesh) */
	"device_type", "mesh", "mesh_dim_names", "_flatten_mesh_list", "_parent_mesh",
	"_dim_group_infos",
	/* 2.10 on: a layout over a flat rank map (2.11 on _rank) */
	"_device_type", "_layout", "_rank_map", "_mesh_dim_names", "_root_mesh",
	"_flatten_mapping", "_flatten_rank_map", "_rank",
	/* 2.15: process-group rank order (not the mesh's) */
	"_preserve_rank_order",
	/* every release */
	"_thread_id", "_dim_group_names", "_coordinate_on_dim", "_hash", NULL
};
static const char *const mesh_layout_keys[] = { "shape", "stride", "axes", NULL };
static const char *const flat_layout_keys[] = { "shape", "stride", NULL };
static const char *const spec_keys[] = {
	"mesh", "placements", "tensor_meta", "_hash",
	"shard_order", /* 2.10 on */
	"use_strided_shard_as_shard_order", NULL /* 2.11 on */
};
static const char *const dtensor_keys[] = { "_local_tensor", "_spec", NULL };
static const char *const shard_keys[] = { "dim", NULL };
static const char *const strided_keys[] = { "dim", "split_factor", NULL };
static const char *const partial_keys[] = { "reduce_op", NULL };
static const char *const no_keys[] = { NULL };

/* Which torch releases a file can have been written by: each fact below
 * bounds the minor version 2.lo .. 2.hi, as the version matrix shows
 * (tests/fixtures/matrix, docs/formats.md "torch releases"). */
static const struct {
	const char *cls, *field;
	int lo, hi;
} dated_fields[] = {
	{ "DeviceMesh", "mesh", 0, 9 },              /* the rank tensor */
	{ "DeviceMesh", "_parent_mesh", 0, 4 },
	{ "DeviceMesh", "_dim_group_infos", 0, 7 },
	{ "DeviceMesh", "_dim_group_names", 8, 99 },
	{ "DeviceMesh", "_layout", 10, 99 },         /* a layout over _rank_map */
	{ "DeviceMesh", "_rank", 11, 99 },
	{ "DeviceMesh", "_preserve_rank_order", 15, 99 },
	{ "_MeshLayout", "shape", 10, 12 },          /* sizes and strides */
	{ "_MeshLayout", "axes", 13, 99 },           /* _FlatLayout per dim */
	{ "DTensorSpec", "shard_order", 10, 99 },
	{ "DTensorSpec", "use_strided_shard_as_shard_order", 11, 99 },
};

static void bound_writer(struct ckfs_torch_file *tf, int lo, int hi)
{
	if (lo > tf->writer_lo)
		tf->writer_lo = lo;
	if (hi < tf->writer_hi)
		tf->writer_hi = hi;
}

const char *ckfs_torch_writer(const struct ckfs_torch_file *tf, char *buf, size_t size)
{
	int lo = tf->writer_lo, hi = tf->writer_hi;

	if (lo > hi || (lo == 0 && hi == 99))
		return NULL;
	if (lo == hi)
		snprintf(buf, size, "torch 2.%d", lo);
	else if (hi == 99)
		snprintf(buf, size, "torch 2.%d or newer", lo);
	else if (lo == 0)
		snprintf(buf, size, "torch 2.%d or older", hi);
	else
		snprintf(buf, size, "torch 2.%d-2.%d", lo, hi);
	return buf;
}

/* Bound the releases tf can be from by the keys of a BUILD state. */
static void date_keys(struct ckfs_torch_file *tf, const struct ckfs_pv *st, const char *cls)
{
	for (size_t i = 0; st && st->kind == CKFS_PV_DICT && i < st->u.dict.n; i++)
		for (size_t j = 0; j < sizeof(dated_fields) / sizeof(dated_fields[0]); j++)
			if (strcmp(cls, dated_fields[j].cls) == 0 &&
			    ckfs_pv_is_str(st->u.dict.keys[i], dated_fields[j].field))
				bound_writer(tf, dated_fields[j].lo, dated_fields[j].hi);
}

/* Refuse a BUILD-state key of obj that `keys` does not list. */
static enum ckfs_code check_keys(struct ckfs_torch_file *tf, const struct ckfs_pv *obj,
				 const char *cls, const char *const *keys, const char *key,
				 struct ckfs_error *err)
{
	const struct ckfs_pv *st = obj_state(obj);

	if (st && st->kind == CKFS_PV_TUPLE && st->u.seq.n == 2) {
		/* (dict, slots): check both */
		CKFS_TRY(check_keys(tf, &(struct ckfs_pv){ .kind = CKFS_PV_OBJECT,
				    .u.obj.state = st->u.seq.items[0] }, cls, keys, key, err));
		st = st->u.seq.items[1];
	}
	if (!st || st->kind != CKFS_PV_DICT)
		return CKFS_OK;
	/* Dated first, so that a refusal can say it; from the file's first
	 * DTensor only (one release wrote them all; 37k DTensors a rank file
	 * in a frontier MoE actor need not each be dated again). */
	if (!tf->mesh_pv)
		date_keys(tf, st, cls);
	for (size_t i = 0; i < st->u.dict.n; i++) {
		const struct ckfs_pv *k = st->u.dict.keys[i];
		size_t j = 0;
		while (keys[j] && !ckfs_pv_is_str(k, keys[j]))
			j++;
		if (!keys[j]) {
			char when[64];
			const char *w = ckfs_torch_writer(tf, when, sizeof(when));
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' was written by a torch ckfs does not "
					 "know (%s field '%s'; the file looks like %s)",
					 vlabel(tf), key, cls,
					 k && k->kind == CKFS_PV_STR ? k->u.str.s : "?",
					 w ? w : "no release ckfs knows");
		}
	}
	return CKFS_OK;
}

static enum ckfs_code decode_placement(struct ckfs_torch_file *tf,
				       const struct ckfs_pv *p, const char *key,
				       struct ckfs_placement *out,
				       struct ckfs_error *err)
{
	const struct ckfs_pv *cls = obj_class(p);
	int64_t dim = 0, sf = 1;

	if (is_dist_class(cls, "Replicate")) {
		out->kind = CKFS_PLACE_REPLICATE;
		return check_keys(tf, p, "Replicate", no_keys, key, err);
	}
	if (is_dist_class(cls, "Partial") || is_dist_class(cls, "_Partial")) {
		out->kind = CKFS_PLACE_PARTIAL;
		return check_keys(tf, p, "Partial", partial_keys, key, err);
	}
	int strided = is_dist_class(cls, "_StridedShard");
	if (!strided && !is_dist_class(cls, "Shard"))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': '%s' has an unknown placement %s",
				 vlabel(tf), key,
				 cls && cls->kind == CKFS_PV_GLOBAL ? cls->u.global.name : "object");
	/* Dataclass state {'dim': d}, or a REDUCE with (dim,) args. */
	if (!get_int(attr(p, "dim"), &dim) &&
	    !(p->kind == CKFS_PV_CALL && get_int(tuple_item(p->u.call.args, 0), &dim)))
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': shard placement of '%s' has no dim",
				 vlabel(tf), key);
	if (strided && !get_int(attr(p, "split_factor"), &sf) &&
	    !(p->kind == CKFS_PV_CALL && get_int(tuple_item(p->u.call.args, 1), &sf)))
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': _StridedShard of '%s' has no split_factor",
				 vlabel(tf), key);
	if (dim < 0 || dim >= CKFS_MAX_DIMS || sf < 1)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': bad shard placement of '%s'", vlabel(tf), key);
	CKFS_TRY(check_keys(tf, p, strided ? "_StridedShard" : "Shard",
			    strided ? strided_keys : shard_keys, key, err));
	out->kind = strided ? CKFS_PLACE_STRIDED_SHARD : CKFS_PLACE_SHARD;
	out->dim = (int)dim;
	out->split_factor = sf;
	return CKFS_OK;
}

/* An int, or a nested tuple of ints, flattened in order into sizes[]. */
static int flatten_ints(const struct ckfs_pv *v, int64_t *out, int *n, int max, int depth)
{
	int64_t x;

	if (get_int(v, &x)) {
		if (*n >= max)
			return 0;
		out[(*n)++] = x;
		return 1;
	}
	if (depth > 4 || !v || (v->kind != CKFS_PV_TUPLE && v->kind != CKFS_PV_LIST))
		return 0;
	for (size_t i = 0; i < v->u.seq.n; i++)
		if (!flatten_ints(v->u.seq.items[i], out, n, max, depth + 1))
			return 0;
	return 1;
}

/* One mesh dim of a layout: its modes (size, stride), appended to the
 * rank-map view in order. torch orders the modes of a dim
 * lexicographically (the last fastest), as the view enumerates them. */
static enum ckfs_code add_mesh_dim(struct ckfs_torch_file *tf, const struct ckfs_pv *shape,
				   const struct ckfs_pv *stride, int dim, const char *key,
				   struct ckfs_dtensor_info *di, struct ckfs_error *err)
{
	int64_t sizes[CKFS_MAX_DIMS], strides[CKFS_MAX_DIMS];
	int ns = 0, nd = 0;
	struct ckfs_tensor_view *v = &di->mesh_tensor;

	if (!flatten_ints(shape, sizes, &ns, CKFS_MAX_DIMS, 0) ||
	    !flatten_ints(stride, strides, &nd, CKFS_MAX_DIMS, 0) || ns != nd)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': device mesh of '%s' has a malformed layout for dim %d",
				 vlabel(tf), key, dim);
	di->mesh_shape[dim] = 1;
	for (int i = 0; i < ns; i++) {
		if (sizes[i] < 1 || strides[i] < 0 || sizes[i] > CKFS_MAX_RANKS)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': device mesh of '%s' has a bad size or stride "
					 "in dim %d", vlabel(tf), key, dim);
		di->mesh_shape[dim] *= sizes[i];
		if (di->mesh_shape[dim] > CKFS_MAX_RANKS)
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': device mesh of '%s' is "
					 "too large", vlabel(tf), key);
		if (sizes[i] == 1)
			continue;
		if (v->ndim == CKFS_MAX_DIMS)
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': device mesh of '%s' has "
					 "too many layout modes", vlabel(tf), key);
		v->shape[v->ndim] = sizes[i];
		v->stride[v->ndim++] = strides[i];
	}
	return CKFS_OK;
}

/* A DeviceMesh of torch 2.10 on: _layout (2.10-2.12: shape and stride
 * tuples, one entry per mesh dim, nested for a flattened dim; 2.13 on:
 * axes, one _FlatLayout of shape and stride tuples per dim) indexes the
 * flat _rank_map. The mesh's ranks are the rank map viewed through the
 * layout, which is what di->mesh_tensor becomes. */
static enum ckfs_code decode_mesh_layout(struct ckfs_torch_file *tf, const struct ckfs_pv *mesh,
					 const char *key, struct ckfs_dtensor_info *di,
					 struct ckfs_error *err)
{
	const struct ckfs_pv *layout = attr(mesh, "_layout"), *rank_map = attr(mesh, "_rank_map");
	const struct ckfs_pv *axes = attr(layout, "axes");
	size_t n;

	if (!layout || !rank_map)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': device mesh of '%s' has neither a rank tensor nor "
				 "a layout and rank map", vlabel(tf), key);
	CKFS_TRY(check_keys(tf, layout, "_MeshLayout", mesh_layout_keys, key, err));
	CKFS_TRY(decode_plain(tf, rank_map, key, 0, &di->mesh_tensor, err));
	if (di->mesh_tensor.ndim != 1 || di->mesh_tensor.stride[0] != 1)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': device mesh rank map of '%s' "
				 "is not a flat contiguous tensor", vlabel(tf), key);
	di->mesh_tensor.ndim = 0;
	if (axes) {
		n = ckfs_pv_seq_len(axes);
	} else {
		n = ckfs_pv_seq_len(attr(layout, "shape"));
		if (n != ckfs_pv_seq_len(attr(layout, "stride")))
			n = 0;
	}
	if (n == 0 || n > CKFS_MAX_DIMS)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': device mesh of '%s' has a layout of %zu dims",
				 vlabel(tf), key, n);
	for (size_t i = 0; i < n; i++) {
		const struct ckfs_pv *shape, *stride;
		if (axes) {
			const struct ckfs_pv *ax = axes->u.seq.items[i];
			if (!ckfs_pv_is_global_named(obj_class(ax), "torch.distributed", "_FlatLayout"))
				return ckfs_fail(err, CKFS_E_UNSUPPORTED,
						 "'%s': device mesh of '%s' has a layout axis that "
						 "is not a _FlatLayout", vlabel(tf), key);
			CKFS_TRY(check_keys(tf, ax, "_FlatLayout", flat_layout_keys, key, err));
			shape = attr(ax, "shape");
			stride = attr(ax, "stride");
		} else {
			shape = attr(layout, "shape")->u.seq.items[i];
			stride = attr(layout, "stride")->u.seq.items[i];
		}
		CKFS_TRY(add_mesh_dim(tf, shape, stride, (int)i, key, di, err));
	}
	di->mesh_ndim = (int)n;
	di->have_mesh_tensor = true;
	char what[CKFS_MAX_NAME + 64];
	snprintf(what, sizeof(what), "'%s': device mesh layout of '%s'", vlabel(tf), key);
	return ckfs_view_check_bounds(&di->mesh_tensor, what, err);
}

/* The opcode offset of v, an int the tree reaches by one path only (the
 * mesh's state, itself reached once, holds it), or false. */
static bool int_once(const struct ckfs_pv *v, uint32_t *at)
{
	return v && (v->kind == CKFS_PV_INT || v->kind == CKFS_PV_BIGINT) &&
	       ckfs_pv_made_once(v, at);
}

static void add_span(struct ckfs_torch_file *tf, uint32_t at, int dim)
{
	if (tf->n_spans == tf->spans_cap) {
		size_t cap = tf->spans_cap ? 2 * tf->spans_cap : 64;
		struct ckfs_torch_span *v = realloc(tf->spans, cap * sizeof(*v));
		if (!v) {
			tf->spans_lost = true;
			return;
		}
		tf->spans = v;
		tf->spans_cap = cap;
	}
	tf->spans[tf->n_spans++] = (struct ckfs_torch_span){ .at = at, .dim = dim };
}

/* The state of obj, and the dicts in a (dict, slots) state, reached by
 * one path only. */
static bool state_once(const struct ckfs_pv *obj)
{
	const struct ckfs_pv *st = obj_state(obj);
	uint32_t at;
	bool once = ckfs_pv_made_once(st, &at);

	for (size_t i = 0; once && st->kind == CKFS_PV_TUPLE && i < st->u.seq.n; i++)
		once = st->u.seq.items[i]->kind != CKFS_PV_DICT ||
		       ckfs_pv_made_once(st->u.seq.items[i], &at);
	return once;
}

/* For a template: obj's state ints named in unread, which the decode
 * never reads, as spans (dim -1). */
static void note_unread(struct ckfs_torch_file *tf, const struct ckfs_pv *obj,
			const char *const *unread)
{
	uint32_t at;

	if (!tf->is_template || !state_once(obj))
		return;
	for (; *unread; unread++)
		if (int_once(attr(obj, *unread), &at))
			add_span(tf, at, SPAN_UNREAD_INT);
}

/* A template's record of the ints of its mesh that may differ from rank
 * to rank (struct ckfs_torch_span), kept only where the tree reaches each
 * by one path, the mesh's state (the mesh itself may be shared: it is
 * decoded once, and every DTensor copies its coordinate), so that
 * changing them changes nothing else in what the file decodes to. */
static void note_mesh_ints(struct ckfs_torch_file *tf, const struct ckfs_pv *mesh,
			   const struct ckfs_pv *coord, const struct ckfs_dtensor_info *di)
{
	static const char *const unread[] = { "_hash", "_thread_id", "_rank", NULL };
	uint32_t at[CKFS_MAX_DIMS];
	int d = 0;

	tf->n_meshes++;
	if (!state_once(mesh))
		return;
	if (di->have_coord && ckfs_pv_made_once(coord, &at[0]))
		while (d < di->mesh_ndim && int_once(coord->u.seq.items[d], &at[d]))
			d++;
	for (int i = 0; d == di->mesh_ndim && i < d; i++)
		add_span(tf, at[i], i);
	note_unread(tf, mesh, unread);
	/* process group names (torch 2.8 on), one per mesh dim */
	const struct ckfs_pv *names = attr(mesh, "_dim_group_names");
	uint32_t nat;
	if (!ckfs_pv_made_once(names, &nat))
		return;
	for (size_t i = 0; i < ckfs_pv_seq_len(names); i++)
		if (names->u.seq.items[i]->kind == CKFS_PV_STR &&
		    ckfs_pv_made_once(names->u.seq.items[i], &nat))
			add_span(tf, nat, SPAN_UNREAD_STR);
}

static enum ckfs_code decode_mesh(struct ckfs_torch_file *tf,
				  const struct ckfs_pv *mesh, const char *key,
				  struct ckfs_dtensor_info *di,
				  struct ckfs_error *err)
{
	const struct ckfs_pv *t = attr(mesh, "mesh"), *names, *coord;

	if (!is_dist_class(obj_class(mesh), "DeviceMesh"))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': the device mesh of '%s' is not a DeviceMesh", vlabel(tf), key);
	const struct ckfs_pv *layout = attr(mesh, "_layout");
	if (layout && layout->kind == CKFS_PV_OBJECT)
		date_keys(tf, layout->u.obj.state, "_MeshLayout");
	CKFS_TRY(check_keys(tf, mesh, "DeviceMesh", mesh_keys, key, err));
	if (t) {
		CKFS_TRY(decode_plain(tf, t, key, 0, &di->mesh_tensor, err));
		di->mesh_ndim = di->mesh_tensor.ndim;
		memcpy(di->mesh_shape, di->mesh_tensor.shape, sizeof(di->mesh_shape));
		di->have_mesh_tensor = true;
	} else {
		CKFS_TRY(decode_mesh_layout(tf, mesh, key, di, err));
	}
	names = attr(mesh, "mesh_dim_names");
	if (!names)
		names = attr(mesh, "_mesh_dim_names");
	for (size_t i = 0; i < ckfs_pv_seq_len(names) && i < CKFS_MAX_DIMS; i++) {
		const struct ckfs_pv *s = names->u.seq.items[i];
		di->mesh_dim_names[i] = s && s->kind == CKFS_PV_STR ? s->u.str.s : NULL;
	}
	coord = attr(mesh, "_coordinate_on_dim");
	if (coord && ckfs_pv_seq_len(coord) == (size_t)di->mesh_ndim) {
		di->have_coord = true;
		for (int i = 0; i < di->mesh_ndim; i++)
			if (!get_int(coord->u.seq.items[i], &di->coord[i]) ||
			    di->coord[i] < 0 || di->coord[i] >= di->mesh_shape[i])
				di->have_coord = false;
	}
	if (tf->is_template)
		note_mesh_ints(tf, mesh, coord, di);
	return CKFS_OK;
}

/* The order in which the mesh dims that shard tensor dim d are applied,
 * as the placements imply it: mesh dims ascending, except that a
 * _StridedShard(d, sf) was applied after the mesh dims whose sizes
 * multiply to sf (torch 2.10's rule for reading a shard order out of
 * _StridedShard placements: walk the mesh dims from the last, insert each
 * where the product of the sizes before it equals its split factor).
 * Returns the count, or -1 when no order gives those split factors. */
static int implied_order(const struct ckfs_dtensor_info *di, int d, int64_t *order)
{
	int n = 0;

	for (int m = di->mesh_ndim - 1; m >= 0; m--) {
		const struct ckfs_placement *p = &di->placements[m];
		if ((p->kind != CKFS_PLACE_SHARD && p->kind != CKFS_PLACE_STRIDED_SHARD) ||
		    p->dim != d)
			continue;
		int64_t sf = p->kind == CKFS_PLACE_STRIDED_SHARD ? p->split_factor : 1, acc = 1;
		int at = -1;
		for (int i = 0; i <= n && at < 0; i++) {
			if (acc == sf)
				at = i;
			else if (i < n)
				acc *= di->mesh_shape[order[i]];
		}
		if (at < 0)
			return -1;
		memmove(order + at + 1, order + at, sizeof(*order) * (size_t)(n - at));
		order[at] = m;
		n++;
	}
	return n;
}

/* DTensorSpec.shard_order (2.10 on): ShardOrderEntry(tensor_dim,
 * mesh_dims) for each sharded tensor dim, the order its mesh dims were
 * applied in. ckfs reads a tensor by its placements, so a stored order
 * must be the one they imply (2.10-2.14 store it for every DTensor;
 * 2.15 leaves it None when use_strided_shard_as_shard_order says the
 * _StridedShard placements are the order). Anything else is refused. */
static enum ckfs_code check_shard_order(struct ckfs_torch_file *tf, const struct ckfs_pv *spec,
					const struct ckfs_dtensor_info *di, const char *key,
					struct ckfs_error *err)
{
	const struct ckfs_pv *order = attr(spec, "shard_order");
	const struct ckfs_pv *as_order = attr(spec, "use_strided_shard_as_shard_order");
	int strided = 0;
	size_t e = 0;

	for (int m = 0; m < di->mesh_ndim; m++)
		strided |= di->placements[m].kind == CKFS_PLACE_STRIDED_SHARD;
	if (strided && as_order && as_order->kind == CKFS_PV_BOOL && !as_order->u.i)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': DTensor '%s' has _StridedShard placements that its "
				 "spec says are not a shard order", vlabel(tf), key);
	if (!order || order->kind == CKFS_PV_NONE)
		return CKFS_OK;
	for (int d = 0; d < di->ndim; d++) {
		int64_t want[CKFS_MAX_DIMS], got[CKFS_MAX_DIMS], td;
		int nw = implied_order(di, d, want), ng = 0;
		if (nw == 0)
			continue;
		const struct ckfs_pv *entry = tuple_item(order, e++);
		const struct ckfs_pv *args = entry && entry->kind == CKFS_PV_OBJECT ? entry->u.obj.args
					     : NULL;
		if (nw < 0 ||
		    !ckfs_pv_is_global_named(obj_class(entry), "torch.distributed", "ShardOrderEntry") ||
		    !get_int(tuple_item(args, 0), &td) || td != d ||
		    !flatten_ints(tuple_item(args, 1), got, &ng, CKFS_MAX_DIMS, 1) ||
		    ng != nw || memcmp(got, want, sizeof(int64_t) * (size_t)nw) != 0)
			goto refuse;
	}
	if (e == ckfs_pv_seq_len(order))
		return CKFS_OK;
refuse:
	return ckfs_fail(err, CKFS_E_UNSUPPORTED,
			 "'%s': DTensor '%s' has a shard order other than its placements imply",
			 vlabel(tf), key);
}

static enum ckfs_code decode_dtensor(struct ckfs_torch_file *tf,
				     const struct ckfs_pv *wrap_args,
				     const struct ckfs_pv *state, const char *key,
				     struct ckfs_sd_entry *out,
				     struct ckfs_error *err)
{
	struct ckfs_pv holder = { .kind = CKFS_PV_OBJECT };
	const struct ckfs_pv *local, *spec, *placements;
	struct ckfs_dtensor_info *di;

	holder.u.obj.state = (struct ckfs_pv *)state;
	local = attr(&holder, "_local_tensor");
	spec = attr(&holder, "_spec");
	if (!local || !spec)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': DTensor '%s' lacks _local_tensor or _spec",
				 vlabel(tf), key);
	di = ckfs_arena_alloc(&tf->arena, sizeof(*di));
	if (!di)
		return ckfs_nomem(err);
	CKFS_TRY(decode_plain(tf, local, key, 0, &out->local, err));

	/* Global shape: _rebuild_wrapper_subclass args (cls, dtype, size, ...),
	 * else the spec's tensor_meta (shape, stride, dtype). */
	const struct ckfs_pv *size = tuple_item(wrap_args, 2);
	if (!size) {
		const struct ckfs_pv *meta = attr(spec, "tensor_meta");
		if (meta && meta->kind == CKFS_PV_OBJECT)
			size = tuple_item(meta->u.obj.args, 0);
	}
	CKFS_TRY(check_keys(tf, &holder, "DTensor", dtensor_keys, key, err));
	if (!is_dist_class(obj_class(spec), "DTensorSpec"))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': the _spec of DTensor '%s' is not a DTensorSpec",
				 vlabel(tf), key);
	CKFS_TRY(check_keys(tf, spec, "DTensorSpec", spec_keys, key, err));
	static const char *const spec_unread[] = { "_hash", NULL };
	note_unread(tf, spec, spec_unread);
	const struct ckfs_pv *mesh = attr(spec, "mesh");
	if (mesh && mesh == tf->mesh_pv) {
		*di = *tf->mesh_di; /* the mesh fields; the rest is set below */
	} else {
		CKFS_TRY(decode_mesh(tf, mesh, key, di, err));
		tf->mesh_pv = mesh;
		tf->mesh_di = di;
	}
	CKFS_TRY(get_dims(size, di->global_shape, &di->ndim, "global size", key,
			  tf, err));
	placements = attr(spec, "placements");
	if (ckfs_pv_seq_len(placements) != (size_t)di->mesh_ndim)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': DTensor '%s' has %zu placements for a "
				 "%d-d mesh", vlabel(tf), key, ckfs_pv_seq_len(placements),
				 di->mesh_ndim);
	for (int i = 0; i < di->mesh_ndim; i++) {
		CKFS_TRY(decode_placement(tf, placements->u.seq.items[i], key,
					  &di->placements[i], err));
		if (di->placements[i].kind != CKFS_PLACE_REPLICATE &&
		    di->placements[i].kind != CKFS_PLACE_PARTIAL &&
		    di->placements[i].dim >= di->ndim)
			return ckfs_fail(err, CKFS_E_FORMAT,
					 "'%s': DTensor '%s' is sharded on dim %d "
					 "of a %d-d tensor", vlabel(tf), key,
					 di->placements[i].dim, di->ndim);
	}
	if (out->local.ndim != di->ndim)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': DTensor '%s' local and global ranks differ",
				 vlabel(tf), key);
	CKFS_TRY(check_shard_order(tf, spec, di, key, err));
	out->kind = CKFS_ENTRY_DTENSOR;
	out->dtensor = di;
	return CKFS_OK;
}

static enum ckfs_code decode_sharded(struct ckfs_torch_file *tf,
				     const struct ckfs_pv *wrap_args,
				     const struct ckfs_pv *state, const char *key,
				     struct ckfs_sd_entry *out,
				     struct ckfs_error *err)
{
	const struct ckfs_pv *shards = tuple_item(state, 0);
	const struct ckfs_pv *meta = tuple_item(state, 1);
	struct ckfs_sharded_info *si;
	int n;

	si = ckfs_arena_alloc(&tf->arena, sizeof(*si));
	if (!si)
		return ckfs_nomem(err);
	const struct ckfs_pv *size = tuple_item(wrap_args, 2);
	if (!size)
		size = attr(meta, "size");
	CKFS_TRY(get_dims(size, si->global_shape, &si->ndim, "global size", key,
			  tf, err));
	if (!shards || shards->kind != CKFS_PV_LIST)
		return ckfs_fail(err, CKFS_E_FORMAT,
				 "'%s': ShardedTensor '%s' has no local shard list",
				 vlabel(tf), key);
	if (shards->u.seq.n > 1)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': ShardedTensor '%s' has %zu local shards",
				 vlabel(tf), key, shards->u.seq.n);
	out->kind = CKFS_ENTRY_SHARDED;
	out->sharded = si;
	out->local.ndim = si->ndim;
	if (shards->u.seq.n == 0)
		return CKFS_OK;
	const struct ckfs_pv *shard = shards->u.seq.items[0];
	const struct ckfs_pv *smeta = attr(shard, "metadata");
	CKFS_TRY(decode_plain(tf, attr(shard, "tensor"), key, 0, &out->local, err));
	CKFS_TRY(get_dims(attr(smeta, "shard_offsets"), si->offsets, &n,
			  "shard offsets", key, tf, err));
	if (n != si->ndim)
		goto bad;
	CKFS_TRY(get_dims(attr(smeta, "shard_sizes"), si->sizes, &n,
			  "shard sizes", key, tf, err));
	if (n != si->ndim || out->local.ndim != si->ndim)
		goto bad;
	for (int k = 0; k < n; k++)
		if (si->sizes[k] != out->local.shape[k])
			goto bad;
	si->have_local = true;
	return CKFS_OK;
bad:
	return ckfs_fail(err, CKFS_E_FORMAT,
			 "'%s': ShardedTensor '%s' shard metadata disagrees with "
			 "its tensor", vlabel(tf), key);
}

enum ckfs_code ckfs_torch_decode_value(struct ckfs_torch_file *tf,
				       const struct ckfs_pv *v, const char *key,
				       struct ckfs_sd_entry *out,
				       struct ckfs_error *err)
{
	memset(out, 0, sizeof(*out));
	out->key = key;
	if (v && v->kind == CKFS_PV_CALL &&
	    ckfs_pv_is_global(v->u.call.fn, "torch._tensor", "_rebuild_from_type_v2")) {
		const struct ckfs_pv *args = v->u.call.args;
		const struct ckfs_pv *func = tuple_item(args, 0);
		const struct ckfs_pv *type = tuple_item(args, 1);
		const struct ckfs_pv *fargs = tuple_item(args, 2);
		const struct ckfs_pv *state = tuple_item(args, 3);
		int wrapper = ckfs_pv_is_global(func, "torch._utils",
						"_rebuild_wrapper_subclass");
		if (is_dist_class(type, "DTensor"))
			return decode_dtensor(tf, wrapper ? fargs : NULL, state,
					      key, out, err);
		if (is_dist_class(type, "ShardedTensor"))
			return decode_sharded(tf, wrapper ? fargs : NULL, state,
					      key, out, err);
		if (wrapper)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': '%s' is a tensor subclass %s.%s "
					 "without storage", vlabel(tf), key,
					 type && type->kind == CKFS_PV_GLOBAL ? type->u.global.module : "?",
					 type && type->kind == CKFS_PV_GLOBAL ? type->u.global.name : "?");
	}
	out->kind = CKFS_ENTRY_TENSOR;
	return decode_plain(tf, v, key, 0, &out->local, err);
}

static enum ckfs_code check_byteorder(struct ckfs_torch_file *tf,
				      struct ckfs_error *err)
{
	const struct ckfs_zip_entry *e = ckfs_zip_find(&tf->zip, "byteorder");
	void *buf = NULL;
	size_t len = 0;

	if (!e)
		return CKFS_OK; /* old writers: little-endian by default */
	CKFS_TRY(ckfs_zip_read_record(&tf->zip, e, 64, &buf, &len, err));
	int little = len >= 6 && memcmp(buf, "little", 6) == 0;
	free(buf);
	if (!little)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': big-endian torch.save files are not "
				 "supported", vlabel(tf));
	return CKFS_OK;
}

/* Where a torch.save zip lies in its file, and how it is opened. */
struct zip_at {
	struct ckfs_file f;
	uint64_t base, length;
	const struct ckfs_torch_open_opts *o;
};

/* data.pkl: its record, and its bytes once read (NULL: not read). */
struct pkl_read {
	const struct ckfs_zip_entry *rec;
	void *bytes;
	size_t len;
};

/* The zip at->f[base, base + length) checked, and its data.pkl: the
 * record in pkl, its bytes too when read (the caller frees them). On
 * failure tf is released. */
static enum ckfs_code open_zip(struct ckfs_torch_file *tf, const struct zip_at *at,
			       struct pkl_read *pkl, bool read, struct ckfs_error *err)
{
	const struct ckfs_torch_open_opts *o = at->o;
	enum ckfs_code rc;

	memset(tf, 0, sizeof(*tf));
	tf->label = o->label;
	tf->is_template = o->as_template;
	ckfs_arena_init(&tf->arena);
	if (o->spare)
		ckfs_arena_donate(&tf->arena, o->spare);
	rc = ckfs_zip_open_ex(&tf->zip, at->f, at->base, at->length, o->label,
			      o->derive_locals ? CKFS_ZIP_DERIVE_LOCALS : 0, err);
	if (rc != CKFS_OK) /* the arena holds the spare's blocks now */
		goto fail;
	pkl->rec = ckfs_zip_find(&tf->zip, "data.pkl");
	if (!pkl->rec) {
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': no data.pkl record (not a torch.save file)",
			       o->label);
		goto fail;
	}
	if ((rc = check_byteorder(tf, err)) != CKFS_OK)
		goto fail;
	tf->writer_hi = 99;
	/* .format_version: written from torch 2.7 on */
	tf->has_format_version = ckfs_zip_find(&tf->zip, ".format_version") != NULL;
	if (tf->has_format_version)
		bound_writer(tf, 7, 99);
	else
		bound_writer(tf, 0, 6);
	if (!read) /* the caller reads it */
		return CKFS_OK;
	rc = ckfs_zip_read_record(&tf->zip, pkl->rec, CKFS_MAX_METADATA_BYTES, &pkl->bytes,
				  &pkl->len, err);
	if (rc == CKFS_OK)
		return CKFS_OK;
fail:
	ckfs_torch_close(tf);
	return rc;
}

/* data.pkl's bytes run into tf->root; a template keeps them, else they
 * are freed. On failure tf is released. */
static enum ckfs_code load_pickle(struct ckfs_torch_file *tf, const struct pkl_read *pkl,
				  struct ckfs_error *err)
{
	bool keep = tf->is_template;
	char pkl_label[CKFS_MAX_NAME + 32];

	snprintf(pkl_label, sizeof(pkl_label), "%s: %s", tf->label, pkl->rec->name);
	enum ckfs_code rc = ckfs_pickle_load_ex(pkl->bytes, pkl->len, pkl_label, &tf->arena,
						keep ? CKFS_PICKLE_ORIGINS : 0, &tf->root, err);
	if (keep) {
		tf->pkl = pkl->bytes;
		tf->pkl_len = pkl->len;
	} else {
		free(pkl->bytes);
	}
	if (rc != CKFS_OK)
		ckfs_torch_close(tf);
	return rc;
}

/* A DCP item: the zip at [base, base + length) of f, its root decoded
 * as one plain tensor. */
static enum ckfs_code open_item(struct ckfs_torch_file *tf, struct ckfs_file f,
				const struct ckfs_torch_open_opts *o, struct ckfs_error *err)
{
	const struct zip_at at = { .f = f, .base = o->item.base, .length = o->item.length, .o = o };
	struct pkl_read pkl = { 0 };
	enum ckfs_code rc;

	CKFS_TRY(open_zip(tf, &at, &pkl, true, err));
	CKFS_TRY(load_pickle(tf, &pkl, err));
	rc = ckfs_torch_decode_value(tf, tf->root, o->item.key, o->item.out, err);
	if (rc == CKFS_OK && o->item.out->kind != CKFS_ENTRY_TENSOR)
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED,
			       "'%s': item of '%s' is not a plain tensor", o->label,
			       o->item.key);
	if (rc != CKFS_OK)
		ckfs_torch_close(tf);
	return rc;
}

/* The zip directory and data.pkl of a whole torch.save file; with a
 * template (o->like), the entries from it when the bytes allow. */
static enum ckfs_code open_file(struct ckfs_torch_file *tf, struct ckfs_file f,
				const struct ckfs_torch_open_opts *o, struct ckfs_error *err)
{
	int64_t size = ckfs_file_size(f);
	struct pkl_read pkl = { 0 };

	if (size < 0) {
		memset(tf, 0, sizeof(*tf));
		return ckfs_fail_errno(err, "'%s': cannot stat", o->label);
	}
	/* The metadata reads are small and scattered: a local zip header
	 * before every storage record, one every few MB of a large rank
	 * file. Kernel read-ahead around each would pull tensor bytes into
	 * the page cache for nothing (gigabytes for a 64-rank MoE actor), so
	 * it is off while they are read, and back for the data reads. */
	if (f.fd >= 0)
		(void)posix_fadvise(f.fd, 0, 0, POSIX_FADV_RANDOM);
	const struct zip_at at = { .f = f, .base = 0, .length = (uint64_t)size, .o = o };
	enum ckfs_code rc = open_zip(tf, &at, &pkl, !o->like, err);
	if (f.fd >= 0)
		(void)posix_fadvise(f.fd, 0, 0, POSIX_FADV_NORMAL);
	if (rc != CKFS_OK)
		return rc;
	if (o->like && torch_like_matches(o->like, tf, pkl.rec, o->coord)) {
		rc = torch_like_bind(tf, o->like, o->coord, err);
		if (rc != CKFS_OK)
			ckfs_torch_close(tf);
		return rc;
	}
	if (o->like) {
		rc = ckfs_zip_read_record(&tf->zip, pkl.rec, CKFS_MAX_METADATA_BYTES, &pkl.bytes,
					  &pkl.len, err);
		if (rc != CKFS_OK) {
			ckfs_torch_close(tf);
			return rc;
		}
	}
	return load_pickle(tf, &pkl, err);
}


/*
 * Decode the state dicts dicts[0..n) into tf->entries, in order, recording
 * where each dict's entries end in tf->part_end. Keys ending in
 * skip_suffix (when not NULL) are counted in tf->n_skipped, not decoded.
 */
static enum ckfs_code decode_dicts(struct ckfs_torch_file *tf,
				   const struct ckfs_pv *const *dicts, size_t n_dicts,
				   const char *label, const char *skip_suffix,
				   struct ckfs_error *err)
{
	size_t total = 0, n = 0;
	size_t sl = skip_suffix ? strlen(skip_suffix) : 0;

	for (size_t p = 0; p < n_dicts; p++)
		total += dicts[p]->u.dict.n;
	if (total > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many entries", label);
	tf->entries = ckfs_arena_calloc(&tf->arena, total + 1, sizeof(*tf->entries));
	tf->part_end = ckfs_arena_calloc(&tf->arena, n_dicts, sizeof(size_t));
	if (!tf->entries || !tf->part_end)
		return ckfs_nomem(err);
	for (size_t p = 0; p < n_dicts; p++) {
		const struct ckfs_pv *d = dicts[p];
		for (size_t i = 0; i < d->u.dict.n; i++) {
			const struct ckfs_pv *k = d->u.dict.keys[i];
			if (!k || k->kind != CKFS_PV_STR)
				return ckfs_fail(err, CKFS_E_FORMAT,
						 "'%s': key %zu of state dict %zu is "
						 "not a string", label, i, p);
			size_t kl = strlen(k->u.str.s);
			if (sl && kl >= sl && strcmp(k->u.str.s + kl - sl, skip_suffix) == 0) {
				tf->n_skipped++;
				continue;
			}
			CKFS_TRY(ckfs_torch_decode_value(tf, d->u.dict.vals[i], k->u.str.s,
							 &tf->entries[n], err));
			n++;
		}
		tf->part_end[p] = n;
	}
	tf->n_entries = n;
	tf->n_parts = n_dicts;
	return CKFS_OK;
}

/* A file whose data.pkl is one state dict. */
static enum ckfs_code open_state_dict(struct ckfs_torch_file *tf, struct ckfs_file f,
				      const struct ckfs_torch_open_opts *o,
				      struct ckfs_error *err)
{
	enum ckfs_code rc = open_file(tf, f, o, err);

	if (rc != CKFS_OK || tf->from_like)
		return rc;
	const struct ckfs_pv *root = tf->root;
	if (root->kind != CKFS_PV_DICT)
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': data.pkl holds a %s, not a state dict",
			       o->label, ckfs_pv_kind_name(root->kind));
	else
		rc = decode_dicts(tf, &root, 1, o->label, NULL, err);
	if (rc != CKFS_OK)
		ckfs_torch_close(tf);
	return rc;
}

/* A file whose data.pkl is a list of state dicts. */
static enum ckfs_code open_list(struct ckfs_torch_file *tf, struct ckfs_file f,
				const struct ckfs_torch_open_opts *o, struct ckfs_error *err)
{
	const char *label = o->label;
	enum ckfs_code rc = open_file(tf, f, o, err);

	if (rc != CKFS_OK)
		return rc;
	const struct ckfs_pv *root = tf->root;
	if (root->kind != CKFS_PV_LIST) {
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "'%s': data.pkl holds a %s, not a list of state dicts",
			       label, ckfs_pv_kind_name(root->kind));
		goto fail;
	}
	if (root->u.seq.n == 0 || root->u.seq.n > CKFS_MAX_TENSORS) {
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': list of %zu state dicts",
			       label, root->u.seq.n);
		goto fail;
	}
	for (size_t p = 0; p < root->u.seq.n; p++) {
		const struct ckfs_pv *d = root->u.seq.items[p];
		if (!d || d->kind != CKFS_PV_DICT) {
			rc = ckfs_fail(err, CKFS_E_FORMAT,
				       "'%s': list item %zu is a %s, not a state dict",
				       label, p, d ? ckfs_pv_kind_name(d->kind) : "null");
			goto fail;
		}
	}
	rc = decode_dicts(tf, (const struct ckfs_pv *const *)root->u.seq.items,
			  root->u.seq.n, label, o->skip_suffix, err);
	if (rc == CKFS_OK)
		return CKFS_OK;
fail:
	ckfs_torch_close(tf);
	return rc;
}

/* Options only some roots take: a template and its use, state dicts
 * only; a skipped suffix, lists only; an item's place, key and entry,
 * items only (and both of the last two given). */
static bool opts_fit(const struct ckfs_torch_open_opts *o)
{
	if (o->root != CKFS_TORCH_ROOT_DICT && (o->like || o->as_template))
		return false;
	if (o->root != CKFS_TORCH_ROOT_LIST && o->skip_suffix)
		return false;
	if (o->root == CKFS_TORCH_ROOT_ITEM)
		return o->item.key && o->item.out;
	return !o->item.base && !o->item.length && !o->item.key && !o->item.out;
}

enum ckfs_code ckfs_torch_open(struct ckfs_torch_file *tf, struct ckfs_file f,
			       const struct ckfs_torch_open_opts *o, struct ckfs_error *err)
{
	if (opts_fit(o)) {
		switch (o->root) {
		case CKFS_TORCH_ROOT_DICT: return open_state_dict(tf, f, o, err);
		case CKFS_TORCH_ROOT_LIST: return open_list(tf, f, o, err);
		case CKFS_TORCH_ROOT_TREE: return open_file(tf, f, o, err);
		case CKFS_TORCH_ROOT_ITEM: return open_item(tf, f, o, err);
		}
	}
	memset(tf, 0, sizeof(*tf));
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': torch.save open options that do not "
			 "go together", o->label ? o->label : "?");
}

void ckfs_torch_close_keep(struct ckfs_torch_file *tf, struct ckfs_arena *keep)
{
	if (keep)
		ckfs_arena_donate(keep, &tf->arena);
	ckfs_torch_close(tf);
}

void ckfs_torch_close(struct ckfs_torch_file *tf)
{
	free(tf->pkl);
	tf->pkl = NULL;
	free(tf->spans);
	tf->spans = NULL;
	tf->n_spans = tf->spans_cap = 0;
	ckfs_zip_release(&tf->zip);
	ckfs_arena_release(&tf->arena);
	tf->root = NULL;
	tf->entries = NULL;
	tf->n_entries = 0;
	tf->part_end = NULL;
	tf->n_parts = 0;
	tf->n_skipped = 0;
	tf->mesh_pv = NULL;
	tf->mesh_di = NULL;
	tf->from_like = false;
	tf->like = NULL;
	tf->recs = NULL;
}

void ckfs_placement_format(const struct ckfs_placement *p, char *buf, size_t size)
{
	switch (p->kind) {
	case CKFS_PLACE_REPLICATE: snprintf(buf, size, "Replicate()"); break;
	case CKFS_PLACE_PARTIAL: snprintf(buf, size, "Partial()"); break;
	case CKFS_PLACE_SHARD: snprintf(buf, size, "Shard(%d)", p->dim); break;
	case CKFS_PLACE_STRIDED_SHARD:
		snprintf(buf, size, "_StridedShard(%d, sf=%lld)", p->dim,
			 (long long)p->split_factor);
		break;
	}
}
