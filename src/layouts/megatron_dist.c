/* SPDX-License-Identifier: MIT */
/*
 * Megatron-Core dist_checkpointing folders in the torch_dist format, as verl
 * writes them (verl-checkpoints.md 3.1(c), 3.1(d), 3.2):
 *
 *   v1:    SRC/dist_ckpt/ + SRC/huggingface/config.json
 *   HEAD:  SRC/ckpt_contents.json naming contents.model = model/dist_ckpt
 *          (format megatron_dist_checkpoint) + SRC/model/huggingface/
 *   bare:  SRC is the dist_ckpt folder (config through --config)
 *
 * A dist_ckpt folder holds metadata.json ("sharded_backend": "torch_dist"),
 * common.pt and a plain DCP checkpoint (.metadata, __R_I.distcp): dcp.c
 * reads it into tensors named by Megatron *sharded keys* with their global
 * shapes and chunks (ckfs_dcp_read_raw). This file turns those into Hugging
 * Face tensors by geometry only: every output chunk is a box of a raw chunk
 * (a file offset moved by the box start times the strides), nothing is
 * copied or materialized.
 *
 * Sharded keys are TP- and PP-free: for homogeneous decoders a layer tensor
 * is one key "decoder.layers.<suffix>" with a prepended layer axis of size
 * num_hidden_layers (the chunk offset on it is the global layer); per-layer
 * keys "decoder.layers.<N>.<suffix>" are read too. Global layouts are those
 * of TP = 1: linear_qkv is num_key_value_heads groups [q r·d; k d; v d]
 * (split into q_proj / k_proj / v_proj, weight and bias); the SwiGLU
 * linear_fc1 is [gate; up] (apply_swiglu_sharded_factory), split in halves;
 * everything else is taken as is. Norms come from the local spec
 * (input_layernorm, pre_mlp_layernorm) or TE's fused layer_norm_weight keys
 * (Megatron maps the former to the latter when saving).
 *
 * Entries under "optimizer." are not read (verl's v1 dist_ckpt holds the
 * optimizer too); bytes entries (ShardedObjects: _extra_state, rng_state)
 * are skipped with a warning; any other key this table does not know is an
 * error listing them (value heads are not supported), or, with
 * --raw-names, served as stored under its sharded key (unknown_key).
 *
 * MoE (Qwen2-MoE, Qwen3-MoE, Mixtral): the router becomes mlp.gate (Mixtral:
 * block_sparse_moe.gate); grouped experts carry an expert axis after the
 * layer axis ("mlp.experts.experts.linear_fc1.weight" [L, E, 2F, H]), split
 * per expert into gate/up/down (Mixtral: experts.{e}.w1/w3/w2); Qwen2-MoE's
 * shared expert and its gate map to mlp.shared_expert.* and
 * mlp.shared_expert_gate.weight, DeepSeek's and GLM's (no gate) to
 * mlp.shared_experts.*. MLA and MTP layers as megatron_vocab.c names them
 * (docs/formats.md); per-layer keys when layers differ (dense first
 * ones). Expert parallelism leaves no trace in the sharded keys: it only
 * moves chunk offsets on the expert axis.
 * output_layer is dropped (with a warning) when config.json ties the
 * embeddings; untied configs need it. Checked against config.json: layer
 * axis = num_hidden_layers, head counts divide, qkv/fc1/embedding shapes.
 *
 * Which folder: a ckpt_contents.json with a contents.model entry is
 * followed (a megatron_dist_checkpoint at its path; any other format means
 * this layout does not apply and hf.c serves model/huggingface); otherwise
 * SRC/model/dist_ckpt, then SRC/dist_ckpt, then SRC itself (metadata.json
 * next to .metadata). A dist_ckpt is preferred to HF weights saved beside
 * it, as rank files are.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/json.h"
#include "ckfs/units.h"
#include "layouts/layouts.h"

#define PATHMAX 4096

/* ---- where the checkpoint is ---- */

struct where {
	char dist[PATHMAX];   /* the dist_ckpt folder */
	char rel[PATHMAX];    /* the same relative to SRC ("" for SRC) */
	char hf[PATHMAX];     /* config.json and side files */
	char bad[PATHMAX + 1024]; /* a manifest naming an unusable path */
	enum ckfs_code bad_code;  /* and its code (CKFS_E_INVALID when 0) */
};

/* A manifest path: relative, inside SRC, no "..", printable. */
static int safe_rel_path(const char *p)
{
	if (!p || !*p || *p == '/' || strlen(p) > 512)
		return 0;
	for (const char *s = p; *s; s++)
		if ((unsigned char)*s < 0x20)
			return 0;
	for (const char *s = p; (s = strstr(s, "..")); s += 2)
		if ((s == p || s[-1] == '/') && (s[2] == '/' || s[2] == 0))
			return 0;
	return 1;
}

static const char *json_str(cJSON *o, const char *a, const char *b)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
	if (b)
		v = cJSON_GetObjectItemCaseSensitive(v, b);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* 1: w filled (w->bad set when the manifest names a bad path); 0: not
 * this layout. The manifest is read under pol. */
