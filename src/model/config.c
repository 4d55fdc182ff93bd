/* SPDX-License-Identifier: MIT */
/*
 * Files around the tensors (src/model/model_int.h): the Hugging Face
 * config.json a model is served with, small JSON files read whole (with
 * who may read them, for the served modes), and the warnings a model
 * collects while it is opened.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/json.h"
#include "model/model_int.h"

enum ckfs_code ckfs_model_warn(struct ckfs_model *m, struct ckfs_error *err,
			       const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	const char **w = ckfs_arena_calloc(&m->arena, m->n_warnings + 1, sizeof(*w));
	char *copy = ckfs_arena_strdup(&m->arena, buf);
	if (!w || !copy)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	if (m->n_warnings)
		memcpy(w, m->warnings, m->n_warnings * sizeof(*w));
	w[m->n_warnings++] = copy;
	m->warnings = w;
	return CKFS_OK;
}

/* Read a small text file whole (NUL-terminated); who may read it into
 * *access when not NULL (path left to the caller). */
static enum ckfs_code read_small_file(const char *path, size_t max, char **out,
				      size_t *len, struct ckfs_file_access *access,
				      struct ckfs_error *err)
{
	/* O_NONBLOCK: a FIFO in place of the file must not block the open;
	 * it is refused as "not a regular file" below. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;

	if (fd < 0)
		return errno == ENOENT
			       ? ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", path)
			       : ckfs_fail_errno(err, "'%s': cannot open", path);
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not a regular file", path);
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': larger than %zu bytes",
				 path, max);
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	}
	size_t done = 0;
	while (done < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + done, (size_t)st.st_size - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(buf);
			close(fd);
			return ckfs_fail_errno(err, "'%s': read failed", path);
		}
		done += (size_t)r;
	}
	if (access) {
		access->mode = st.st_mode;
		access->uid = st.st_uid;
		access->gid = st.st_gid;
		access->acl = ckfs_fd_has_acl(fd);
	}
	close(fd);
	buf[done] = '\0';
	*out = buf;
	*len = done;
	return CKFS_OK;
}

enum ckfs_code ckfs_read_small_file(const char *path, size_t max, char **out,
				    size_t *len, struct ckfs_error *err)
{
	return read_small_file(path, max, out, len, NULL, err);
}

enum ckfs_code ckfs_model_read_meta(struct ckfs_model *m, const char *path, size_t max,
				    char **out, size_t *len, struct ckfs_error *err)
{
	struct ckfs_file_access access;
	struct ckfs_file_access *list;

	CKFS_TRY(read_small_file(path, max, out, len, &access, err));
	list = ckfs_arena_calloc(&m->arena, m->n_meta_files + 1, sizeof(*list));
	access.path = ckfs_arena_strdup(&m->arena, path);
	if (!list || !access.path) {
		free(*out);
		*out = NULL;
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	}
	list[m->n_meta_files] = access;
	if (m->n_meta_files)
		memcpy(list, m->meta_files, m->n_meta_files * sizeof(*list));
	m->meta_files = list;
	m->n_meta_files++;
	return CKFS_OK;
}

enum ckfs_code ckfs_json_parse_object(const char *path, const char *text, size_t len,
				      cJSON **out, struct ckfs_error *err)
{
	const char *end = NULL;
	bool oom;
	cJSON *j = ckfs_json_parse(text, len, &end, &oom);

	*out = NULL;
	if (oom)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", path);
	if (!j) {
		size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
		unsigned line = 1, col = 1;
		for (size_t i = 0; i < at; i++) {
			col = text[i] == '\n' ? 1 : col + 1;
			line += text[i] == '\n';
		}
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': invalid JSON at line %u, "
				 "column %u", path, line, col);
	}
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a JSON object", path);
	}
	*out = j;
	return CKFS_OK;
}

/* path names root or something under it (both real paths). */
static int path_under(const char *path, const char *root)
{
	size_t n = strlen(root);

	if (n == 1 && root[0] == '/')
		return path[0] == '/';
	return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

enum ckfs_code ckfs_model_check_path(const struct ckfs_model *m, const char *path,
				     int fd, struct ckfs_error *err)
{
	struct stat st, fst;
	enum ckfs_code rc = CKFS_OK;

	if (m->follow_symlinks)
		return CKFS_OK;
	char *real = realpath(path, NULL);
	if (!real) {
		if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
			return CKFS_OK; /* the open says "not found" */
		return ckfs_fail_errno(err, "'%s': cannot resolve", path);
	}
	int inside = path_under(real, m->src_dir);
	if (!inside && m->hf_dir) {
		/* Side files of a --config folder stay inside that folder. */
		char *hf = realpath(m->hf_dir, NULL);
		inside = hf && !path_under(hf, m->src_dir) && path_under(real, hf);
		free(hf);
	}
	if (!inside)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': symlink leads outside the "
			       "checkpoint; use --follow-symlinks", path);
	else if (fd >= 0 && (stat(real, &st) != 0 || fstat(fd, &fst) != 0 ||
			     st.st_dev != fst.st_dev || st.st_ino != fst.st_ino))
		rc = ckfs_fail(err, CKFS_E_CHANGED, "'%s': replaced while it was "
			       "opened", path);
	free(real);
	return rc;
}

int ckfs_path_is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int ckfs_path_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

enum ckfs_code ckfs_model_load_config(struct ckfs_model *m, const char *config_opt,
				      struct ckfs_error *err)
{
	char *hf = ckfs_arena_printf(&m->arena, "%s/huggingface", m->src_dir);

	if (!hf)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	return ckfs_model_load_config_from(m, hf, config_opt, err);
}

enum ckfs_code ckfs_model_load_config_from(struct ckfs_model *m, const char *hf,
					   const char *config_opt,
					   struct ckfs_error *err)
{
	const char *path;
	char *text;
	size_t len;

	if (!hf)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	if (ckfs_path_is_dir(hf)) {
		CKFS_TRY(ckfs_model_check_path(m, hf, -1, err));
		m->hf_dir = hf;
	}
	if (config_opt) {
		char *abs = realpath(config_opt, NULL);
		if (!abs)
			return ckfs_fail_errno(err, "'%s': cannot resolve", config_opt);
		path = ckfs_path_is_dir(abs) ? ckfs_arena_printf(&m->arena, "%s/config.json", abs)
				   : ckfs_arena_strdup(&m->arena, abs);
		if (!m->hf_dir && ckfs_path_is_dir(abs))
			m->hf_dir = ckfs_arena_strdup(&m->arena, abs);
		free(abs);
	} else {
		path = ckfs_arena_printf(&m->arena, "%s/config.json", hf);
		if (path)
			CKFS_TRY(ckfs_model_check_path(m, path, -1, err));
	}
	if (!path)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	struct ckfs_file_access access;
	enum ckfs_code rc = read_small_file(path, CKFS_MAX_JSON_BYTES, &text, &len, &access, err);
	if (rc == CKFS_E_NOTFOUND && !config_opt) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND,
				 "'%s': not found; pass --config PATH to a "
				 "Hugging Face config.json", path);
	}
	if (rc != CKFS_OK)
		return rc;
	cJSON *j;
	rc = ckfs_json_parse_object(path, text, len, &j, err);
	if (rc != CKFS_OK) {
		free(text);
		return rc;
	}
	m->tie_word_embeddings =
		cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
	cJSON_Delete(j);
	m->config_json = ckfs_arena_strndup(&m->arena, text, len);
	free(text);
	if (!m->config_json)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	m->config_len = len;
	m->config_path = path;
	m->config_access = access;
	m->config_access.path = path;
	return CKFS_OK;
}
