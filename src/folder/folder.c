/* SPDX-License-Identifier: MIT */
/*
 * The served Hugging Face folder (include/ckfs/folder.h): weight files from
 * the safetensors layout, config.json re-rendered (config_json.c), the
 * shard index when there is one, side files from huggingface/ passed
 * through untouched, and a LoRA actor's adapter in lora_adapter/
 * (adapter_model.safetensors, adapter_config.json: adapter.c). Training
 * artifacts never appear: only the checkpoint's huggingface/ folder
 * contributes side files, and weight-like files there (*.safetensors,
 * *.bin, *.pt, *.pth, their indexes) are skipped because the folder's
 * weights are the merged ones.
 */
#include "ckfs/folder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_weight_like(const char *name)
{
	static const char *const suffixes[] = { ".safetensors", ".bin", ".pt", ".pth",
						".safetensors.index.json",
						".bin.index.json", ".gguf" };
	size_t n = strlen(name);

	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		size_t k = strlen(suffixes[i]);
		if (n >= k && strcmp(name + n - k, suffixes[i]) == 0)
			return 1;
	}
	return 0;
}

/* Files a training run writes beside the model in the same folder (the
 * Hugging Face Trainer's checkpoint-N/ with DeepSpeed), not part of it:
 * their state, DeepSpeed's tag file and conversion scripts. Weight-like
 * ones (optimizer.pt, rng_state_*.pth, training_args.bin) are skipped
 * above. */
static int is_training_artifact(const char *name)
{
	static const char *const names[] = { "latest", "trainer_state.json",
					     "zero_to_fp32.py", "zero_to_torch.py" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i]) == 0)
			return 1;
	return 0;
}

static int ts_newer(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* The dtype config.json should announce: the output dtype, or with
 * --dtype auto the stored dtype of the first floating tensor; with
 * a quantizing --dtype (fp8, w4a16, nvfp4), bf16, the dtype of what is
 * not quantized. */
static const char *config_dtype(const struct ckfs_model *m)
{
	if (m->view && m->view->quantizes)
		return "bfloat16";
	for (size_t i = 0; i < m->n_tensors; i++)
		if (ckfs_dtype_is_float(m->tensors[i].out_dtype))
			return ckfs_dtype_torch_name(m->tensors[i].out_dtype);
	return m->n_tensors ? ckfs_dtype_torch_name(m->tensors[0].out_dtype) : "float32";
}

/* Room for every node: the weight files and the index, config.json, the
 * adapter's three, and the side files. */
#define MAX_NODES 4096

/* A new node named name (an arena string of f), zeroed but for its name
 * and kind; NULL with err set when the folder is full. */
static struct ckfs_node *add_node(struct ckfs_folder *f, const char *name,
				  enum ckfs_node_kind kind, struct ckfs_error *err)
{
	if (f->n_nodes == MAX_NODES) {
		ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %d files to serve",
			  f->model->src_dir, MAX_NODES);
		return NULL;
	}
	struct ckfs_node *n = &f->nodes[f->n_nodes++];
	memset(n, 0, sizeof(*n));
	n->name = name;
	n->kind = kind;
	n->src.f = CKFS_FILE_NONE;
	return n;
}

static enum ckfs_code add_side_files(struct ckfs_folder *f, struct ckfs_error *err)
{
	const struct ckfs_model *m = f->model;
	struct ckfs_dir *d;
	const char *name;
	bool is_dir;