static int locate(const char *src, const struct ckfs_file_policy *pol, struct where *w)
{
	char path[PATHMAX], *text = NULL;
	size_t len;
	struct ckfs_error err;

	memset(w, 0, sizeof(*w));
	ckfs_error_clear(&err);
	snprintf(path, sizeof(path), "%s/ckpt_contents.json", src);
	enum ckfs_code rc = ckfs_file_read_small(pol, path, CKFS_MAX_JSON_BYTES,
						 &text, &len, NULL, &err);
	if (rc != CKFS_OK && rc != CKFS_E_NOTFOUND) {
		snprintf(w->bad, sizeof(w->bad), "%s", err.msg);
		w->bad_code = rc;
		return 1; /* there, but not to be read */
	}
	if (rc == CKFS_OK) {
		cJSON *j;
		rc = ckfs_json_parse(path, text, len, &j, &err);
		free(text);
		if (rc != CKFS_OK) {
			/* verl's manifest, broken: refuse rather than guess. */
			snprintf(w->bad, sizeof(w->bad), "%s", err.msg);
			w->bad_code = rc;
			return 1;
		}
		cJSON *model = cJSON_GetObjectItemCaseSensitive(
			cJSON_GetObjectItemCaseSensitive(j, "contents"), "model");
		const char *fmt = json_str(model, "format", NULL);
		if (!fmt) {
			cJSON_Delete(j); /* unreadable or no model entry: by names */
			goto by_names;
		}
		if (strcmp(fmt, "megatron_dist_checkpoint") != 0) {
			cJSON_Delete(j);
			return 0; /* HF weights (mbridge): hf.c */
		}
		const char *rel = json_str(model, "path", NULL);
		const char *hf = json_str(cJSON_GetObjectItemCaseSensitive(j, "contents"),
					  "hf_config", "path");
		if (!safe_rel_path(rel))
			snprintf(w->bad, sizeof(w->bad), "'%s': contents.model.path %s%s%s "
				 "is not a relative path inside the checkpoint", path,
				 rel ? "'" : "(missing)", rel ? rel : "", rel ? "'" : "");
		else {
			snprintf(w->rel, sizeof(w->rel), "%s", rel);
			snprintf(w->dist, sizeof(w->dist), "%s/%s", src, rel);
			if (hf && safe_rel_path(hf))
				snprintf(w->hf, sizeof(w->hf), "%s/%s", src, hf);
			else {
				/* model/dist_ckpt -> model/huggingface */
				const char *slash = strrchr(rel, '/');
				snprintf(w->hf, sizeof(w->hf), "%s/%.*s%shuggingface", src,
					 slash ? (int)(slash - rel) : 0, rel, slash ? "/" : "");
			}
		}
		cJSON_Delete(j);
		return 1;
	}
by_names:;
	static const char *const subs[] = { "model/dist_ckpt", "dist_ckpt" };
	static const char *const hfs[] = { "model/huggingface", "huggingface" };
	for (size_t i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", src, subs[i]);
		if (ckfs_path_is_dir(path)) {
			snprintf(w->dist, sizeof(w->dist), "%s", path);
			snprintf(w->rel, sizeof(w->rel), "%s", subs[i]);
			snprintf(w->hf, sizeof(w->hf), "%s/%s", src, hfs[i]);
			return 1;
		}
	}
	snprintf(path, sizeof(path), "%s/metadata.json", src);
	if (ckfs_path_exists(path)) {
		snprintf(path, sizeof(path), "%s/.metadata", src);
		if (ckfs_path_exists(path)) {
			snprintf(w->dist, sizeof(w->dist), "%s", src);
			snprintf(w->hf, sizeof(w->hf), "%s/huggingface", src);
			return 1;
		}
	}
	return 0;
}

static int megatron_dist_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	struct where w;
	return locate(dir, pol, &w);
}

/* metadata.json must say torch_dist (zarr and other backends differ). */
static enum ckfs_code check_backend(struct ckfs_model *m, const struct where *w,
				    struct ckfs_error *err)
{
	char path[PATHMAX + 32], *text;
	size_t len;
	cJSON *j;

	snprintf(path, sizeof(path), "%s/metadata.json", w->dist);
	enum ckfs_code rc = ckfs_model_read_meta(m, path, CKFS_MAX_JSON_BYTES, &text, &len, err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (not a Megatron "
				 "dist_checkpointing folder, or an unfinished save)", path);
	}
	CKFS_TRY(rc);
	rc = ckfs_json_parse_object(path, text, len, &j, err);
	free(text);
	CKFS_TRY(rc);
	const char *be = json_str(j, "sharded_backend", NULL);
	if (!be || strcmp(be, "torch_dist") != 0)
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': sharded_backend %s%s%s is "
			       "not supported (only torch_dist)", path, be ? "'" : "(missing)",
			       be ? be : "", be ? "'" : "");
	cJSON_Delete(j);
	return rc;
}

/* ---- output tensors ---- */

