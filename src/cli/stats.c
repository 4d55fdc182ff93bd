/* SPDX-License-Identifier: MIT */
/* ckfs stats MNT: the counters a running mount keeps (its root's
 * user.ckfs.stats xattr), as text, JSON, or Prometheus's text format for
 * node_exporter's textfile collector. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "ckfs/json.h"
#include "ckfs/units.h"

#include "cli/cli.h"
#include "cli/options.h"
#include "fuse/counters.h"
#include "fuse/fs.h"

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The value of a mount's row k (src/fuse/counters.h), and as a size. */
static double at(const cJSON *o, enum ckfs_stat k)
{
	return num(o, ckfs_stat_rows[k].key);
}

static const char *size_at(const cJSON *o, enum ckfs_stat k, char buf[32])
{
	ckfs_format_bytes(at(o, k), buf, 32);
	return buf;
}

/* A run (src/fuse/run_tree.c): its plans and one line per step shown. */
static void print_run(const cJSON *o)
{
	const cJSON *latest = cJSON_GetObjectItemCaseSensitive(o, "latest");
	const cJSON *step;
	char a[32];

	printf("run             %.0f steps shown, latest %s; %.0f plans cached of %.0f, "
	       "%.0f open\n", at(o, CKFS_STAT_STEPS_SHOWN),
	       cJSON_IsString(latest) ? latest->valuestring : "(none)",
	       at(o, CKFS_STAT_PLANS_CACHED), at(o, CKFS_STAT_MAX_PLANS),
	       at(o, CKFS_STAT_PLANS_OPEN));
	cJSON_ArrayForEach(step, cJSON_GetObjectItemCaseSensitive(o, "steps")) {
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(step, "name");
		ckfs_format_bytes(num(step, CKFS_STEP_KEY(BYTES_READ)), a, sizeof(a));
		printf("  %-20s %.0f plans built, %.0f failed, %.0f opens, %.0f reads, %s, "
		       "%.0f errors\n", cJSON_IsString(name) ? name->valuestring : "?",
		       num(step, CKFS_STEP_KEY(PLANS_BUILT)), num(step, CKFS_STEP_KEY(PLAN_ERRORS)),
		       num(step, CKFS_STEP_KEY(OPENS)), num(step, CKFS_STEP_KEY(READS)), a,
		       num(step, CKFS_STEP_KEY(ERRORS)));
		const cJSON *br;
		cJSON_ArrayForEach(br, cJSON_GetObjectItemCaseSensitive(step, "broken")) {
			const cJSON *role = cJSON_GetObjectItemCaseSensitive(br, "role");
			const cJSON *why = cJSON_GetObjectItemCaseSensitive(br, "error");
			printf("    %s: empty: %s\n", cJSON_IsString(role) ? role->valuestring : "?",
			       cJSON_IsString(why) ? why->valuestring : "?");
		}
	}
}

