/* SPDX-License-Identifier: MIT */
/*
 * The torch version matrix (tests/fixtures/matrix, written by
 * tests/gen/torch_matrix.py with every torch release from 2.4 on): each
 * cell (FSDP1 ShardedTensor, FSDP2 1-D, HSDP, FSDP2 over TP, DCP, plain
 * torch.save) is read tensor by tensor and bit for bit equal to the model
 * it was cut from (original/model.safetensors), and inspect's "written by"
 * holds the release. Every cell on disk is checked; a release that could
 * not write a cell says why in its cells.json.
 *
 * The support table of docs/formats.md is this test's output: with
 * --table the test prints it; run normally it checks that the table in
 * docs/formats.md (between the matrix markers) is what it would print.
 */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "test.h"
#include "model_check.h"

#define MATRIX CKFS_FIXTURES "/matrix"
#define DOC CKFS_FIXTURES "/../../docs/formats.md"

static const char *const cells[] = { "fsdp1", "fsdp2", "hsdp", "fsdp2_tp", "dcp", "plain" };
#define N_CELLS (sizeof(cells) / sizeof(cells[0]))

struct release {
	char version[32];
	char result[N_CELLS][200]; /* "read", "cannot be written: ...", "FAILED: ..." */
};

static struct release releases[64];
static size_t n_releases;

static int version_cmp(const void *a, const void *b)
{
	const char *x = ((const struct release *)a)->version;
	const char *y = ((const struct release *)b)->version;
	for (;;) {
		long p = strtol(x, (char **)&x, 10), q = strtol(y, (char **)&y, 10);
		if (p != q)
			return p < q ? -1 : 1;
		if (*x != '.' || *y != '.')
			return (*x == '.') - (*y == '.');
		x++;
		y++;
	}
}

/* First sentence of a message, cut to fit a table cell. */
static void brief(char *dst, size_t size, const char *prefix, const char *msg)
{
	size_t n = strlen(prefix);

	memcpy(dst, prefix, n < size ? n : size - 1);
	for (; *msg && *msg != '\n' && *msg != '|' && strncmp(msg, ". ", 2) != 0 &&
	       n + 1 < size; msg++)
		dst[n++] = *msg;
	dst[n < size ? n : size - 1] = '\0';
}

/* What inspect says a rank file was written by must include the release
 * that wrote it ("torch 2.X", "2.X-2.Y", "2.X or newer", "2.Y or older"). */
static void check_written_by(const char *version, const char *said)
{
	int minor = atoi(version + 2), a = -1, b = -1, lo = 0, hi = 99;

	if (!said)
		return; /* DCP: nothing in the files dates them */
	int n = sscanf(said, "torch 2.%d-2.%d", &a, &b);
	if (n == 2) {
		lo = a;
		hi = b;
	} else if (n == 1) {
		lo = strstr(said, "or older") ? 0 : a;
		hi = strstr(said, "or newer") ? 99 : a;
	}
	if (minor < lo || minor > hi) {
		fprintf(stderr, "torch %s: inspect says written by %s\n", version, said);
		CHECK(0);
	}
}

static void check_cell(struct release *r, size_t c, const char *dir, const char *truth)
{
	struct ckfs_st_set refs = { 0 }, *ref = &refs;
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	CHECK(ckfs_st_set_open(truth, NULL, ref, &err) == CKFS_OK);
	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_model_open(dir, &opt, &m, &err);
	if (rc != CKFS_OK) {
		fprintf(stderr, "torch %s %s: %s\n", r->version, cells[c], err.msg);
		CHECK(0);
		brief(r->result[c], sizeof(r->result[c]), "FAILED: ", err.msg);
		goto out;
	}
	CHECK_EQ_STR(m->layout->name, strcmp(cells[c], "dcp") == 0 ? "dcp" : "verl-fsdp");
	check_written_by(r->version, m->written_by);
	CHECK_EQ_INT(m->n_tensors, ref->n_entries);
	int before = test_case_failed;
	test_case_failed = 0;
	test_model_equals(m, ref, CKFS_DTYPE_INVALID, dir);
	snprintf(r->result[c], sizeof(r->result[c]), "%s",
		 test_case_failed ? "FAILED: wrong bytes" : "read");
	test_case_failed |= before;
out:
	ckfs_model_free(m);
	ckfs_st_set_release(ref);
}