enum { G_EMBED, G_LAYER, G_NORM, G_HEAD, G_RAW };

struct ctx {
	struct ckfs_model *m;
	const char *md;              /* .metadata path, for messages */
	struct ckfs_megatron_arch a;
	struct ckfs_outs outs;
	struct ckfs_megatron_unknown unknown;
	int dropped_head;
	bool raw_names;              /* --raw-names: serve unknown keys as stored */
	const struct ckfs_tensor *last_raw; /* served raw already */
	size_t n_raw;
	const struct ckfs_tensor *embed, *head; /* for the MTP layers' own copies */
	long n_mtp;                  /* MTP layers: 1 + the highest index seen */
};

static struct ckfs_out *new_out(struct ctx *c, const struct ckfs_out_spec *s,
				struct ckfs_error *err)
{
	return ckfs_outs_add(c->m, &c->outs, s, err);
}

/* n rows of a raw tensor from row `from`, to output rows from `to`. */
struct row_run {
	int64_t from, n, to;
};

/* Rows of r with its first nfix dims fixed at fix[] and dropped (the
 * layer axis when stacked, then an expert axis) -> o. */
static enum ckfs_code add_rows(struct ckfs_out *o, const struct ckfs_tensor *r, int nfix,
			       const int64_t *fix, struct row_run run, struct ckfs_error *err)
{
	struct ckfs_box box = { .lo = { 0 }, .ndrop = nfix };
	int64_t dst[CKFS_MAX_DIMS] = { 0 };

	memcpy(box.n, r->shape, sizeof(box.n));
	for (int k = 0; k < nfix; k++) {
		box.lo[k] = fix[k];
		box.n[k] = 1;
	}
	box.lo[nfix] = run.from;
	box.n[nfix] = run.n;
	dst[0] = run.to;
	return ckfs_chunks_box(&o->chunks, r, &box, dst, err);
}

/* Rows of layer `layer` (s = 1: r has a layer axis). */
static enum ckfs_code layer_rows(struct ckfs_out *o, const struct ckfs_tensor *r, int s, long layer,
				 struct row_run run, struct ckfs_error *err)
{
	int64_t fix[1] = { layer };
	return add_rows(o, r, s, fix, run, err);
}

/*
 * A key the table does not map: listed in the error, or with --raw-names
 * served as it is stored, its global tensor under its sharded key (a
 * stacked layer axis kept), once however many layers reach it.
 */
static enum ckfs_code unknown_key(struct ctx *c, const struct ckfs_tensor *r,
				  struct ckfs_error *err)
{
	struct ckfs_box box = { .lo = { 0 }, .ndrop = 0 };
	int64_t dst[CKFS_MAX_DIMS] = { 0 };

	if (!c->raw_names) {
		ckfs_megatron_unknown(&c->unknown, r->name);
		return CKFS_OK;
	}
	if (c->last_raw == r)
		return CKFS_OK;
	c->last_raw = r;
	c->n_raw++;
	struct ckfs_out_spec s = { .name = r->name, .placement = "raw", .group = G_RAW,
				   .dtype = r->stored_dtype, .ndim = r->ndim, .shape = r->shape };
	struct ckfs_out *o = new_out(c, &s, err);
	if (!o)
		return err->code;
	memcpy(box.n, r->shape, sizeof(box.n));
	return ckfs_chunks_box(&o->chunks, r, &box, dst, err);
}

/* ---- the mapping ---- */

/* The grouped experts' keys (an expert axis after the layer axis): dist_ckpt
 * only; the other layer keys are the shared vocabulary's. */
static const char expert_fc1_key[] = "mlp.experts.experts.linear_fc1.weight";
static const char expert_fc2_key[] = "mlp.experts.experts.linear_fc2.weight";

/* Slots every layer must fill: its attention (q k v weights and o, or
 * MLA's), the two norms, either the dense MLP (gate, up, down) or a router
 * (and every expert), and an MTP layer its own tensors. */
struct slot {
	int order;
	const char *what;
};
static const struct slot gqa_required[] = {
	{ 0, "self_attn.q_proj.weight" }, { 2, "self_attn.k_proj.weight" },
	{ 4, "self_attn.v_proj.weight" }, { 6, "self_attn.o_proj.weight" },
}, mla_required[] = {
	{ 0, "self_attn.q_a_proj.weight" }, { 1, "self_attn.q_a_layernorm.weight" },
	{ 2, "self_attn.q_b_proj.weight" }, { 3, "self_attn.kv_a_proj_with_mqa.weight" },
	{ 4, "self_attn.kv_a_layernorm.weight" }, { 5, "self_attn.kv_b_proj.weight" },
	{ 6, "self_attn.o_proj.weight" },
}, norm_required[] = {
	{ 14, "input_layernorm.weight" }, { 16, "post_attention_layernorm.weight" },
}, dense_required[] = {
	{ 10, "mlp.gate_proj.weight" }, { 11, "mlp.up_proj.weight" },
	{ 12, "mlp.down_proj.weight" },
}, mtp_required[] = {
	{ MG_ORDER_MTP + 1, "enorm.weight" }, { MG_ORDER_MTP + 2, "hnorm.weight" },
	{ MG_ORDER_MTP + 3, "eh_proj.weight" }, { MG_ORDER_MTP + 4, "shared_head.norm.weight" },
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The first slot of list[0..n) not in seen, or NULL. */
static const struct slot *missing(unsigned seen, const struct slot *list, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (!(seen & (1u << list[k].order)))
			return &list[k];
	return NULL;
}

static enum ckfs_code bad_shape(struct ctx *c, const struct ckfs_tensor *r,
				const char *want, struct ckfs_error *err)
{
	char got[256];
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has shape %s, expected %s "
			 "from '%s'", c->md, r->name, ckfs_format_dims(r->ndim, r->shape, "[", "]", got, sizeof(got)),
			 want, c->m->config_path);
}

