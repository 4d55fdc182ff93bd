/* SPDX-License-Identifier: MIT */
/* ckfs stats MNT: the counters a running mount keeps (its root's
 * user.ckfs.stats xattr), as text or JSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

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
}

static const struct cli_opt *const stats_opts[] = { &cli_opt_json, NULL };

const struct cli_command ckfs_cmd_stats_def = {
	.name = "stats",
	.args = "MNT",
	.n_args = 1,
	.brief = "counters of a running mount",
	.about = "Counters of a running mount: slice cache, read-ahead, reads, bytes\n"
		 "read from the sources.",
	.opts = stats_opts,
	.run = ckfs_cmd_stats,
};

static int stats_apply(void *ctx, const struct cli_opt *o, const char *value)
{
	int rc = cli_apply_common(&ckfs_cmd_stats_def, ctx, o, value);
	return rc < 0 ? 0 : rc;
}

int ckfs_cmd_stats(int argc, char **argv)
{
	struct cli_common c = { 0 };
	int first;

	int rc = cli_parse(&ckfs_cmd_stats_def, argc, argv, stats_apply, &c, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	int json = c.json;
	const char *mnt = argv[first];
	char buf[65536];
	ssize_t n = getxattr(mnt, CKFS_STATS_XATTR, buf, sizeof(buf) - 1);
	if (n < 0) {
		if (errno == ENODATA || errno == ENOTSUP)
			ckfs_cli_say("'%s': not a ckfs mount", mnt);
		else if (errno == ENOTCONN)
			ckfs_cli_say("'%s': the daemon is gone (transport endpoint is not "
				     "connected); run 'ckfs umount %s'", mnt, mnt);
		else
			ckfs_cli_say("'%s': %s", mnt, strerror(errno));
		return 1;
	}
	buf[n] = '\0';
	if (json) {
		fputs(buf, stdout);
		return 0;
	}
	cJSON *o = cJSON_Parse(buf);
	if (!o) {
		ckfs_cli_say("'%s': unreadable statistics", mnt);
		return 1;
	}
	print_stats(o);
	cJSON_Delete(o);
	return 0;
}
