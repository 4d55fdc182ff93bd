/* SPDX-License-Identifier: MIT */
/*
 * The served Hugging Face folder (include/ckfs/folder.h): weight files from
 * the safetensors layout, config.json re-rendered with the output dtype,
 * the shard index when there is one, and side files from huggingface/
 * passed through untouched. Training artifacts never appear: only the
 * checkpoint's huggingface/ folder contributes side files, and weight-like
 * files there (*.safetensors, *.bin, *.pt, *.pth, their indexes) are
 * skipped because the folder's weights are the merged ones.
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

/* ---- config.json ---- */

/* Skip JSON whitespace. */
static size_t skip_ws(const char *s, size_t i, size_t n)
{
	while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

/* End of the JSON string starting at s[i] == '"'; n when unterminated. */
static size_t string_end(const char *s, size_t i, size_t n)
{
	for (i++; i < n; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return n;
}

/* End of the JSON value starting at s[i]: strings and nested containers
 * are skipped whole, scalars end at a delimiter. */
static size_t value_end(const char *s, size_t i, size_t n)
{
	int depth = 0;

	if (i < n && s[i] == '"')
		return string_end(s, i, n);
	for (; i < n; i++) {
		char c = s[i];
		if (c == '"') {
			i = string_end(s, i, n) - 1;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (depth == 0)
				return i;
			if (--depth == 0)
				return i + 1;
		} else if (depth == 0 && c == ',') {
			return i;
		}
	}
	return n;
}

enum ckfs_code ckfs_render_config(const char *s, size_t n, const char *dtype_name,
				  char **out, size_t *out_len, struct ckfs_error *err)
{
	/* Spans of top-level dtype string values to replace, in order. */
	size_t spans[8][2], n_spans = 0;
	size_t i = skip_ws(s, 0, n), open_brace;

	if (i >= n || s[i] != '{')
		return ckfs_fail(err, CKFS_E_FORMAT, "config.json is not a JSON object");
	open_brace = i++;
	while (1) {
		i = skip_ws(s, i, n);
		if (i < n && s[i] == '}')
			break;
		if (i >= n || s[i] != '"')
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: malformed key");
		size_t key_end = string_end(s, i, n);
		size_t klen = key_end - i - 2;
		const char *key = s + i + 1;
		i = skip_ws(s, key_end, n);
		if (i >= n || s[i] != ':')
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: missing ':'");
		i = skip_ws(s, i + 1, n);
		size_t vend = value_end(s, i, n);
		if (vend >= n)
			return ckfs_fail(err, CKFS_E_FORMAT, "config.json: truncated");
		/* The value is replaced whatever it holds (a string, null, a
		 * number): a second key beside it would make two JSON readers
		 * read two different files. */
		if (n_spans < 8 &&
		    ((klen == 11 && memcmp(key, "torch_dtype", 11) == 0) ||
		     (klen == 5 && memcmp(key, "dtype", 5) == 0))) {
			spans[n_spans][0] = i;
			spans[n_spans][1] = vend;
			n_spans++;
		}
		i = skip_ws(s, vend, n);
		if (i < n && s[i] == ',') {
			i++;
			continue;
		}
		if (i < n && s[i] == '}')
			break;
		return ckfs_fail(err, CKFS_E_FORMAT, "config.json: malformed object");
	}

	size_t dl = strlen(dtype_name);
	size_t cap = n + 64 + (n_spans + 1) * (dl + 2);
	char *o = malloc(cap + 1), *p = o;
	if (!o)
		return ckfs_nomem(err);
	size_t from = 0;
	if (n_spans == 0) {
		/* Add the field first, in the file's own indentation style. */
		memcpy(p, s, open_brace + 1);
		p += open_brace + 1;
		p += sprintf(p, "\n  \"torch_dtype\": \"%s\",", dtype_name);
		from = open_brace + 1;
	}
	for (size_t k = 0; k < n_spans; k++) {
		memcpy(p, s + from, spans[k][0] - from);
		p += spans[k][0] - from;
		p += sprintf(p, "\"%s\"", dtype_name);
		from = spans[k][1];
	}
	memcpy(p, s + from, n - from);
	p += n - from;
	*p = '\0';
	*out = o;
	*out_len = (size_t)(p - o);
	return CKFS_OK;
}

/* ---- folder ---- */

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

static int cmp_node(const void *a, const void *b)
{
	return strcmp(((const struct ckfs_node *)a)->name,
		      ((const struct ckfs_node *)b)->name);
}

static int ts_newer(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* The dtype config.json should announce: the output dtype, or with
 * --dtype auto the stored dtype of the first floating tensor. */
static const char *config_dtype(const struct ckfs_model *m)
{
	for (size_t i = 0; i < m->n_tensors; i++)
		if (ckfs_dtype_is_float(m->tensors[i].out_dtype))
			return ckfs_dtype_torch_name(m->tensors[i].out_dtype);
	return m->n_tensors ? ckfs_dtype_torch_name(m->tensors[0].out_dtype) : "float32";
}

static enum ckfs_code add_side_files(struct ckfs_folder *f, size_t *cap,
				     struct ckfs_error *err)
{
	const struct ckfs_model *m = f->model;
	DIR *d;
	struct dirent *de;

	if (!m->hf_dir)
		return CKFS_OK;
	d = opendir(m->hf_dir);
	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot open folder", m->hf_dir);
	while ((de = readdir(d))) {
		const char *name = de->d_name;
		if (name[0] == '.' || strcmp(name, "config.json") == 0 ||
		    is_weight_like(name))
			continue;
		char *path = ckfs_arena_printf(&f->arena, "%s/%s", m->hf_dir, name);
		if (!path) {
			closedir(d);
			return ckfs_nomem(err);
		}
		/* The symlink policy before anything else; then only regular
		 * files are side files (folders, FIFOs, devices are skipped
		 * without being opened). */
		enum ckfs_code rc = ckfs_file_check_policy(&m->policy, path, err);
		struct stat st;
		if (rc == CKFS_OK && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
			continue; /* (a failing stat is reported by the open) */
		if (rc == CKFS_OK && *cap == f->n_nodes)
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many files",
				       m->hf_dir);
		struct ckfs_node *n = &f->nodes[f->n_nodes];
		if (rc == CKFS_OK && !(n->name = ckfs_arena_strdup(&f->arena, name)))
			rc = ckfs_nomem(err);
		if (rc == CKFS_OK)
			rc = ckfs_source_open(&n->src, &m->policy, path, n->name, err);
		if (rc != CKFS_OK) {
			/* The node is not counted, so the folder's cleanup
			 * never sees a half-made one. */
			closedir(d);
			return rc;
		}
		n->kind = CKFS_NODE_PASSTHROUGH;
		n->size = n->src.size;
		f->n_nodes++;
		if (ts_newer(n->src.mtime, f->mtime))
			f->mtime = n->src.mtime;
	}
	closedir(d);
	return CKFS_OK;
}

enum ckfs_code ckfs_folder_build(const struct ckfs_model *m,
				 const struct ckfs_folder_options *opt,
				 struct ckfs_folder **out, struct ckfs_error *err)
{
	struct ckfs_folder *f = calloc(1, sizeof(*f));
	enum ckfs_code rc;
	size_t cap = 4096;

	if (!f)
		return ckfs_nomem(err);
	ckfs_arena_init(&f->arena);
	f->model = m;
	for (size_t i = 0; i < m->n_sources; i++)
		if (ts_newer(m->sources[i].mtime, f->mtime))
			f->mtime = m->sources[i].mtime;
	rc = ckfs_st_layout_build(m, opt->max_shard_size, &f->layout, err);
	if (rc != CKFS_OK)
		goto fail;
	f->nodes = ckfs_arena_calloc(&f->arena, cap, sizeof(*f->nodes));
	if (!f->nodes) {
		rc = ckfs_nomem(err);
		goto fail;
	}
	for (size_t i = 0; i < f->layout.n_files; i++) {
		struct ckfs_node *n = &f->nodes[f->n_nodes++];
		n->name = f->layout.files[i].name;
		n->kind = CKFS_NODE_WEIGHTS;
		n->size = f->layout.files[i].size;
		n->st = &f->layout.files[i];
		n->src.fd = -1;
	}
	if (f->layout.index_json) {
		struct ckfs_node *n = &f->nodes[f->n_nodes++];
		n->name = "model.safetensors.index.json";
		n->kind = CKFS_NODE_RENDERED;
		n->data = f->layout.index_json;
		n->size = f->layout.index_len;
		n->from = NULL;
		n->src.fd = -1;
	}
	char *cfg;
	size_t cfg_len;
	rc = ckfs_render_config(m->config_json, m->config_len, config_dtype(m), &cfg,
				&cfg_len, err);
	if (rc != CKFS_OK) {
		ckfs_error_prefix(err, "'%s'", m->config_path);
		goto fail;
	}
	struct ckfs_node *cn = &f->nodes[f->n_nodes++];
	cn->name = "config.json";
	cn->kind = CKFS_NODE_RENDERED;
	cn->data = ckfs_arena_strndup(&f->arena, cfg, cfg_len);
	cn->size = cfg_len;
	cn->from = &m->config_access;
	cn->src.fd = -1;
	free(cfg);
	if (!cn->data) {
		rc = ckfs_nomem(err);
		goto fail;
	}
	if ((rc = add_side_files(f, &cap, err)) != CKFS_OK)
		goto fail;
	qsort(f->nodes, f->n_nodes, sizeof(*f->nodes), cmp_node);
	*out = f;
	return CKFS_OK;
fail:
	ckfs_folder_free(f);
	return rc;
}

void ckfs_folder_free(struct ckfs_folder *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind == CKFS_NODE_PASSTHROUGH && f->nodes[i].src.fd >= 0)
			close(f->nodes[i].src.fd);
	ckfs_st_layout_release(&f->layout);
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
		CKFS_TRY(ckfs_st_file_read(f->model, n->st, off, len, buf, scratch, err));
		break;
	case CKFS_NODE_RENDERED:
		memcpy(buf, n->data + off, len);
		break;
	case CKFS_NODE_PASSTHROUGH: {
		size_t done = 0;
		CKFS_TRY(ckfs_source_check(&n->src, err));
		while (done < len) {
			ssize_t r = pread(n->src.fd, (char *)buf + done, len - done,
					  (off_t)(off + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return ckfs_fail_errno(err, "'%s': read failed", n->src.path);
			if (r == 0)
				return ckfs_fail(err, CKFS_E_CHANGED,
						 "'%s': file shrank since it was opened",
						 n->src.path);
			done += (size_t)r;
		}
		ckfs_source_note_read(len);
		CKFS_TRY(ckfs_source_check(&n->src, err));
		break;
	}
	}
	*got = len;
	return CKFS_OK;
}
