/* SPDX-License-Identifier: MIT */
/*
 * ckfs diff A B | ckfs diff RUN: what changed between two checkpoints
 * ckfs reads (two steps, two roles, a step and a Hugging Face folder), or
 * between the consecutive steps of a training run, role by role. The
 * comparison itself is src/history/ (both models streamed through the
 * read path, a window at a time); this file opens the models, walks a
 * run's steps, prints text or JSON and writes the picture (--svg, written
 * beside FILE and renamed into place, so a failure leaves no half file).
 *
 * A run is walked holding at most two models open: step i's stays open
 * for the pair (i, i + 1), then step i + 1's for the next. A diff's
 * tensor names borrow from its models, so each pair is printed before
 * they close; the picture needs only its layer and kind groups.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/history.h"
#include "ckfs/layouts.h"
#include "ckfs/run.h"
#include "ckfs/strbuf.h"
#include "ckfs/units.h"
#include "cli/cli.h"
#include "cli/options.h"

struct diff_args {
	struct cli_common c;
	const char *svg;
	int threads;
};

static const struct cli_opt opt_svg = {
	.id = OPT_SVG, .name = "svg", .arg = "FILE", .kind = CLI_TEXT,
	.help = "also draw the relative change per layer (rows) per pair of steps "
		"(columns) as a heat map, and per tensor kind as lines, into FILE (SVG)"
};
static const struct cli_opt opt_threads = {
	.id = OPT_EXPORT_THREADS, .name = "threads", .arg = "N",
	.kind = CLI_COUNT, .lo = 1, .hi = 256,
	.help = "threads comparing tensors (default: the CPUs, at most 16)"
};

static const struct cli_opt *const diff_opts[] = {
	&cli_opt_dtype_as_stored, &cli_opt_json,  &opt_svg,           &opt_threads,
	CLI_SOURCE_OPTS,          CLI_MODEL_OPTS, &cli_opt_log_level, NULL,
};

static int diff_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v);

const struct cli_command ckfs_cmd_diff_def = {
	.name = "diff",
	.args = "A [B]",
	.n_args = 1,
	.n_optional = 1,
	.brief = "what changed between two checkpoints, or along a run",
	.about = "Compare the tensors checkpoints A and B serve (any two ckfs reads: two\n"
		 "steps, two roles, a step and a Hugging Face folder), reading both\n"
		 "through the read path with bounded memory: per tensor identical (byte\n"
		 "for byte) or changed, with max |B-A|, ||B-A||/||A||, cosine similarity\n"
		 "and the count of changed elements; per layer, per kind and in total.\n"
		 "Names or shapes on one side only are reported, never matched across.\n"
		 "With A a training run and no B, every pair of consecutive steps of\n"
		 "each role. Exit status 0 whether or not anything changed.",
	.opts = diff_opts,
	.run = ckfs_cmd_diff,
};

static int diff_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	struct diff_args *a = ctx;
	int rc = cli_apply_common(&ckfs_cmd_diff_def, &a->c, o, v);

	if (rc >= 0)
		return rc;
	switch (o->id) {
	case OPT_SVG: a->svg = v->text; return 0;
	case OPT_EXPORT_THREADS: a->threads = (int)v->n; return 0;
	default: return 0;
	}
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ---- text ---- */

static const char *shape_of(const struct ckfs_tensor *t, char *buf, size_t size)
{
	return t ? ckfs_format_dims(t->ndim, t->shape, "[", "]", buf, size) : "-";
}