/* One layer's slice of r (s = 1 when stacked) as the whole output. */
static enum ckfs_code map_whole(struct ctx *c, const struct ckfs_tensor *r, int s,
				long layer, const char *name, int order,
				struct ckfs_error *err)
{
	struct ckfs_out_spec spec = { .name = name, .placement = s ? "layer of stack" : "whole",
				      .group = G_LAYER, .layer = layer, .order = order,
				      .dtype = r->stored_dtype, .ndim = r->ndim - s,
				      .shape = r->shape + s };
	struct ckfs_out *o = new_out(c, &spec, err);
	if (!o)
		return err->code;
	if (r->ndim - s < 1)
		return bad_shape(c, r, "a tensor per layer", err);
	return layer_rows(o, r, s, layer, (struct row_run){ .n = r->shape[s] }, err);
}

static enum ckfs_code map_qkv(struct ctx *c, const struct ckfs_tensor *r, int s,
			      long layer, const struct ckfs_megatron_key *k,
			      struct ckfs_error *err)
{
	const struct ckfs_megatron_arch *a = &c->a;
	int64_t q = a->nh / a->nkv, d = a->head_dim, g_rows, rows;
	char name[CKFS_MAX_NAME], want[128];
	int is_w = strcmp(k->hf, "weight") == 0;

	if (__builtin_mul_overflow(q + 2, d, &g_rows) ||
	    __builtin_mul_overflow(a->nkv, g_rows, &rows))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': head counts and head_dim "
				 "overflow", c->m->config_path);
	if (r->ndim != s + 1 + is_w || r->shape[s] != rows ||
	    (is_w && r->shape[s + 1] != a->hidden)) {
		snprintf(want, sizeof(want), "%s[%lld%s] (%lld query groups of %lld q heads "
			 "+ k + v, head_dim %lld)", s ? "[layers, ...] with " : "",
			 (long long)rows, is_w ? ", hidden_size" : "",
			 (long long)a->nkv, (long long)q, (long long)d);
		return bad_shape(c, r, want, err);
	}
	size_t first = c->outs.n;
	for (int h = 0; h < 3; h++) {
		int64_t shape[2] = { (h == 0 ? a->nh : a->nkv) * d, a->hidden };
		ckfs_megatron_name(a, layer, k, h, name, sizeof(name));
		struct ckfs_out_spec spec = { .name = name, .placement = "rows of qkv",
					      .group = G_LAYER, .layer = layer,
					      .order = k->order + 2 * h, .dtype = r->stored_dtype,
					      .ndim = 1 + is_w, .shape = shape };
		if (!new_out(c, &spec, err))
			return err->code;
	}
	for (int64_t g = 0; g < a->nkv; g++) {
		int64_t base = g * g_rows;
		struct row_run q_rows = { .from = base, .n = q * d, .to = g * q * d };
		struct row_run k_rows = { .from = base + q * d, .n = d, .to = g * d };
		struct row_run v_rows = { .from = base + (q + 1) * d, .n = d, .to = g * d };
		CKFS_TRY(layer_rows(&c->outs.v[first], r, s, layer, q_rows, err));
		CKFS_TRY(layer_rows(&c->outs.v[first + 1], r, s, layer, k_rows, err));
		CKFS_TRY(layer_rows(&c->outs.v[first + 2], r, s, layer, v_rows, err));
	}
	return CKFS_OK;
}

/* SwiGLU fc1 [gate; up] of the dense MLP (mlp) or the shared expert
 * (mlp.shared_expert, k->part MG_SHARED_FC1) -> <module>.gate_proj /
 * up_proj. */
static enum ckfs_code map_fc1(struct ctx *c, const struct ckfs_tensor *r, int s,
			      long layer, const struct ckfs_megatron_key *k,
			      struct ckfs_error *err)
{
	int shared = k->part == MG_SHARED_FC1;
	int64_t ffn = shared ? c->a.shared_ffn : c->a.ffn;
	const char *ffn_key = shared ? "shared_expert_intermediate_size" : "intermediate_size";
	char name[CKFS_MAX_NAME], want[160];

