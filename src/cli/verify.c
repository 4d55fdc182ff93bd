/* SPDX-License-Identifier: MIT */
/*
 * ckfs verify SRC --against DIR: the checks of verl's `model_merger test`
 * against a Hugging Face folder: the same tensor names (none missing, none
 * extra), shapes, dtypes and values. Before that, the checkpoint itself:
 * the CRC32 of every rank file's records, and the copies of plain tensors
 * on every rank against the one served (verl refuses copies that differ). Reference tensors stored in another
 * dtype are cast to the output dtype first, as verl's test loads the
 * reference in bf16. Values are exact by default (bitwise, NaN equal to
 * NaN); --atol/--rtol compare |a - b| <= atol + rtol * |b|.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "ckfs/zip.h"
#include "cli/cli.h"
#include "cli/options.h"

#define VERIFY_BLOCK (1u << 20) /* elements compared per step */

struct tensor_result {
	uint64_t mismatches;
	double max_diff;
	uint64_t worst_index;
};

static enum ckfs_code compare_tensor(const struct ckfs_model *m,
				     const struct ckfs_tensor *t,
				     const struct ckfs_st_entry *ref, double atol,
				     double rtol, struct tensor_result *res,
				     struct ckfs_error *err)
{
	size_t out = ckfs_dtype_size(t->out_dtype), in = ckfs_dtype_size(ref->dtype);
	unsigned char *a = malloc(VERIFY_BLOCK * out), *b = malloc(VERIFY_BLOCK * out);
	unsigned char *raw = malloc(VERIFY_BLOCK * in);
	struct ckfs_read_scratch scratch = { 0 };
	enum ckfs_code rc = CKFS_OK;
	int exact = atol == 0 && rtol == 0;

	memset(res, 0, sizeof(*res));
	if (!a || !b || !raw) {
		rc = ckfs_nomem(err);
		goto out;
	}
	for (uint64_t e = 0; e < t->numel && rc == CKFS_OK; e += VERIFY_BLOCK) {
		size_t n = t->numel - e < VERIFY_BLOCK ? (size_t)(t->numel - e) : VERIFY_BLOCK;
		rc = ckfs_tensor_read(m, t, e, n, a, &scratch, err);
		if (rc != CKFS_OK)
			break;
		size_t len = n * in;
		if (ckfs_file_pread(ref->f, raw, len, ref->begin + e * in) != (ssize_t)len) {
			rc = ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': cannot read '%s'",
				       ref->file, ref->name);
			break;
		}
		ckfs_convert(t->out_dtype, b, ref->dtype, raw, n, 0);
		for (size_t i = 0; i < n; i++) {
			double x = ckfs_dtype_load_double(t->out_dtype, a + i * out);
			double y = ckfs_dtype_load_double(t->out_dtype, b + i * out);
			int same;
			if (exact)
				same = memcmp(a + i * out, b + i * out, out) == 0 ||
				       (isnan(x) && isnan(y));
			else
				same = (isnan(x) && isnan(y)) || x == y ||
				       fabs(x - y) <= atol + rtol * fabs(y);
			if (same)
				continue;
			res->mismatches++;
			double d = isnan(x) || isnan(y) ? INFINITY : fabs(x - y);
			if (d > res->max_diff || res->mismatches == 1) {
				res->max_diff = d;
				res->worst_index = e + i;
			}
		}
	}
out:
	free(a);
	free(b);
	free(raw);
	ckfs_read_scratch_release(&scratch);
	return rc;
}

/* Every record of every rank file read: stored CRC32 recomputed (zlib),
 * directory re-read by libzip. */
static enum ckfs_code check_containers(const struct ckfs_model *m,
				       struct ckfs_error *err)
{
	size_t records = 0, checked = 0;