static void print_tensor(const struct ckfs_diff_tensor *t, int width)
{
	char sa[96], sb[96];

	printf("%-*s  %-13s", width, ckfs_cli_shown(t->name), ckfs_diff_status_name(t->status));
	switch (t->status) {
	case CKFS_DIFF_CHANGED:
		printf("  %10.4g  %13.4g  %12.9f  %llu of %llu", t->sums.max_abs,
		       ckfs_diff_rel_l2(&t->sums), ckfs_diff_cosine(&t->sums),
		       (unsigned long long)t->sums.changed, (unsigned long long)t->sums.numel);
		if (t->a->out_dtype != t->b->out_dtype)
			printf(" (%s vs %s)", ckfs_dtype_st_name(t->a->out_dtype),
			       ckfs_dtype_st_name(t->b->out_dtype));
		break;
	case CKFS_DIFF_SHAPE:
		printf("  %s vs %s", shape_of(t->a, sa, sizeof(sa)), shape_of(t->b, sb, sizeof(sb)));
		break;
	case CKFS_DIFF_ONLY_A:
	case CKFS_DIFF_ONLY_B:
		printf("  %s", shape_of(t->a ? t->a : t->b, sa, sizeof(sa)));
		break;
	case CKFS_DIFF_IDENTICAL:
		break;
	}
	putchar('\n');
}

static void print_group(const struct ckfs_diff_group *g, int width)
{
	printf("%-*s  %7zu  %9zu  %7zu  %5zu", width, ckfs_cli_shown(g->name), g->tensors,
	       g->identical, g->changed, g->other);
	if (g->changed)
		printf("  %13.4g  %10.4g", ckfs_diff_rel_l2(&g->sums), g->sums.max_abs);
	putchar('\n');
}

static int name_width(const struct ckfs_diff *d)
{
	size_t w = 24;
	for (size_t i = 0; i < d->n_tensors; i++)
		w = strlen(d->tensors[i].name) > w ? strlen(d->tensors[i].name) : w;
	return w > 64 ? 64 : (int)w;
}

static void print_groups(const struct ckfs_diff *d, int width)
{
	printf("\n%-*s  %7s  %9s  %7s  %5s  %13s  %10s\n", width, "layer", "tensors", "identical",
	       "changed", "other", "||B-A||/||A||", "max|B-A|");
	for (size_t l = 0; l < d->n_layers; l++)
		print_group(&d->layers[l], width);
	printf("\n%-*s\n", width, "kind");
	for (int k = 0; k < CKFS_KIND_COUNT; k++)
		if (d->kinds[k].tensors)
			print_group(&d->kinds[k], width);
	putchar('\n');
	print_group(&d->total, width);
}

static void print_pair(const char *a, const char *b, const struct ckfs_diff *d, double secs)
{
	int width = name_width(d);
	char bytes[32];

	printf("A  %s\nB  %s\n\n", ckfs_cli_shown(a), ckfs_cli_shown(b));
	printf("%-*s  %-13s  %10s  %13s  %12s  %s\n", width, "tensor", "status", "max|B-A|",
	       "||B-A||/||A||", "cosine", "changed elements");
	for (size_t i = 0; i < d->n_tensors; i++)
		print_tensor(&d->tensors[i], width);
	print_groups(d, width);
	ckfs_format_bytes((double)d->bytes_read, bytes, sizeof(bytes));
	printf("read %s in %.2f s\n", bytes, secs);
}

/* ---- JSON ----
 * Written into a strbuf, whose one failure flag says whether anything was
 * lost to an allocation: a JSON document missing a field is worse than
 * none. Reals with 17 digits (exact), null when not finite. */

static void json_key(struct ckfs_strbuf *b, const char *key)
{
	ckfs_strbuf_json(b, key);
	ckfs_strbuf_str(b, ": ");
}

static void json_str(struct ckfs_strbuf *b, const char *key, const char *v)
{
	json_key(b, key);
	ckfs_strbuf_json(b, v);
	ckfs_strbuf_str(b, ", ");
}

static void json_uint(struct ckfs_strbuf *b, const char *key, uint64_t v)
{
	json_key(b, key);
	ckfs_strbuf_fmt(b, "%" PRIu64 ", ", v);
}