	if (r->ndim != s + 2 || r->shape[s + 1] != c->a.hidden || r->shape[s] % 2 ||
	    (ffn > 0 && r->shape[s] != 2 * ffn)) {
		snprintf(want, sizeof(want), "%s[2 x %s %lld, hidden_size %lld] ([gate; up])",
			 s ? "[layers, ...] with " : "", ffn_key, (long long)ffn,
			 (long long)c->a.hidden);
		return bad_shape(c, r, want, err);
	}
	int64_t half = r->shape[s] / 2, shape[2] = { half, c->a.hidden };
	for (int h = 0; h < 2; h++) {
		ckfs_megatron_name(&c->a, layer, k, h, name, sizeof(name));
		struct ckfs_out_spec spec = { .name = name, .placement = "half of fc1",
					      .group = G_LAYER, .layer = layer, .order = k->order + h,
					      .dtype = r->stored_dtype, .ndim = 2, .shape = shape };
		struct ckfs_out *o = new_out(c, &spec, err);
		if (!o)
			return err->code;
		CKFS_TRY(layer_rows(o, r, s, layer, (struct row_run){ .from = h * half, .n = half },
				    err));
	}
	return CKFS_OK;
}

/* Grouped experts, an expert axis after the layer axis: fc1 [E, 2F, H]
 * -> experts.{e}.gate/up, fc2 [E, H, F] -> experts.{e}.down. */
static enum ckfs_code map_experts(struct ctx *c, const struct ckfs_tensor *r, int s,
				  long layer, int fc1, struct ckfs_error *err)
{
	const struct ckfs_megatron_arch *a = &c->a;
	int64_t rows = fc1 ? 2 * a->expert_ffn : a->hidden, cols = fc1 ? a->hidden : a->expert_ffn;
	char name[CKFS_MAX_NAME], want[200];

	if (a->n_experts <= 0 || a->expert_ffn <= 0 || r->ndim != s + 3 ||
	    r->shape[s] != a->n_experts || r->shape[s + 1] != rows || r->shape[s + 2] != cols) {
		snprintf(want, sizeof(want), "%s[num_experts %lld, %lld, %lld] (%s, expert "
			 "intermediate size %lld)", s ? "[layers, ...] with " : "",
			 (long long)a->n_experts, (long long)rows, (long long)cols,
			 fc1 ? "[gate; up] x hidden_size" : "hidden_size x intermediate",
			 (long long)a->expert_ffn);
		return bad_shape(c, r, want, err);
	}
	for (int64_t e = 0; e < a->n_experts; e++) {
		int64_t fix[2] = { layer, e };
		for (int h = fc1 ? 0 : 2; h < (fc1 ? 2 : 3); h++) {
			int64_t shape[2] = { h == 2 ? a->hidden : a->expert_ffn,
					     h == 2 ? a->expert_ffn : a->hidden };
			ckfs_megatron_expert_name(a, layer, e, h, name, sizeof(name));
			struct ckfs_out_spec spec = {
				.name = name,
				.placement = h == 2 ? "expert of stack" : "half of expert fc1",
				.group = G_LAYER, .layer = layer,
				.order = MG_ORDER_EXPERTS + (int)e * 3 + h,
				.dtype = r->stored_dtype, .ndim = 2, .shape = shape };
			struct ckfs_out *o = new_out(c, &spec, err);
			if (!o)
				return err->code;
			struct row_run run = { .from = h == 1 ? a->expert_ffn : 0, .n = shape[0] };
			CKFS_TRY(add_rows(o, r, s + 1, s ? fix : fix + 1, run, err));
		}
	}
	return CKFS_OK;
}

/* Embedding / output layer: [vocab_size, hidden_size] (an MTP layer's
 * copy: in its layer's group at its order). */
static enum ckfs_code map_vocab(struct ctx *c, const struct ckfs_tensor *r, const char *name,
				int group, long layer, int order, struct ckfs_error *err)
{
	char want[128];

	if (r->ndim != 2 || r->shape[1] != c->a.hidden ||
	    (c->a.vocab > 0 && r->shape[0] != c->a.vocab)) {
		snprintf(want, sizeof(want), "[vocab_size %lld, hidden_size %lld] (padded "
			 "vocabularies and value heads are not supported)",
			 (long long)c->a.vocab, (long long)c->a.hidden);
		return bad_shape(c, r, want, err);
	}
	struct ckfs_out_spec spec = { .name = name,
				      .placement = r->n_chunks > 1 ? "chunks(dim 0)" : "whole",
				      .group = group, .layer = layer, .order = order,
				      .dtype = r->stored_dtype, .ndim = 2, .shape = r->shape };
	struct ckfs_out *o = new_out(c, &spec, err);
	return o ? add_rows(o, r, 0, NULL, (struct row_run){ .n = r->shape[0] }, err) : err->code;
}

/* The router [E, H] (or its expert bias [E]). */
static enum ckfs_code map_router(struct ctx *c, const struct ckfs_tensor *r, int s,
				 long layer, const struct ckfs_megatron_key *k,
				 struct ckfs_error *err)
{
	char name[CKFS_MAX_NAME];
	int weight = k->order == MG_ORDER_ROUTER;

