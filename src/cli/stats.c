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
#include "fuse/fs.h"

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *bytes(const cJSON *o, const char *key, char *buf, size_t size)
{
	ckfs_format_bytes(num(o, key), buf, size);
	return buf;
}

static void print_stats(const cJSON *o)
{
	char a[32], b[32], s[32];
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
	double hits = num(o, "hits"), misses = num(o, "misses");

	printf("source          %s\n", cJSON_IsString(src) ? src->valuestring : "?");
	printf("daemon pid      %.0f\n", num(o, "pid"));
	printf("files           %.0f\n", num(o, "files"));
	printf("uptime          %.1f s\n", num(o, "uptime_s"));
	printf("cache           %s of %s in %.0f slices of %s\n",
	       bytes(o, "bytes_cached", a, sizeof(a)), bytes(o, "budget", b, sizeof(b)),
	       num(o, "slices_cached"), bytes(o, "slice_size", s, sizeof(s)));
	printf("hits/misses     %.0f / %.0f (%.1f%% hits), %.0f waits, %.0f evictions\n",
	       hits, misses, hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0,
	       num(o, "waits"), num(o, "evictions"));
	printf("filled          %s in %.0f fills, %.0f failed, %.0f into recycled buffers\n",
	       bytes(o, "bytes_filled", a, sizeof(a)), num(o, "fills"),
	       num(o, "fill_errors"), num(o, "recycled"));
	printf("read-ahead      %.0f sequential reads, %.0f slices queued, %.0f dropped, "
	       "%.0f used\n",
	       num(o, "readahead_sequential"), num(o, "prefetch_queued"),
	       num(o, "prefetch_dropped"), num(o, "prefetch_hits"));
	printf("served          %.0f reads, %s, %.0f opens, %.0f errors\n", num(o, "reads"),
	       bytes(o, "bytes_read", a, sizeof(a)), num(o, "opens"), num(o, "errors"));
	printf("source read     %s\n", bytes(o, "source_bytes_read", a, sizeof(a)));
	if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "run")))
		return;
	/* A run (src/fuse/run.c): its plans and one line per step shown. */
	const cJSON *latest = cJSON_GetObjectItemCaseSensitive(o, "latest");
	printf("run             %.0f steps shown, latest %s; %.0f plans cached of %.0f, "
	       "%.0f open\n", num(o, "steps_shown"),
	       cJSON_IsString(latest) ? latest->valuestring : "(none)", num(o, "plans_cached"),
	       num(o, "max_plans"), num(o, "plans_open"));
	const cJSON *step;
	cJSON_ArrayForEach(step, cJSON_GetObjectItemCaseSensitive(o, "steps")) {
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(step, "name");
		printf("  %-20s %.0f plans built, %.0f failed, %.0f opens, %.0f reads, %s, "
		       "%.0f errors\n", cJSON_IsString(name) ? name->valuestring : "?",
		       num(step, "plans_built"), num(step, "plan_errors"), num(step, "opens"),
		       num(step, "reads"), bytes(step, "bytes_read", a, sizeof(a)),
		       num(step, "errors"));
		const cJSON *br;
		cJSON_ArrayForEach(br, cJSON_GetObjectItemCaseSensitive(step, "broken")) {
			const cJSON *role = cJSON_GetObjectItemCaseSensitive(br, "role");
			const cJSON *why = cJSON_GetObjectItemCaseSensitive(br, "error");
			printf("    %s: empty: %s\n", cJSON_IsString(role) ? role->valuestring : "?",
			       cJSON_IsString(why) ? why->valuestring : "?");
		}
	}
}

/* The counters as Prometheus metrics: the stats field, the metric's name,
 * its type and help. The help is the same on every mount, as the textfile
 * collector requires of one metric read from several files. */