	if (!(m->layout->flags & CKFS_LAYOUT_RANK_ZIPS)) {
		/* .distcp items are zips at offsets inside their files and
		 * safetensors files are not zips: nothing to re-read here */
		printf("containers: not checked for layout %s (%zu source files)\n",
		       m->layout->name, m->n_sources);
		return CKFS_OK;
	}
	for (size_t i = 0; i < m->n_sources; i++) {
		const struct ckfs_source *s = &m->sources[i];
		struct ckfs_zip z;
		size_t n = 0;
		CKFS_TRY(ckfs_zip_open(&z, s->f, 0, s->size, s->path, err));
		enum ckfs_code rc = ckfs_zip_verify_crc(&z, &n, err);
		if (rc == CKFS_OK)
			rc = ckfs_zip_crosscheck(&z, err);
		records += z.n_entries;
		checked += n;
		ckfs_zip_release(&z);
		if (rc != CKFS_OK)
			return rc;
	}
	printf("containers: %zu rank files, %zu records, CRC32 matches for %zu "
	       "(%zu written without CRC), libzip agrees\n", m->n_sources, records,
	       checked, records - checked);
	return CKFS_OK;
}

/* One chunk of t as a tensor of its own, read in the stored dtype. */
static struct ckfs_tensor chunk_as_tensor(const struct ckfs_tensor *t, struct ckfs_chunk *c)
{
	struct ckfs_tensor v = *t;

	v.out_dtype = t->stored_dtype;
	v.n_chunks = 1;
	v.chunks = c;
	v.n_copies = 0;
	v.copies = NULL;
	return v;
}

/* Elements of a and b (n of them, dtype dt) that differ: bytes differ
 * and not both NaN. */
static uint64_t count_different(enum ckfs_dtype dt, const unsigned char *a,
				const unsigned char *b, size_t n)
{
	size_t es = ckfs_dtype_size(dt);
	uint64_t diff = 0;

	for (size_t i = 0; i < n; i++)
		if (memcmp(a + i * es, b + i * es, es) != 0 &&
		    !(isnan(ckfs_dtype_load_double(dt, a + i * es)) &&
		      isnan(ckfs_dtype_load_double(dt, b + i * es))))
			diff++;
	return diff;
}

/* Elements of copy that differ from the served chunk of t. */
static enum ckfs_code compare_copy(const struct ckfs_model *m, const struct ckfs_tensor *t,
				   struct ckfs_chunk *copy, uint64_t *n_diff,
				   struct ckfs_error *err)
{
	struct ckfs_tensor served = chunk_as_tensor(t, &t->chunks[0]);
	struct ckfs_tensor other = chunk_as_tensor(t, copy);
	size_t es = ckfs_dtype_size(t->stored_dtype);
	unsigned char *a = malloc(VERIFY_BLOCK * es), *b = malloc(VERIFY_BLOCK * es);
	struct ckfs_read_scratch scratch = { 0 };
	enum ckfs_code rc = a && b ? CKFS_OK : ckfs_nomem(err);

	*n_diff = 0;
	for (uint64_t e = 0; rc == CKFS_OK && e < t->numel; e += VERIFY_BLOCK) {
		size_t n = t->numel - e < VERIFY_BLOCK ? (size_t)(t->numel - e) : VERIFY_BLOCK;
		rc = ckfs_tensor_read(m, &served, e, n, a, &scratch, err);
		if (rc == CKFS_OK)
			rc = ckfs_tensor_read(m, &other, e, n, b, &scratch, err);
		if (rc == CKFS_OK)
			*n_diff += count_different(t->stored_dtype, a, b, n);
	}
	free(a);
	free(b);
	ckfs_read_scratch_release(&scratch);
	return rc;
}

/* verl's merger loads every rank of a plain (non-DTensor) entry and
 * refuses copies that differ; ckfs serves the first rank's copy after
 * checking shapes and dtypes at open, and compares the values here, in
 * the stored dtype (bitwise, NaN equal to NaN), on every rank. */