	if (!m->hf_dir)
		return CKFS_OK;
	d = ckfs_opendir(m->hf_dir);
	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot open folder", m->hf_dir);
	while ((name = ckfs_readdir(d, &is_dir))) {
		if (name[0] == '.' || strcmp(name, "config.json") == 0 ||
		    is_weight_like(name) || is_training_artifact(name))
			continue;
		char *path = ckfs_arena_printf(&f->arena, "%s/%s", m->hf_dir, name);
		if (!path) {
			ckfs_closedir(d);
			return ckfs_nomem(err);
		}
		/* The symlink policy before anything else; then only regular
		 * files are side files (folders, FIFOs, devices are skipped
		 * without being opened). */
		enum ckfs_code rc = ckfs_file_check_policy(&m->policy, path, err);
		struct stat st;
		if (rc == CKFS_OK && ckfs_stat(path, &st) == 0 && !S_ISREG(st.st_mode))
			continue; /* (a failing stat is reported by the open) */
		struct ckfs_node *n = NULL;
		const char *copy = rc == CKFS_OK ? ckfs_arena_strdup(&f->arena, name) : NULL;
		if (rc == CKFS_OK && !copy)
			rc = ckfs_nomem(err);
		if (rc == CKFS_OK && !(n = add_node(f, copy, CKFS_NODE_PASSTHROUGH, err)))
			rc = err->code;
		if (rc == CKFS_OK && (rc = ckfs_source_open(&n->src, &m->policy, path, n->name,
							    err)) != CKFS_OK)
			f->n_nodes--; /* the cleanup never sees a half-made node */
		if (rc != CKFS_OK) {
			ckfs_closedir(d);
			return rc;
		}
		n->size = n->src.size;
		if (ts_newer(n->src.mtime, f->mtime))
			f->mtime = n->src.mtime;
	}
	ckfs_closedir(d);
	return CKFS_OK;
}

/* The weight files of l, in folder dir ("" for the top). */
static enum ckfs_code add_weights(struct ckfs_folder *f, const struct ckfs_st_layout *l,
				  const char *dir, struct ckfs_error *err)
{
	for (size_t i = 0; i < l->n_files; i++) {
		const char *name = ckfs_arena_printf(&f->arena, "%s%s", dir, l->files[i].name);
		struct ckfs_node *n = name ? add_node(f, name, CKFS_NODE_WEIGHTS, err) : NULL;
		if (!name)
			return ckfs_nomem(err);
		if (!n)
			return err->code;
		n->size = l->files[i].size;
		n->st = &l->files[i];
	}
	return CKFS_OK;
}

/* A rendered file; text (malloc'd, len bytes) is taken over. */
static enum ckfs_code add_rendered(struct ckfs_folder *f, const char *name, char *text,
				   size_t len, const struct ckfs_file_access *from,
				   const struct ckfs_st_layout *from_weights,
				   struct ckfs_error *err)
{
	const char *data = ckfs_arena_strndup(&f->arena, text, len);
	struct ckfs_node *n = data ? add_node(f, name, CKFS_NODE_RENDERED, err) : NULL;

	free(text);
	if (!data)
		return ckfs_nomem(err);
	if (!n)
		return err->code;
	n->data = data;
	n->size = len;
	n->from = from;
	n->from_weights = from_weights;
	return CKFS_OK;
}

/* The model's weights, their index, config.json and the side files. */
static enum ckfs_code add_model(struct ckfs_folder *f, const struct ckfs_folder_options *opt,
				struct ckfs_error *err)
{
	const struct ckfs_model *m = f->model;
	char *text;
	size_t len;

	CKFS_TRY(ckfs_st_layout_build(m, opt->max_shard_size, &f->layout, err));
	CKFS_TRY(add_weights(f, &f->layout, "", err));
	if (f->layout.index_json) {
		char *index = strdup(f->layout.index_json);
		if (!index)
			return ckfs_nomem(err);
		CKFS_TRY(add_rendered(f, "model.safetensors.index.json", index,
				      f->layout.index_len, NULL, &f->layout, err));
	}
	const struct ckfs_transformers_release *tr =
		opt->transformers ? opt->transformers : ckfs_transformers_release(NULL);
	struct ckfs_config_edits e = { .dtype = config_dtype(m), .model_type = m->model_type,
				       .vl_drops_token_ids = tr->vl_drops_token_ids };
	struct ckfs_view_config vc = { 0 };
	if (m->view && m->view->config)
		CKFS_TRY(m->view->config(m, &vc, err));
	e.quantization = vc.quantization;
	e.drop_quantization = vc.drop_quantization;
	enum ckfs_code rc = ckfs_render_config(m->config_json, m->config_len, &e, &text, &len,
					       err);
	free(vc.quantization);
	if (rc != CKFS_OK) {
		ckfs_error_prefix(err, "'%s'", m->config_path);
		return err->code;
	}	CKFS_TRY(add_rendered(f, "config.json", text, len, &m->config_access, NULL, err));
	return add_side_files(f, err);
}