static const struct prom_metric {
	const char *field, *name, *type, *help;
} prom_metrics[] = {
	{ "hits", "ckfs_cache_hits_total", "counter",
	  "Slice lookups found ready in the slice cache." },
	{ "misses", "ckfs_cache_misses_total", "counter",
	  "Slice lookups that needed a fill." },
	{ "waits", "ckfs_cache_waits_total", "counter",
	  "Slice lookups that waited on another thread's fill." },
	{ "fills", "ckfs_cache_fills_total", "counter",
	  "Slices assembled from the sources." },
	{ "fill_errors", "ckfs_cache_fill_errors_total", "counter",
	  "Slice fills that failed (a source changed or could not be read)." },
	{ "bytes_filled", "ckfs_cache_filled_bytes_total", "counter",
	  "Bytes of slices assembled from the sources." },
	{ "recycled", "ckfs_cache_recycled_total", "counter",
	  "Fills that reused the buffer of a slice already served." },
	{ "evictions", "ckfs_cache_evictions_total", "counter",
	  "Slices evicted from the slice cache." },
	{ "bytes_cached", "ckfs_cache_bytes", "gauge", "Bytes held by the slice cache." },
	{ "slices_cached", "ckfs_cache_slices", "gauge", "Slices held by the slice cache." },
	{ "budget", "ckfs_cache_budget_bytes", "gauge", "The slice cache's budget in bytes." },
	{ "slice_size", "ckfs_cache_slice_bytes", "gauge", "The size of a cache slice in bytes." },
	{ "prefetch_queued", "ckfs_prefetch_queued_total", "counter",
	  "Slices queued for read-ahead." },
	{ "prefetch_dropped", "ckfs_prefetch_dropped_total", "counter",
	  "Read-ahead slices dropped because the queue was full." },
	{ "prefetch_hits", "ckfs_prefetch_hits_total", "counter",
	  "Read-ahead slices that were later read." },
	{ "readahead_sequential", "ckfs_readahead_sequential_reads_total", "counter",
	  "Reads judged sequential." },
	{ "readahead_slices", "ckfs_readahead_slices_total", "counter",
	  "Slices handed to read-ahead." },
	{ "readahead_skipped", "ckfs_readahead_skipped_total", "counter",
	  "Slices read-ahead left alone: the kernel already had them." },
	{ "reads", "ckfs_reads_total", "counter", "FUSE read requests." },
	{ "bytes_read", "ckfs_read_bytes_total", "counter", "Bytes replied to read requests." },
	{ "errors", "ckfs_read_errors_total", "counter", "Read requests answered with an error." },
	{ "opens", "ckfs_opens_total", "counter", "Files opened." },
	{ "source_bytes_read", "ckfs_source_read_bytes_total", "counter",
	  "Bytes of checkpoint files read to serve data since the mount became ready." },
	{ "files", "ckfs_files", "gauge", "Files in the served folder." },
	{ "uptime_s", "ckfs_uptime_seconds", "gauge", "Seconds since the mount became ready." },
};

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
	static const struct prom_metric step_metrics[] = {
		{ "plans_built", "ckfs_step_plans_built_total", "counter",
		  "Plans (model and folder) built for the step's roles." },
		{ "opens", "ckfs_step_opens_total", "counter", "Files of the step opened." },
		{ "reads", "ckfs_step_reads_total", "counter", "Read requests on the step's files." },
		{ "bytes_read", "ckfs_step_read_bytes_total", "counter",
		  "Bytes replied from the step's files." },
		{ "errors", "ckfs_step_read_errors_total", "counter",
		  "Reads of the step's files answered with an error." },
	};
	const cJSON *steps = cJSON_GetObjectItemCaseSensitive(o, "steps");

	if (!cJSON_IsArray(steps))
		return;
	for (size_t i = 0; i < sizeof(step_metrics) / sizeof(step_metrics[0]); i++) {
		const struct prom_metric *m = &step_metrics[i];
		const cJSON *step;
		printf("# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, m->type);
		cJSON_ArrayForEach(step, steps) {
			const cJSON *name = cJSON_GetObjectItemCaseSensitive(step, "name");
			printf("%s{mountpoint=\"", m->name);
			prom_label(mnt);
			fputs("\",step=\"", stdout);
			prom_label(cJSON_IsString(name) ? name->valuestring : "");
			fputs("\"} ", stdout);
			prom_value(num(step, m->field));
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
	for (size_t i = 0; i < sizeof(prom_metrics) / sizeof(prom_metrics[0]); i++) {
		const struct prom_metric *m = &prom_metrics[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, m->field);
		if (!cJSON_IsNumber(v))
			continue;
		printf("# HELP %s %s\n# TYPE %s %s\n%s{mountpoint=\"", m->name, m->help, m->name,
		       m->type, m->name);
		prom_label(mnt);
		fputs("\"} ", stdout);
		prom_value(v->valuedouble);
	}
	print_prometheus_steps(o, mnt);
}

static const struct cli_opt opt_prometheus = {
	OPT_PROMETHEUS, "prometheus", 0, NULL, NULL,
	"print Prometheus metrics (the text format of node_exporter's textfile "
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

static int stats_apply(void *ctx, const struct cli_opt *o, const char *value)
{
	enum stats_format *format = ctx;

	enum stats_format want = o->id == OPT_PROMETHEUS ? STATS_PROMETHEUS : STATS_JSON;

	(void)value;
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