static void check_release(const char *name)
{
	struct release *r = &releases[n_releases++];
	char path[1024];
	size_t len;

	snprintf(r->version, sizeof(r->version), "%s", name + strlen("torch-"));
	snprintf(path, sizeof(path), MATRIX "/%s/cells.json", name);
	char *text = (char *)test_slurp(path, &len);
	cJSON *doc = text ? cJSON_Parse(text) : NULL, *rec = cJSON_GetObjectItem(doc, "cells");
	CHECK(rec != NULL);
	for (size_t c = 0; c < N_CELLS; c++) {
		cJSON *cell = cJSON_GetObjectItem(rec, cells[c]);
		cJSON *cannot = cJSON_GetObjectItem(cell, "cannot");
		CHECK(cell != NULL);
		snprintf(path, sizeof(path), MATRIX "/%s/%s", name, cells[c]);
		if (cJSON_IsString(cannot)) {
			CHECK(access(path, F_OK) != 0);
			brief(r->result[c], sizeof(r->result[c]), "cannot be written: ",
			      cannot->valuestring);
			continue;
		}
		cJSON *truth = cJSON_GetObjectItem(cell, "truth");
		char tpath[1024];
		CHECK(cJSON_IsString(truth) && !strchr(truth->valuestring, '/'));
		snprintf(tpath, sizeof(tpath), MATRIX "/%s/%s", name,
			 cJSON_IsString(truth) ? truth->valuestring : "original");
		check_cell(r, c, path, tpath);
	}
	cJSON_Delete(doc);
	free(text);
}

static void test_every_cell(void)
{
	DIR *d = opendir(MATRIX);
	struct dirent *de;

	CHECK(d != NULL);
	while (d && (de = readdir(d)))
		if (strncmp(de->d_name, "torch-", 6) == 0 &&
		    n_releases < sizeof(releases) / sizeof(releases[0]))
			check_release(de->d_name);
	if (d)
		closedir(d);
	CHECK(n_releases >= 12); /* 2.4 ... 2.15 */
	qsort(releases, n_releases, sizeof(releases[0]), version_cmp);
}

/* The table of docs/formats.md, between its markers. */
static char *support_table(void)
{
	size_t cap = 1 << 16, n = 0;
	char *t = malloc(cap);

	n += (size_t)snprintf(t + n, cap - n, "| torch |");
	for (size_t c = 0; c < N_CELLS; c++)
		n += (size_t)snprintf(t + n, cap - n, " %s |", cells[c]);
	n += (size_t)snprintf(t + n, cap - n, "\n|---|");
	for (size_t c = 0; c < N_CELLS; c++)
		n += (size_t)snprintf(t + n, cap - n, "---|");
	n += (size_t)snprintf(t + n, cap - n, "\n");
	for (size_t i = 0; i < n_releases && n < cap - 2048; i++) {
		n += (size_t)snprintf(t + n, cap - n, "| %s |", releases[i].version);
		for (size_t c = 0; c < N_CELLS; c++)
			n += (size_t)snprintf(t + n, cap - n, " %s |", releases[i].result[c]);
		n += (size_t)snprintf(t + n, cap - n, "\n");
	}
	return t;
}

static void test_doc_table(void)
{
	size_t len;
	char *doc = (char *)test_slurp(DOC, &len), *table = support_table();
	const char *begin = doc ? strstr(doc, "<!-- matrix:begin -->\n") : NULL;
	const char *end = begin ? strstr(begin, "<!-- matrix:end -->") : NULL;

	CHECK(begin && end);
	if (begin && end) {
		begin += strlen("<!-- matrix:begin -->\n");
		if ((size_t)(end - begin) != strlen(table) ||
		    memcmp(begin, table, strlen(table)) != 0) {
			fprintf(stderr, "docs/formats.md's support table is not the matrix's; "
				"run test_torch_matrix --table and paste:\n%s", table);
			CHECK(0);
		}
	}
	free(table);
	free(doc);
}

int main(int argc, char **argv)
{
	RUN(test_every_cell);
	if (argc > 1 && strcmp(argv[1], "--table") == 0) {
		char *t = support_table();
		fputs(t, stdout);
		free(t);
	} else {
		RUN(test_doc_table);
	}
	return test_summary();
}