	if (c->a.n_experts <= 0 || r->ndim != s + 1 + weight || r->shape[s] != c->a.n_experts ||
	    (weight && r->shape[s + 1] != c->a.hidden)) {
		char hidden[48] = "";
		if (weight)
			snprintf(hidden, sizeof(hidden), ", hidden_size %lld", (long long)c->a.hidden);
		snprintf(name, sizeof(name), "%s[num_experts %lld%s] (num_experts, "
			 "num_local_experts or n_routed_experts)", s ? "[layers, ...] with " : "",
			 (long long)c->a.n_experts, hidden);
		return bad_shape(c, r, name, err);
	}
	ckfs_megatron_name(&c->a, layer, k, 0, name, sizeof(name));
	return map_whole(c, r, s, layer, name, k->order, err);
}

/* A column-parallel key, whole in the global tensor: its shape checked
 * against config.json (MLA's projections, MTP's eh_proj). */
static enum ckfs_code map_columns(struct ctx *c, const struct ckfs_tensor *r, int s, long layer,
				  const struct ckfs_megatron_key *k, const char *name,
				  struct ckfs_error *err)
{
	int64_t want[2];
	char buf[96];

	if (ckfs_megatron_global_shape(&c->a, k, want) &&
	    (r->ndim != s + 2 || r->shape[s] != want[0] || r->shape[s + 1] != want[1])) {
		snprintf(buf, sizeof(buf), "%s[%lld, %lld]", s ? "[layers, ...] with " : "",
			 (long long)want[0], (long long)want[1]);
		return bad_shape(c, r, buf, err);
	}
	return map_whole(c, r, s, layer, name, k->order, err);
}

/* Key k (the table's entry for r) of one layer. */
static enum ckfs_code map_entry(struct ctx *c, const struct ckfs_tensor *r, int s, long layer,
				const struct ckfs_megatron_key *k, struct ckfs_error *err)
{
	char name[CKFS_MAX_NAME];

	switch (k->part) {
	case MG_QKV:
		return map_qkv(c, r, s, layer, k, err);
	case MG_FC1:
	case MG_SHARED_FC1:
		return map_fc1(c, r, s, layer, k, err);
	case MG_ROUTER:
		return map_router(c, r, s, layer, k, err);
	default: /* whole: the TP merge is already in the global tensor */
		ckfs_megatron_name(&c->a, layer, k, 0, name, sizeof(name));
		if (k->part == MG_COL || k->part == MG_COL_OR_DUP)
			return map_columns(c, r, s, layer, k, name, err);
		return map_whole(c, r, s, layer, name, k->order, err);
	}
}

static enum ckfs_code map_layer(struct ctx *c, const struct ckfs_tensor *r, long layer,
				int stacked, const char *rest, struct ckfs_error *err)
{
	int s = stacked ? 1 : 0;

	if (strcmp(rest, expert_fc1_key) == 0 || strcmp(rest, expert_fc2_key) == 0)
		return map_experts(c, r, s, layer, strcmp(rest, expert_fc1_key) == 0, err);
	const struct ckfs_megatron_key *k = ckfs_megatron_layer_entry(&c->a, rest);
	return k ? map_entry(c, r, s, layer, k, err) : unknown_key(c, r, err);
}

/* "mtp.layers.<i>.*" (DeepSeek and GLM: their Hugging Face names): layer
 * num_hidden_layers + i. */
static enum ckfs_code map_mtp(struct ctx *c, const struct ckfs_tensor *r, long i,
			      const char *rest, int inner, struct ckfs_error *err)
{
	if (i >= CKFS_MEGATRON_MAX_MTP)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s': more than %d MTP layers",
				 c->md, r->name, CKFS_MEGATRON_MAX_MTP);
	if (i + 1 > c->n_mtp)
		c->n_mtp = i + 1;
	if (inner)
		return map_layer(c, r, c->a.n_layers + i, 0, rest, err);
	const struct ckfs_megatron_key *k = ckfs_megatron_mtp_entry(&c->a, rest);
	return k ? map_entry(c, r, 0, c->a.n_layers + i, k, err) : unknown_key(c, r, err);
}

/* Each MTP layer's embed_tokens and shared_head.head: the model's own
 * embedding and output layer (the embedding when tied), served twice. */
static enum ckfs_code map_mtp_shared(struct ctx *c, struct ckfs_error *err)
{
	const struct ckfs_tensor *head = c->head ? c->head : c->embed;
	char name[CKFS_MAX_NAME];

	for (long i = 0; i < c->n_mtp && c->embed && head; i++) {
		long l = c->a.n_layers + i;
		const struct ckfs_megatron_key *k = &ckfs_megatron_mtp_embed;
		ckfs_megatron_name(&c->a, l, k, 0, name, sizeof(name));
		CKFS_TRY(map_vocab(c, c->embed, name, G_LAYER, l, k->order, err));
		k = &ckfs_megatron_mtp_head;
		ckfs_megatron_name(&c->a, l, k, 0, name, sizeof(name));
		CKFS_TRY(map_vocab(c, head, name, G_LAYER, l, k->order, err));
	}
	return CKFS_OK;
}