static enum ckfs_code check_copies(const struct ckfs_model *m, struct ckfs_error *err)
{
	size_t tensors = 0, copies = 0;

	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		for (uint32_t k = 0; k < t->n_copies && t->n_chunks == 1; k++) {
			uint64_t n_diff;
			CKFS_TRY(compare_copy(m, t, &t->copies[k], &n_diff, err));
			if (n_diff)
				return ckfs_fail(err, CKFS_E_MISMATCH,
						 "'%s': tensor '%s' differs between ranks %d and %d "
						 "(%llu of %llu elements; a plain tensor must be the "
						 "same on every rank)",
						 m->sources[t->copies[k].source].path, t->name,
						 t->chunks[0].rank, t->copies[k].rank,
						 (unsigned long long)n_diff,
						 (unsigned long long)t->numel);
			copies++;
		}
		tensors += t->n_copies > 0;
	}
	if (tensors)
		printf("copies: %zu plain tensors, %zu copies on other ranks, all equal to the "
		       "served one\n", tensors, copies);
	return CKFS_OK;
}

static int same_shape(const struct ckfs_tensor *t, const struct ckfs_st_entry *r)
{
	return t->ndim == r->ndim &&
	       memcmp(t->shape, r->shape, sizeof(int64_t) * (size_t)t->ndim) == 0;
}

struct verify_args {
	struct cli_common c;
	const char *against;
	double atol, rtol;
};

static const struct cli_opt opt_against = {
	.id = OPT_AGAINST, .name = "against", .arg = "DIR", .kind = CLI_TEXT,
	.help = "the Hugging Face folder to compare with (required)"
};
static const struct cli_opt opt_atol = {
	.id = OPT_ATOL, .name = "atol", .arg = "A", .kind = CLI_REAL, .def = "0",
	.help = "absolute tolerance (0: bit for bit)"
};
static const struct cli_opt opt_rtol = {
	.id = OPT_RTOL, .name = "rtol", .arg = "R", .kind = CLI_REAL, .def = "0",
	.help = "relative tolerance: |a - b| <= A + R * |b|"
};

static const struct cli_opt *const verify_opts[] = {
	&opt_against,    &cli_opt_dtype, &opt_atol,          &opt_rtol,
	CLI_SOURCE_OPTS, CLI_MODEL_OPTS, &cli_opt_log_level, NULL,
};

const struct cli_command ckfs_cmd_verify_def = {
	.name = "verify",
	.args = "SRC",
	.n_args = 1,
	.brief = "compare a checkpoint with a Hugging Face folder",
	.about = "Compare what checkpoint SRC serves with the Hugging Face folder given\n"
		 "by --against, as verl's `model_merger test` does: the same tensor\n"
		 "names, shapes, dtypes and values (the reference cast to the output\n"
		 "dtype); copies of a replicated tensor are compared across ranks too.",
	.opts = verify_opts,
	.run = ckfs_cmd_verify,
};

static int verify_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	struct verify_args *a = ctx;
	int rc = cli_apply_common(&ckfs_cmd_verify_def, &a->c, o, v);

	if (rc >= 0)
		return rc;
	if (o->id == OPT_AGAINST)
		a->against = v->text;
	else
		*(o->id == OPT_ATOL ? &a->atol : &a->rtol) = v->real;
	return 0;
}

struct tally {
	size_t missing, extra, bad, compared;
	const char *worst;
	double worst_diff;
};

/* Names on one side only: each printed (the first few) and counted. */
static enum ckfs_code compare_names(const struct ckfs_model *m, const struct ckfs_st_set *ref,
				    struct tally *t, struct ckfs_error *err)
{
	bool *seen = calloc(ref->n_entries + 1, sizeof(*seen));

