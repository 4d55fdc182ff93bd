/* SPDX-License-Identifier: MIT */
/*
 * Files around the tensors (src/model/model_int.h): the Hugging Face
 * config.json a model is served with, small JSON files read whole, and the
 * warnings a model collects while it is opened.
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

/* Read a small text file whole (NUL-terminated). */
enum ckfs_code ckfs_read_small_file(const char *path, size_t max, char **out,
				      size_t *len, struct ckfs_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
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
	close(fd);
	buf[done] = '\0';
	*out = buf;
	*len = done;
	return CKFS_OK;
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
	const char *path;
	char *text;
	size_t len;

	if (!hf)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	if (ckfs_path_is_dir(hf))
		m->hf_dir = hf;
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
	}
	if (!path)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	enum ckfs_code rc = ckfs_read_small_file(path, CKFS_MAX_JSON_BYTES, &text, &len, err);
	if (rc == CKFS_E_NOTFOUND && !config_opt) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND,
				 "'%s': not found; pass --config PATH to a "
				 "Hugging Face config.json", path);
	}
	if (rc != CKFS_OK)
		return rc;
	cJSON *j = cJSON_ParseWithLength(text, len);
	if (!j || !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		free(text);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a JSON object", path);
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
	return CKFS_OK;
}