static enum ckfs_code map_raw(struct ctx *c, const struct ckfs_tensor *r,
			      struct ckfs_error *err)
{
	const char *rest;
	long n;

	const char *top = ckfs_megatron_top_name(r->name);
	int inner;
	if (top && strcmp(top, "model.embed_tokens.weight") == 0) {
		c->embed = r;
		return map_vocab(c, r, top, G_EMBED, 0, 0, err);
	}
	if (top && strcmp(top, "lm_head.weight") == 0) {
		if (c->m->tie_word_embeddings) {
			c->dropped_head = 1;
			return CKFS_OK;
		}
		c->head = r;
		return map_vocab(c, r, top, G_HEAD, 0, 0, err);
	}
	if (top) { /* the final norm's weight or bias */
		struct ckfs_out_spec spec = { .name = top, .placement = "whole", .group = G_NORM,
					      .order = strcmp(top, "model.norm.bias") == 0,
					      .dtype = r->stored_dtype, .ndim = r->ndim,
					      .shape = r->shape };
		struct ckfs_out *o = new_out(c, &spec, err);
		if (!o)
			return err->code;
		if (r->ndim != 1 || r->shape[0] != c->a.hidden)
			return bad_shape(c, r, "[hidden_size]", err);
		return add_rows(o, r, 0, NULL, (struct row_run){ .n = r->shape[0] }, err);
	}
	if (c->a.deepseek_moe && ckfs_megatron_mtp_key(r->name, &n, &rest, &inner))
		return map_mtp(c, r, n, rest, inner, err);
	if (!ckfs_megatron_layer_key(r->name, &n, &rest))
		return unknown_key(c, r, err);
	if (n >= 0) {
		if (n >= c->a.n_layers)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is past the last "
					 "layer (config.json '%s' says num_hidden_layers %lld)",
					 c->md, r->name, c->m->config_path,
					 (long long)c->a.n_layers);
		return map_layer(c, r, n, 0, rest, err);
	}
	if (r->ndim < 1 || r->shape[0] != c->a.n_layers) {
		char got[256];
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has shape %s: a layer axis "
				 "of %lld, config.json '%s' says num_hidden_layers %lld", c->md,
				 r->name, ckfs_format_dims(r->ndim, r->shape, "[", "]", got, sizeof(got)),
				 r->ndim ? (long long)r->shape[0] : 0LL, c->m->config_path,
				 (long long)c->a.n_layers);
	}
	for (long l = 0; l < c->a.n_layers; l++) {
		size_t before = c->unknown.n, raw_before = c->n_raw;
		CKFS_TRY(map_layer(c, r, l, 1, rest, err));
		if (c->unknown.n != before || c->n_raw != raw_before)
			break; /* listed, or served whole, once: not per layer */
	}
	return CKFS_OK;
}

static int cmp_out(const void *x, const void *y)
{
	const struct ckfs_out *a = x, *b = y;

	if (a->group != b->group)
		return a->group < b->group ? -1 : 1;
	if (a->layer != b->layer)
		return a->layer < b->layer ? -1 : 1;
	if (a->order != b->order)
		return a->order < b->order ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* Not read at all: the optimizer states of verl's v1 dist_ckpt. */
static int keep_model(const char *fqn)
{
	return strncmp(fqn, "optimizer.", 10) != 0;
}

static enum ckfs_code finish(struct ctx *c, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;

	qsort(c->outs.v, c->outs.n, sizeof(*c->outs.v), cmp_out);
	for (size_t i = 1; i < c->outs.n; i++)
		if (strcmp(c->outs.v[i].name, c->outs.v[i - 1].name) == 0)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' comes from "
					 "two Megatron keys", c->md, c->outs.v[i].name);
	/* Every layer complete; embedding, final norm and (untied) head. */
	size_t i = 0;
	int have[3] = { 0 };
	while (i < c->outs.n && c->outs.v[i].group < G_LAYER)
		i++;
	for (long l = 0; l < c->a.n_layers + c->n_mtp; l++) {
		unsigned seen = 0;
		int64_t n_expert_outs = 0;
		for (; i < c->outs.n && c->outs.v[i].group == G_LAYER && c->outs.v[i].layer == l; i++) {
			if (c->outs.v[i].order < MG_ORDER_EXPERTS)
				seen |= 1u << c->outs.v[i].order;
			else
				n_expert_outs++;
		}
		int moe = (seen >> MG_ORDER_ROUTER) & 1;
		const struct slot *no =
			c->a.mla ? missing(seen, mla_required, N_OF(mla_required))
				 : missing(seen, gqa_required, N_OF(gqa_required));
		if (!no)
			no = missing(seen, norm_required, N_OF(norm_required));
		if (!no && !moe)
			no = missing(seen, dense_required, N_OF(dense_required));
		if (!no && l >= c->a.n_layers)
			no = missing(seen, mtp_required, N_OF(mtp_required));
		if (no)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': no %s for layer %ld "
					 "(an incomplete or non-GPT checkpoint?)", c->md, no->what, l);
		if (moe && n_expert_outs != 3 * c->a.n_experts)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': layer %ld has a router but "
					 "%lld of the %lld expert tensors (experts linear_fc1 and "
					 "linear_fc2)", c->md, l, (long long)n_expert_outs,
					 (long long)(3 * c->a.n_experts));
	}
	for (size_t k = 0; k < c->outs.n; k++) {
		have[0] |= c->outs.v[k].group == G_EMBED;
		have[1] |= c->outs.v[k].group == G_NORM;
		have[2] |= c->outs.v[k].group == G_HEAD;
	}
	if (!have[0] || !have[1])
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': no %s", c->md,
				 have[0] ? "decoder.final_layernorm.weight"
					 : "embedding.word_embeddings.weight");
	if (!have[2] && !c->m->tie_word_embeddings)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': no output_layer.weight, but "
				 "'%s' does not tie the embeddings (tie_word_embeddings)",
				 c->md, m->config_path);

	return ckfs_outs_to_model(m, &c->outs, c->md, err);
}