	if (!seen)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_st_entry *r = ckfs_st_set_find(ref, m->tensors[i].name);
		if (r)
			seen[r - ref->entries] = true;
		else if (t->missing++ < 10)
			printf("missing in reference: %s\n", ckfs_cli_shown(m->tensors[i].name));
	}
	for (size_t i = 0; i < ref->n_entries; i++)
		if (!seen[i] && t->extra++ < 10)
			printf("not in checkpoint: %s\n", ckfs_cli_shown(ref->entries[i].name));
	free(seen);
	return CKFS_OK;
}

/* Shapes and values of the tensors both sides hold. */
static enum ckfs_code compare_values(const struct ckfs_model *m, const struct ckfs_st_set *ref,
				     const struct verify_args *a, struct tally *tl,
				     struct ckfs_error *err)
{
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		const struct ckfs_st_entry *r = ckfs_st_set_find(ref, t->name);
		struct tensor_result res;
		if (!r)
			continue;
		tl->compared++;
		if (!same_shape(t, r)) {
			if (tl->bad++ < 20)
				printf("shape differs: %s\n", ckfs_cli_shown(t->name));
			continue;
		}
		if (r->dtype != t->out_dtype)
			printf("note: %s is %s in the reference, compared as %s\n",
			       ckfs_cli_shown(t->name), ckfs_dtype_st_name(r->dtype),
			       ckfs_dtype_st_name(t->out_dtype));
		CKFS_TRY(compare_tensor(m, t, r, a->atol, a->rtol, &res, err));
		if (!res.mismatches)
			continue;
		if (tl->bad++ < 20)
			printf("values differ: %s: %llu of %llu elements, max |diff| %g at "
			       "element %llu\n", ckfs_cli_shown(t->name),
			       (unsigned long long)res.mismatches, (unsigned long long)t->numel,
			       res.max_diff, (unsigned long long)res.worst_index);
		if (res.max_diff > tl->worst_diff) {
			tl->worst_diff = res.max_diff;
			tl->worst = t->name;
		}
	}
	return CKFS_OK;
}

static int report(const struct tally *t, const struct verify_args *a)
{
	if (!t->missing && !t->extra && !t->bad) {
		printf("verified %zu tensors against '%s': names, shapes, dtypes and values "
		       "match%s\n", t->compared, ckfs_cli_shown(a->against),
		       a->atol == 0 && a->rtol == 0 ? " exactly" : " within tolerance");
		return 0;
	}
	printf("FAILED: %zu missing, %zu extra, %zu of %zu tensors differ%s%s%s\n", t->missing,
	       t->extra, t->bad, t->compared, t->worst ? " (worst: " : "",
	       t->worst ? ckfs_cli_shown(t->worst) : "", t->worst ? ")" : "");
	return 1;
}

int ckfs_cmd_verify(int argc, char **argv)
{
	struct verify_args a = { 0 }; /* the defaults are in the option rows */
	struct tally tally = { .worst_diff = -1 };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;
	int first;

	ckfs_error_clear(&err);
	int rc = cli_parse(&ckfs_cmd_verify_def, argc, argv, verify_apply, &a, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (!a.against)
		return ckfs_cli_usage_error("verify", "expected SRC and --against DIR");
	const char *stores[] = { argv[first], a.against };
	if ((rc = cli_attach_stores(&a.c, stores, 2)) != 0)
		return rc;
	if (ckfs_model_open(argv[first], &a.c.model, &m, &err) != CKFS_OK)
		return ckfs_cli_report(&err);
	if (ckfs_st_set_open(a.against, NULL, &ref, &err) != CKFS_OK) {
		ckfs_model_free(m);
		return ckfs_cli_report(&err);
	}
	if (check_containers(m, &err) == CKFS_OK && check_copies(m, &err) == CKFS_OK &&
	    compare_names(m, &ref, &tally, &err) == CKFS_OK &&
	    compare_values(m, &ref, &a, &tally, &err) == CKFS_OK)
		rc = report(&tally, &a);
	ckfs_st_set_release(&ref);
	ckfs_model_free(m);
	return err.code != CKFS_OK ? ckfs_cli_report(&err) : rc;
}