static void print_stats(const cJSON *o)
{
	char a[32], b[32], s[32];
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
	double hits = at(o, CKFS_STAT_HITS), misses = at(o, CKFS_STAT_MISSES);

	printf("source          %s\n", cJSON_IsString(src) ? src->valuestring : "?");
	printf("daemon pid      %.0f\n", num(o, "pid"));
	printf("files           %.0f\n", at(o, CKFS_STAT_FILES));
	printf("uptime          %.1f s\n", at(o, CKFS_STAT_UPTIME));
	printf("cache           %s of %s in %.0f slices of %s\n",
	       size_at(o, CKFS_STAT_BYTES_CACHED, a), size_at(o, CKFS_STAT_BUDGET, b),
	       at(o, CKFS_STAT_SLICES_CACHED), size_at(o, CKFS_STAT_SLICE_SIZE, s));
	if (at(o, CKFS_STAT_RSS) > 0) /* an older daemon does not say */
		printf("memory          %s resident (%s anonymous), slice buffers %s\n",
		       size_at(o, CKFS_STAT_RSS, a), size_at(o, CKFS_STAT_RSS_ANON, b),
		       size_at(o, CKFS_STAT_SLICE_MEMORY, s));
	printf("hits/misses     %.0f / %.0f (%.1f%% hits), %.0f waits, %.0f evictions\n",
	       hits, misses, hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0,
	       at(o, CKFS_STAT_WAITS), at(o, CKFS_STAT_EVICTIONS));
	printf("filled          %s in %.0f fills, %.0f failed, %.0f into recycled buffers\n",
	       size_at(o, CKFS_STAT_BYTES_FILLED, a), at(o, CKFS_STAT_FILLS),
	       at(o, CKFS_STAT_FILL_ERRORS), at(o, CKFS_STAT_RECYCLED));
	printf("read-ahead      %.0f sequential reads, %.0f slices queued, %.0f dropped, "
	       "%.0f used\n",
	       at(o, CKFS_STAT_READAHEAD_SEQUENTIAL), at(o, CKFS_STAT_PREFETCH_QUEUED),
	       at(o, CKFS_STAT_PREFETCH_DROPPED), at(o, CKFS_STAT_PREFETCH_HITS));
	printf("served          %.0f reads, %s, %.0f opens, %.0f errors\n",
	       at(o, CKFS_STAT_READS), size_at(o, CKFS_STAT_BYTES_READ, a),
	       at(o, CKFS_STAT_OPENS), at(o, CKFS_STAT_ERRORS));
	printf("source read     %s\n", size_at(o, CKFS_STAT_SOURCE_BYTES_READ, a));
	if (at(o, CKFS_STAT_STORE_REQUESTS) > 0)
		printf("object store    %.0f requests, %.0f retried, %s received\n",
		       at(o, CKFS_STAT_STORE_REQUESTS), at(o, CKFS_STAT_STORE_RETRIES),
		       size_at(o, CKFS_STAT_STORE_BYTES, a));
	if (at(o, CKFS_STAT_BYTES_HASHED) > 0)
		printf("shared          %.0f slices held once (%s), %s saved now, %s hashed\n",
		       at(o, CKFS_STAT_SHARED_SLICES), size_at(o, CKFS_STAT_SHARED_BYTES, a),
		       size_at(o, CKFS_STAT_BYTES_SAVED, b), size_at(o, CKFS_STAT_BYTES_HASHED, s));
	if (at(o, CKFS_STAT_PRELOAD_BYTES) > 0)
		printf("preload         %s of %s stored%s, %s left to reads, %.0f errors\n",
		       size_at(o, CKFS_STAT_PRELOAD_STORED, a), size_at(o, CKFS_STAT_PRELOAD_BYTES, b),
		       at(o, CKFS_STAT_PRELOAD_DONE) > 0 ? " (done)" : "",
		       size_at(o, CKFS_STAT_PRELOAD_SKIPPED, s), at(o, CKFS_STAT_PRELOAD_ERRORS));
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "run")))
		print_run(o);
}

/* A label value: backslash, double quote and newline escaped. */
static void prom_label(const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			printf("\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", stdout);
		else
			putchar(*s);
	}
}

static void prom_value(double v)
{
	if (v == floor(v) && fabs(v) < 9007199254740992.0) /* 2^53: exact */
		printf("%.0f\n", v);
	else
		printf("%.9g\n", v);
}

/* A run's per-step counters, labelled with the mount point and the step. */
static void print_prometheus_steps(const cJSON *o, const char *mnt)
{
	const cJSON *steps = cJSON_GetObjectItemCaseSensitive(o, "steps");

	if (!cJSON_IsArray(steps))
		return;
	for (size_t i = 0; i < CKFS_STEP_ROWS; i++) {
		const struct ckfs_stat_row *m = &ckfs_step_stat_rows[i];
		const cJSON *step;
		if (!m->metric)
			continue;
		printf("# HELP %s %s\n# TYPE %s %s\n", m->metric, m->help, m->metric, m->type);
		cJSON_ArrayForEach(step, steps) {
			const cJSON *name = cJSON_GetObjectItemCaseSensitive(step, "name");
			printf("%s{mountpoint=\"", m->metric);
			prom_label(mnt);
			fputs("\",step=\"", stdout);
			prom_label(cJSON_IsString(name) ? name->valuestring : "");
			fputs("\"} ", stdout);
			prom_value(num(step, m->key));
		}
	}
}

/* Every counter the daemon reported, labelled with the mount point; one
 * info metric carries the checkpoint, the daemon and ckfs's version. A
 * field the daemon did not report is left out, never shown as 0. */