static void json_real(struct ckfs_strbuf *b, const char *key, double v)
{
	json_key(b, key);
	if (isfinite(v))
		ckfs_strbuf_fmt(b, "%.17g, ", v);
	else
		ckfs_strbuf_str(b, "null, ");
}

static void json_shape(struct ckfs_strbuf *b, const char *key, const struct ckfs_tensor *t)
{
	json_key(b, key);
	ckfs_strbuf_str(b, "[");
	for (int i = 0; i < t->ndim; i++)
		ckfs_strbuf_fmt(b, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
	ckfs_strbuf_str(b, "], ");
}

static void json_sums(struct ckfs_strbuf *b, const struct ckfs_diff_sums *s)
{
	json_uint(b, "numel", s->numel);
	json_uint(b, "changed_elements", s->changed);
	json_real(b, "max_abs_diff", s->max_abs);
	json_real(b, "rel_l2", ckfs_diff_rel_l2(s));
	json_real(b, "cosine", ckfs_diff_cosine(s));
	json_real(b, "norm_a", sqrt(s->a2));
	json_real(b, "norm_b", sqrt(s->b2));
	json_real(b, "norm_diff", sqrt(s->d2));
}

/* "..., " closed as "...}" */
static void json_close(struct ckfs_strbuf *b, const char *close)
{
	if (b->len >= 2 && !b->failed && strcmp(b->p + b->len - 2, ", ") == 0)
		b->len -= 2;
	ckfs_strbuf_str(b, close);
}

static void json_group(struct ckfs_strbuf *b, const struct ckfs_diff_group *g)
{
	ckfs_strbuf_str(b, "{");
	json_str(b, "name", g->name);
	json_uint(b, "tensors", g->tensors);
	json_uint(b, "identical", g->identical);
	json_uint(b, "changed", g->changed);
	json_uint(b, "other", g->other);
	json_sums(b, &g->sums);
	json_close(b, "}");
}

/* The fields of one pair, inside an object the caller opened. */
static void json_pair(struct ckfs_strbuf *b, const char *pa, const char *pb,
		      const struct ckfs_diff *d, double secs)
{
	json_str(b, "a", pa);
	json_str(b, "b", pb);
	json_key(b, "tensors");
	ckfs_strbuf_str(b, "[\n");
	for (size_t i = 0; i < d->n_tensors; i++) {
		const struct ckfs_diff_tensor *t = &d->tensors[i];
		ckfs_strbuf_str(b, i ? ",\n  {" : "  {");
		json_str(b, "name", t->name);
		json_str(b, "status", ckfs_diff_status_name(t->status));
		json_str(b, "layer", d->layers[t->layer].name);
		json_str(b, "kind", ckfs_diff_kind_name(t->kind));
		if (t->a) {
			json_shape(b, "shape_a", t->a);
			json_str(b, "dtype_a", ckfs_dtype_st_name(t->a->out_dtype));
		}
		if (t->b) {
			json_shape(b, "shape_b", t->b);
			json_str(b, "dtype_b", ckfs_dtype_st_name(t->b->out_dtype));
		}
		if (t->status <= CKFS_DIFF_CHANGED)
			json_sums(b, &t->sums);
		json_close(b, "}");
	}
	ckfs_strbuf_str(b, "],\n");
	json_key(b, "layers");
	ckfs_strbuf_str(b, "[\n");
	for (size_t l = 0; l < d->n_layers; l++) {
		ckfs_strbuf_str(b, l ? ",\n  " : "  ");
		json_group(b, &d->layers[l]);
	}
	ckfs_strbuf_str(b, "],\n");
	json_key(b, "kinds");
	ckfs_strbuf_str(b, "[\n");
	for (int k = 0, n = 0; k < CKFS_KIND_COUNT; k++)
		if (d->kinds[k].tensors) {
			ckfs_strbuf_str(b, n++ ? ",\n  " : "  ");
			json_group(b, &d->kinds[k]);
		}
	ckfs_strbuf_str(b, "],\n");
	json_key(b, "total");
	json_group(b, &d->total);
	ckfs_strbuf_str(b, ",\n");
	json_uint(b, "bytes_read", d->bytes_read);
	json_real(b, "seconds", secs);
}

/* Print b, or say it was lost to an allocation. */
static int print_json(struct ckfs_strbuf *b)
{
	struct ckfs_error err;
	int rc = 0;

	if (b->failed || !b->p) {
		ckfs_error_clear(&err);
		ckfs_nomem(&err);
		rc = ckfs_cli_report(&err);
	} else {
		fwrite(b->p, 1, b->len, stdout);
	}
	free(b->p);
	*b = (struct ckfs_strbuf){ 0 };
	return rc;
}

/* ---- the picture ---- */

/* FILE written beside itself and renamed into place. */
static enum ckfs_code write_svg(const char *path, const struct ckfs_diff_history *h, size_t n,
				struct ckfs_error *err)
{
	char tmp[4200], *svg = NULL;
	size_t len = 0;
	FILE *f;

	CKFS_TRY(ckfs_diff_svg(h, n, &svg, &len, err));
	if (snprintf(tmp, sizeof(tmp), "%s.ckfs-tmp-%ld", path, (long)getpid()) >= (int)sizeof(tmp)) {
		free(svg);
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': path too long", path);
	}
	if (!(f = fopen(tmp, "wx"))) {
		free(svg);
		return ckfs_fail_errno(err, "'%s': cannot create", tmp);
	}
	bool ok = fwrite(svg, 1, len, f) == len;
	ok = (fflush(f) == 0) & ok;
	ok = (fsync(fileno(f)) == 0) & ok;
	ok = (fclose(f) == 0) & ok;
	free(svg);
	if (!ok || rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		errno = e;
		return ckfs_fail_errno(err, "'%s': cannot write", path);
	}
	return CKFS_OK;
}

/* ---- two checkpoints ---- */

static int diff_two(const struct diff_args *a, const char *pa, const char *pb)
{
	struct ckfs_model *ma = NULL, *mb = NULL;
	struct ckfs_diff *d = NULL;
	struct ckfs_error err;
	struct timespec t0;
	int status = 0;

	ckfs_error_clear(&err);
	for (int i = 0; i < 2; i++) {
		const char *p = i ? pb : pa;
		if (ckfs_run_kind(p) == CKFS_RUN_RUN) {
			ckfs_fail(&err, CKFS_E_INVALID, "'%s': a training run (global_step_<N>/ "
				  "folders); compare two of its roles, e.g. '%s/global_step_<N>/actor', "
				  "or give the run alone for its consecutive steps", p, p);
			return ckfs_cli_report(&err);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ckfs_model_open(pa, &a->c.model, &ma, &err) == CKFS_OK &&
	    ckfs_model_open(pb, &a->c.model, &mb, &err) == CKFS_OK &&
	    ckfs_diff_models(ma, mb, a->threads, &d, &err) == CKFS_OK) {
		double secs = seconds_since(&t0);
		if (a->c.json) {
			struct ckfs_strbuf b = { 0 };
			ckfs_strbuf_str(&b, "{");
			json_pair(&b, pa, pb, d, secs);
			json_close(&b, "}\n");
			status = print_json(&b);
		} else {
			print_pair(pa, pb, d, secs);
		}
		if (a->svg) {
			const char *label = "A→B";
			const struct ckfs_diff *col = d;
			struct ckfs_diff_history h = { .title = "A→B", .labels = &label,
						       .diffs = &col, .n = 1 };
			write_svg(a->svg, &h, 1, &err);
		}
	}
	ckfs_diff_free(d);
	ckfs_model_free(mb);
	ckfs_model_free(ma);
	return err.code == CKFS_OK ? status : ckfs_cli_report(&err);
}

/* ---- a run ---- */

struct role_history {
	char *role;
	struct ckfs_diff **diffs;       /* one per pair; NULL: not compared */
	char **labels;
};

struct run_walk {
	const struct diff_args *a;
	const char *src;
	const struct ckfs_run_step **steps; /* shown, by number */
	size_t n_steps;
	struct ckfs_strbuf *json;       /* --json: the document so far */
	struct role_history *roles;
	size_t n_roles;
};

/* Whether step_dir holds a folder named role (*found). */
static enum ckfs_code has_role(const char *step_dir, const char *role, bool *found,
			       struct ckfs_error *err)
{
	char **names = NULL;
	size_t n = 0;

	*found = false;
	CKFS_TRY(ckfs_run_roles(step_dir, &names, &n, err));
	for (size_t i = 0; i < n; i++)
		*found |= strcmp(names[i], role) == 0;
	ckfs_run_roles_free(names, n);
	return CKFS_OK;
}

/* The roles of the shown steps, in order of first appearance. */
static enum ckfs_code collect_roles(struct run_walk *w, struct ckfs_error *err)
{
	for (size_t s = 0; s < w->n_steps; s++) {
		char dir[4200], **names = NULL;
		size_t n = 0;
		snprintf(dir, sizeof(dir), "%s/%s", w->src, w->steps[s]->name);
		CKFS_TRY(ckfs_run_roles(dir, &names, &n, err));
		for (size_t i = 0; i < n; i++) {
			size_t k = 0;
			while (k < w->n_roles && strcmp(w->roles[k].role, names[i]) != 0)
				k++;
			if (k < w->n_roles)
				continue;
			struct role_history *grown = realloc(w->roles, (k + 1) * sizeof(*grown));
			if (!grown || !(grown[k].role = strdup(names[i]))) {
				if (grown)
					w->roles = grown;
				ckfs_run_roles_free(names, n);
				return ckfs_nomem(err);
			}
			w->roles = grown;
			w->roles[k].diffs = NULL;
			w->roles[k].labels = NULL;
			w->n_roles++;
		}
		ckfs_run_roles_free(names, n);
	}
	return CKFS_OK;
}

static enum ckfs_code open_role(const struct run_walk *w, size_t s, const char *role,
				struct ckfs_model **m, struct ckfs_error *err)
{
	char dir[4200];
	bool found;

	*m = NULL;
	snprintf(dir, sizeof(dir), "%s/%s", w->src, w->steps[s]->name);
	CKFS_TRY(has_role(dir, role, &found, err));
	if (!found)
		return CKFS_OK;
	snprintf(dir, sizeof(dir), "%s/%s/%s", w->src, w->steps[s]->name, role);
	return ckfs_run_open_role(w->src, dir, &w->a->c.model, m, err);
}

/* Every pair of consecutive shown steps of role r. */
static enum ckfs_code walk_role(struct run_walk *w, struct role_history *r, struct ckfs_error *err)
{
	size_t pairs = w->n_steps - 1;
	struct ckfs_model *prev = NULL, *next = NULL;
	enum ckfs_code rc;

	r->diffs = calloc(pairs + 1, sizeof(*r->diffs));
	r->labels = calloc(pairs + 1, sizeof(*r->labels));
	if (!r->diffs || !r->labels)
		return ckfs_nomem(err);
	if (w->json) {
		ckfs_strbuf_str(w->json, r == w->roles ? "\n{" : ",\n{");
		json_str(w->json, "role", r->role);
		json_key(w->json, "pairs");
		ckfs_strbuf_str(w->json, "[");
	} else {
		printf("%s\n", ckfs_cli_shown(r->role));
	}
	rc = open_role(w, 0, r->role, &prev, err);
	for (size_t p = 0; p < pairs && rc == CKFS_OK; p++) {
		const struct ckfs_run_step *sa = w->steps[p], *sb = w->steps[p + 1];
		char label[64];
		struct timespec t0;
		snprintf(label, sizeof(label), "%llu→%llu", (unsigned long long)sa->step,
			 (unsigned long long)sb->step);
		if (!(r->labels[p] = strdup(label))) {
			rc = ckfs_nomem(err);
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if ((rc = open_role(w, p + 1, r->role, &next, err)) != CKFS_OK)
			break;
		if (prev && next && (rc = ckfs_diff_models(prev, next, w->a->threads, &r->diffs[p],
							   err)) != CKFS_OK)
			break;
		const struct ckfs_diff *d = r->diffs[p];
		double secs = seconds_since(&t0);
		if (w->json) {
			ckfs_strbuf_str(w->json, p ? ",\n{" : "\n{");
			json_uint(w->json, "a_step", sa->step);
			json_uint(w->json, "b_step", sb->step);
			if (d)
				json_pair(w->json, sa->name, sb->name, d, secs);
			else
				json_str(w->json, "absent", prev ? "b" : "a");
			json_close(w->json, "}");
		} else if (d) {
			printf("  %s -> %s: %zu of %zu tensors changed, %zu identical, %zu other; "
			       "||B-A||/||A|| %.4g, max|B-A| %.4g\n", sa->name, sb->name,
			       d->total.changed, d->total.tensors, d->total.identical, d->total.other,
			       ckfs_diff_rel_l2(&d->total.sums), d->total.sums.max_abs);
		} else {
			printf("  %s -> %s: not compared (no %s in %s)\n", sa->name, sb->name,
			       ckfs_cli_shown(r->role), prev ? sb->name : sa->name);
		}
		ckfs_model_free(prev);
		prev = next;
		next = NULL;
	}
	ckfs_model_free(prev);
	ckfs_model_free(next);
	if (w->json)
		ckfs_strbuf_str(w->json, "]}");
	return rc;
}

/* Text: the relative change per layer (rows) per pair (columns). */
static void print_layer_matrix(const struct role_history *r, size_t pairs)
{
	const struct ckfs_diff *first = NULL;

	for (size_t p = 0; p < pairs && !first; p++)
		first = r->diffs[p];
	if (!first)
		return;
	printf("\n  %-32s", "||B-A||/||A|| by layer");
	for (size_t p = 0; p < pairs; p++)
		printf("  %11s", r->labels[p]);
	putchar('\n');
	for (size_t l = 0; l < first->n_layers; l++) {
		printf("  %-32s", ckfs_cli_shown(first->layers[l].name));
		for (size_t p = 0; p < pairs; p++) {
			const struct ckfs_diff *d = r->diffs[p];
			const struct ckfs_diff_group *g = NULL;
			for (size_t k = 0; d && k < d->n_layers && !g; k++)
				if (strcmp(d->layers[k].name, first->layers[l].name) == 0)
					g = &d->layers[k];
			if (!g)
				printf("  %11s", "-");
			else if (!g->changed && !g->other)
				printf("  %11s", "identical");
			else
				printf("  %11.4g", ckfs_diff_rel_l2(&g->sums));
		}
		putchar('\n');
	}
	putchar('\n');
}

static int diff_run(const struct diff_args *a, const char *src)
{
	struct run_walk w = { .a = a, .src = src };
	struct ckfs_run_scan scan;
	struct ckfs_error err;
	struct timespec now;
	struct ckfs_strbuf json = { 0 };
	enum ckfs_code rc;

	ckfs_error_clear(&err);
	if (ckfs_run_scan(src, NULL, &scan, &err) != CKFS_OK)
		return ckfs_cli_report(&err);
	clock_gettime(CLOCK_REALTIME, &now);
	ckfs_run_classify(&scan, &now);
	w.steps = calloc(scan.n_steps + 1, sizeof(*w.steps));
	rc = w.steps ? CKFS_OK : ckfs_nomem(&err);
	for (size_t i = 0; rc == CKFS_OK && i < scan.n_steps; i++)
		if (scan.steps[i].state == CKFS_STEP_SHOWN)
			w.steps[w.n_steps++] = &scan.steps[i];
	if (rc == CKFS_OK && w.n_steps < 2)
		rc = ckfs_fail(&err, CKFS_E_INVALID, "'%s': a run with %zu complete step%s; "
			       "diff compares consecutive steps", src, w.n_steps,
			       w.n_steps == 1 ? "" : "s");
	if (rc == CKFS_OK)
		rc = collect_roles(&w, &err);
	if (rc == CKFS_OK && a->c.json) {
		w.json = &json;
		ckfs_strbuf_str(&json, "{");
		json_str(&json, "run", src);
		json_key(&json, "roles");
		ckfs_strbuf_str(&json, "[");
	}
	if (rc == CKFS_OK && !a->c.json)
		printf("run  %s, %zu steps\n\n", ckfs_cli_shown(src), w.n_steps);
	for (size_t r = 0; r < w.n_roles && rc == CKFS_OK; r++) {
		rc = walk_role(&w, &w.roles[r], &err);
		if (rc == CKFS_OK && !a->c.json)
			print_layer_matrix(&w.roles[r], w.n_steps - 1);
	}
	if (rc == CKFS_OK && a->svg) {
		struct ckfs_diff_history *h = calloc(w.n_roles + 1, sizeof(*h));
		for (size_t r = 0; h && r < w.n_roles; r++)
			h[r] = (struct ckfs_diff_history){
				.title = w.roles[r].role,
				.labels = (const char *const *)w.roles[r].labels,
				.diffs = (const struct ckfs_diff *const *)w.roles[r].diffs,
				.n = w.n_steps - 1,
			};
		rc = h ? write_svg(a->svg, h, w.n_roles, &err) : ckfs_nomem(&err);
		free(h);
	}
	int status = rc == CKFS_OK ? 0 : ckfs_cli_report(&err);
	if (w.json && rc == CKFS_OK) {
		ckfs_strbuf_str(&json, "]}\n");
		status = print_json(&json);
	}
	free(json.p);
	for (size_t r = 0; r < w.n_roles; r++) {
		for (size_t p = 0; p + 1 < w.n_steps; p++) {
			/* either array may be missing after a failed allocation */
			if (w.roles[r].diffs)
				ckfs_diff_free(w.roles[r].diffs[p]);
			if (w.roles[r].labels)
				free(w.roles[r].labels[p]);
		}
		free(w.roles[r].diffs);
		free(w.roles[r].labels);
		free(w.roles[r].role);
	}
	free(w.roles);
	free(w.steps);
	ckfs_run_scan_release(&scan);
	return status;
}

int ckfs_cmd_diff(int argc, char **argv)
{
	struct diff_args a = { 0 }; /* the defaults are in the option rows */
	int first;

	int rc = cli_parse(&ckfs_cmd_diff_def, argc, argv, diff_apply, &a, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (!a.threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		a.threads = n < 1 ? 1 : n > 16 ? 16 : (int)n;
	}
	if ((rc = cli_attach_stores(&a.c, (const char *const *)argv + first, argc - first)) != 0)
		return rc;
	if (argc - first == 2)
		return diff_two(&a, argv[first], argv[first + 1]);
	if (ckfs_run_kind(argv[first]) != CKFS_RUN_RUN) {
		/* no run by its names, or its folder could not be listed: the
		 * scan tells which */
		struct ckfs_run_scan scan;
		struct ckfs_error err;
		ckfs_error_clear(&err);
		if (ckfs_run_scan(argv[first], NULL, &scan, &err) != CKFS_OK)
			return ckfs_cli_report(&err);
		bool run = scan.has_tracker || scan.n_steps || scan.n_ignored;
		ckfs_run_scan_release(&scan);
		if (!run)
			return ckfs_cli_usage_error("diff", "expected A and B, or a training run "
						    "alone ('%s' is no run)", argv[first]);
	}
	return diff_run(&a, argv[first]);
}