static enum ckfs_code megatron_dist_build(struct ckfs_model *m,
					  const struct ckfs_model_options *opt,
					  struct ckfs_error *err)
{
	struct where *w = calloc(1, sizeof(*w));
	struct ctx c;
	enum ckfs_code rc;
	struct ckfs_dcp_raw raw = { .keep = keep_model };

	memset(&c, 0, sizeof(c));
	c.m = m;
	c.raw_names = opt->raw_names;
	if (!w)
		return ckfs_nomem(err);
	if (!locate(m->src_dir, &m->policy, w)) {
		free(w);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no Megatron dist_ckpt folder",
				 m->src_dir);
	}
	if (w->bad[0]) {
		rc = ckfs_fail(err, w->bad_code ? w->bad_code : CKFS_E_INVALID, "%s", w->bad);
		goto out;
	}
	if (!ckfs_path_is_dir(w->dist)) {
		rc = ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (named by "
			       "ckpt_contents.json)", w->dist);
		goto out;
	}
	if ((rc = ckfs_file_check_policy(&m->policy, w->dist, err)) != CKFS_OK ||
	    (rc = check_backend(m, w, err)) != CKFS_OK)
		goto out;
	const char *hf = ckfs_arena_strdup(&m->arena, w->hf);
	c.md = ckfs_arena_printf(&m->arena, "%s/.metadata", w->dist);
	const char *dist = ckfs_arena_strdup(&m->arena, w->dist);
	if (!hf || !c.md || !dist) {
		rc = ckfs_nomem(err);
		goto out;
	}
	if ((rc = ckfs_model_load_config_from(m, hf, opt->config_path, err)) != CKFS_OK ||
	    (rc = ckfs_megatron_arch(m, &c.a, err)) != CKFS_OK)
		goto out;
	raw.dir = dist;
	raw.rel_dir = w->rel[0] ? w->rel : NULL;
	rc = ckfs_dcp_read_raw(m, &raw, opt, err);
	if (rc != CKFS_OK)
		goto out;
	for (size_t i = 0; i < m->n_tensors && rc == CKFS_OK; i++)
		rc = map_raw(&c, &m->tensors[i], err);
	if (rc == CKFS_OK)
		rc = map_mtp_shared(&c, err);
	if (rc == CKFS_OK)
		rc = ckfs_megatron_check_mtp(m, &c.a, c.n_mtp, c.md, err);
	if (rc != CKFS_OK)
		goto out;
	if ((rc = ckfs_megatron_unknown_fail(&c.unknown, c.md, err)) != CKFS_OK)
		goto out;
	if ((rc = finish(&c, err)) != CKFS_OK)
		goto out;
	if (c.dropped_head)
		rc = ckfs_megatron_warn_tied(m, err);
	if (rc == CKFS_OK && raw.n_bytes)
		rc = ckfs_model_warn(m, err, "skipped %zu non-tensor entries (ShardedObjects: "
				     "_extra_state, rng_state)", raw.n_bytes);
	if (rc == CKFS_OK && raw.n_left_out)
		rc = ckfs_model_warn(m, err, "skipped %zu optimizer entries", raw.n_left_out);
	if (rc == CKFS_OK && c.n_raw)
		rc = ckfs_model_warn(m, err, "%zu Megatron keys without a Hugging Face name "
				     "served as stored (--raw-names)", c.n_raw);
out:
	ckfs_outs_release(&c.outs);
	free(w);
	return rc;
}

const struct ckfs_layout ckfs_layout_megatron_dist = {
	.name = "megatron-dist",
	.what = "a Megatron checkpoint",
	.looks_for = "dist_ckpt/",
	.detect = megatron_dist_detect,
	.build = megatron_dist_build,
	.describe = ckfs_facts_saved_by,
};