static void print_prometheus(const cJSON *o, const char *mnt)
{
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");

	puts("# HELP ckfs_mount_info A ckfs mount: its checkpoint, daemon and version.\n"
	     "# TYPE ckfs_mount_info gauge");
	fputs("ckfs_mount_info{mountpoint=\"", stdout);
	prom_label(mnt);
	fputs("\",source=\"", stdout);
	prom_label(cJSON_IsString(src) ? src->valuestring : "");
	printf("\",pid=\"%.0f\",version=\"%s\"} 1\n", num(o, "pid"), CKFS_VERSION);
	for (size_t i = 0; i < CKFS_STAT_ROWS; i++) {
		const struct ckfs_stat_row *m = &ckfs_stat_rows[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, m->key);
		if (!m->metric || !cJSON_IsNumber(v))
			continue;
		printf("# HELP %s %s\n# TYPE %s %s\n%s{mountpoint=\"", m->metric, m->help, m->metric,
		       m->type, m->metric);
		prom_label(mnt);
		fputs("\"} ", stdout);
		prom_value(v->valuedouble);
	}
	print_prometheus_steps(o, mnt);
}

static const struct cli_opt opt_prometheus = {
	.id = OPT_PROMETHEUS, .name = "prometheus",
	.help = "print Prometheus metrics (the text format of node_exporter's textfile "
		"collector), labelled with the mount point"
};
static const struct cli_opt *const stats_opts[] = { &cli_opt_json, &opt_prometheus, NULL };

const struct cli_command ckfs_cmd_stats_def = {
	.name = "stats",
	.args = "MNT",
	.n_args = 1,
	.brief = "counters of a running mount",
	.about = "Counters of a running mount: slice cache, read-ahead, reads, bytes\n"
		 "read from the sources; as text, JSON or Prometheus metrics.",
	.opts = stats_opts,
	.run = ckfs_cmd_stats,
};

enum stats_format { STATS_TEXT, STATS_JSON, STATS_PROMETHEUS };

static int stats_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	enum stats_format *format = ctx;
	enum stats_format want = o->id == OPT_PROMETHEUS ? STATS_PROMETHEUS : STATS_JSON;

	(void)v;
	if (*format != STATS_TEXT && *format != want)
		return ckfs_cli_usage_error("stats", "--json and --prometheus exclude "
					    "each other");
	*format = want;
	return 0;
}

/* The daemon's counters (JSON text) into *out (malloc'd: a run's grow
 * with its steps): 0, or 1 after saying why. */
static int read_stats(const char *mnt, char **out, size_t *len)
{
	ssize_t n = getxattr(mnt, CKFS_STATS_XATTR, NULL, 0);
	char *buf = NULL;

	*out = NULL;
	if (n >= 0) {
		buf = malloc((size_t)n + 1);
		if (!buf) {
			ckfs_cli_say("out of memory");
			return 1;
		}
		n = getxattr(mnt, CKFS_STATS_XATTR, buf, (size_t)n);
	}
	if (n >= 0) {
		buf[n] = '\0';
		*out = buf;
		*len = (size_t)n;
		return 0;
	}
	free(buf);
	if (errno == ENODATA || errno == ENOTSUP)
		ckfs_cli_say("'%s': not a ckfs mount", mnt);
	else if (errno == ENOTCONN)
		ckfs_cli_say("'%s': the daemon is gone (transport endpoint is not "
			     "connected); run 'ckfs umount %s'", mnt, mnt);
	else
		ckfs_cli_say("'%s': %s", mnt, strerror(errno));
	return 1;
}

int ckfs_cmd_stats(int argc, char **argv)
{
	enum stats_format format = STATS_TEXT;
	char *buf, abs_mnt[PATH_MAX];
	int first;

	int rc = cli_parse(&ckfs_cmd_stats_def, argc, argv, stats_apply, &format, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	const char *mnt = argv[first];
	size_t len;
	if (read_stats(mnt, &buf, &len) != 0)
		return 1;
	/* Checked whole for --json too: any file system may answer the xattr. */
	struct ckfs_error err;
	cJSON *o = NULL;
	ckfs_error_clear(&err);
	rc = ckfs_json_parse_object(CKFS_STATS_XATTR, buf, len, &o, &err);
	if (rc == CKFS_OK && format == STATS_JSON)
		fputs(buf, stdout);
	free(buf);
	if (rc != CKFS_OK) {
		ckfs_cli_say("'%s': unreadable statistics (%s)", mnt, err.msg);
		return 1;
	}
	if (format == STATS_JSON) {
		cJSON_Delete(o);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (format == STATS_PROMETHEUS)
		print_prometheus(o, ckfs_abs_path(mnt, abs_mnt, sizeof(abs_mnt)) == 0 ? abs_mnt
										     : mnt);
	else
		print_stats(o);
	cJSON_Delete(o);
	return fflush(stdout) == 0 ? 0 : 1;
}