/* --format gguf: model.gguf alone, what llama.cpp and ollama load. */
static enum ckfs_code add_gguf(struct ckfs_folder *f, const struct ckfs_folder_options *opt,
			       struct ckfs_error *err)
{
	CKFS_TRY(ckfs_gguf_build(f->model, &opt->gguf_options, &f->gguf, err));
	struct ckfs_node *n = add_node(f, f->gguf.name, CKFS_NODE_WEIGHTS, err);
	if (!n)
		return err->code;
	n->size = f->gguf.size;
	n->gguf = &f->gguf;
	return CKFS_OK;
}

/* A LoRA actor's adapter as verl writes it: in dir ("lora_adapter/", or
 * "" for an adapter served alone). */
static enum ckfs_code add_adapter(struct ckfs_folder *f, const char *dir,
				  struct ckfs_error *err)
{
	const struct ckfs_lora *l = f->model->lora;
	const char *weights = ckfs_arena_printf(&f->arena, "%sadapter_model.safetensors", dir);
	const char *config = ckfs_arena_printf(&f->arena, "%sadapter_config.json", dir);
	char *text;
	size_t len;

	if (!weights || !config)
		return ckfs_nomem(err);
	if (dir[0]) {
		const char *name = ckfs_arena_strndup(&f->arena, dir, strlen(dir) - 1);
		if (!name)
			return ckfs_nomem(err);
		if (!add_node(f, name, CKFS_NODE_DIR, err))
			return err->code;
	}
	CKFS_TRY(ckfs_st_layout_single(l->tensors, l->n_tensors, "adapter_model.safetensors",
				       &f->adapter, err));
	CKFS_TRY(add_weights(f, &f->adapter, dir, err));
	CKFS_TRY(ckfs_render_adapter_config(l, &text, &len, err));
	return add_rendered(f, config, text, len, NULL, &f->adapter, err);
}

static int cmp_node(const void *a, const void *b)
{
	return strcmp(((const struct ckfs_node *)a)->name,
		      ((const struct ckfs_node *)b)->name);
}

static const struct ckfs_node *find_path(const struct ckfs_folder *f, const char *path,
					 size_t len)
{
	size_t lo = 0, hi = f->n_nodes;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const char *name = f->nodes[mid].name;
		int c = strncmp(path, name, len);
		if (c == 0)
			c = name[len] ? -1 : 0;
		if (c == 0)
			return &f->nodes[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/* Sorted by path, each node's last component and parent, and each
 * folder's list of what it holds (in name order: the paths share the
 * folder's prefix). */
static enum ckfs_code link_tree(struct ckfs_folder *f, struct ckfs_error *err)
{
	size_t *count = calloc(f->n_nodes + 1, sizeof(*count));

	if (!count)
		return ckfs_nomem(err);
	qsort(f->nodes, f->n_nodes, sizeof(*f->nodes), cmp_node);
	for (size_t i = 0; i < f->n_nodes; i++) {
		struct ckfs_node *n = &f->nodes[i];
		const char *slash = strrchr(n->name, '/');
		const struct ckfs_node *dir = slash ? find_path(f, n->name,
								(size_t)(slash - n->name)) : NULL;
		n->base = slash ? slash + 1 : n->name;
		n->parent = dir ? (size_t)(dir - f->nodes) + 1 : 0;
		count[n->parent]++;
	}
	size_t **lists = calloc(f->n_nodes + 1, sizeof(*lists));
	enum ckfs_code rc = lists ? CKFS_OK : ckfs_nomem(err);
	for (size_t p = 0; p <= f->n_nodes && rc == CKFS_OK; p++) {
		lists[p] = ckfs_arena_calloc(&f->arena, count[p] + 1, sizeof(**lists));
		if (!lists[p])
			rc = ckfs_nomem(err);
		count[p] = 0;
	}
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++)
		lists[f->nodes[i].parent][count[f->nodes[i].parent]++] = i;
	for (size_t i = 0; i < f->n_nodes && rc == CKFS_OK; i++) {
		f->nodes[i].children = lists[i + 1];
		f->nodes[i].n_children = count[i + 1];
	}
	if (rc == CKFS_OK) {
		f->top = lists[0];
		f->n_top = count[0];
	}
	free(lists);
	free(count);
	return rc;
}

enum ckfs_code ckfs_folder_build(const struct ckfs_model *m,
				 const struct ckfs_folder_options *opt,
				 struct ckfs_folder **out, struct ckfs_error *err)
{
	struct ckfs_folder *f = calloc(1, sizeof(*f));
	const struct ckfs_lora *l = m->lora;
	enum ckfs_code rc = CKFS_OK;

	if (!f)
		return ckfs_nomem(err);
	ckfs_arena_init(&f->arena);
	f->model = m;
	for (size_t i = 0; i < m->n_sources; i++)
		if (ts_newer(m->sources[i].mtime, f->mtime))
			f->mtime = m->sources[i].mtime;
	f->nodes = ckfs_arena_calloc(&f->arena, MAX_NODES, sizeof(*f->nodes));
	if (!f->nodes)
		rc = ckfs_nomem(err);
	/* An adapter saved alone is served as the adapter folder, what
	 * vLLM's --lora-modules takes; else the model, with the adapter in
	 * lora_adapter/ when it is served apart. */
	int adapter_alone = l && l->only && m->n_tensors == 0;
	if (rc == CKFS_OK && opt->gguf)
		rc = add_gguf(f, opt, err);
	else if (rc == CKFS_OK && !adapter_alone)
		rc = add_model(f, opt, err);
	if (rc == CKFS_OK && !opt->gguf && l && l->mode == CKFS_LORA_ADAPTER)
		rc = add_adapter(f, adapter_alone ? "" : "lora_adapter/", err);
	if (rc == CKFS_OK)
		rc = link_tree(f, err);
	if (rc != CKFS_OK) {
		ckfs_folder_free(f);
		return rc;
	}
	*out = f;
	return CKFS_OK;
}

const struct ckfs_node *ckfs_folder_lookup(const struct ckfs_folder *f,
					   const struct ckfs_node *dir, const char *name)
{
	const size_t *list = dir ? dir->children : f->top;
	size_t lo = 0, hi = dir ? dir->n_children : f->n_top;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(name, f->nodes[list[mid]].base);
		if (c == 0)
			return &f->nodes[list[mid]];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

void ckfs_folder_free(struct ckfs_folder *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind == CKFS_NODE_PASSTHROUGH)
			ckfs_file_close(&f->nodes[i].src.f);
	ckfs_st_layout_release(&f->layout);
	ckfs_st_layout_release(&f->adapter);
	ckfs_gguf_release(&f->gguf);
	ckfs_arena_release(&f->arena);
	free(f);
}

enum ckfs_code ckfs_folder_read(const struct ckfs_folder *f,
				const struct ckfs_node *n, uint64_t off,
				size_t len, void *buf, size_t *got,
				struct ckfs_read_scratch *scratch,
				struct ckfs_error *err)
{
	*got = 0;
	if (off >= n->size)
		return CKFS_OK;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	switch (n->kind) {
	case CKFS_NODE_WEIGHTS:
		if (n->gguf)
			CKFS_TRY(ckfs_gguf_read(f->model, n->gguf, off, len, buf, scratch, err));
		else
			CKFS_TRY(ckfs_st_file_read(f->model, n->st, off, len, buf, scratch, err));
		break;
	case CKFS_NODE_RENDERED:
		memcpy(buf, n->data + off, len);
		break;
	case CKFS_NODE_DIR:
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': a folder", n->name);
	case CKFS_NODE_PASSTHROUGH: {
		CKFS_TRY(ckfs_source_check(&n->src, err));
		ssize_t r = ckfs_file_pread(n->src.f, buf, len, off);
		if (r < 0)
			return ckfs_fail_errno(err, "'%s': read failed", n->src.path);
		if ((size_t)r < len)
			return ckfs_fail(err, CKFS_E_CHANGED,
					 "'%s': file shrank since it was opened", n->src.path);
		ckfs_source_note_read(len);
		CKFS_TRY(ckfs_source_check(&n->src, err));
		break;
	}
	}
	*got = len;
	return CKFS_OK;
}
