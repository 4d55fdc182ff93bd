/* SPDX-License-Identifier: MIT */
/*
 * The counters a mount reports, named once (private to src/fuse and
 * src/cli/stats.c): each row is a key of the JSON the daemon answers in
 * the root's user.ckfs.stats xattr, and, when it has a metric name, a
 * Prometheus metric of `ckfs stats --prometheus` with its type and help.
 * The daemon writes the JSON from these rows (src/fuse/counters.c);
 * `ckfs stats` reads it back by the same rows (src/cli/stats.c).
 *
 * The JSON of a mount: {"source", then the head the tree writes ("pid",
 * "files", "uptime_s"; a run's "run", "latest", its plans), the counters
 * below in this order, then a run's "steps" (one object a step, keyed by
 * the step rows)}. Keys only ever get added: scripts read them.
 */
#ifndef CKFS_FUSE_COUNTERS_H
#define CKFS_FUSE_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

struct ckfs_strbuf;

struct ckfs_stat_row {
	const char *key;    /* the JSON key */
	const char *metric; /* the Prometheus metric, or NULL: JSON only */
	const char *type;   /* "counter" or "gauge" */
	const char *help;   /* the same on every mount (the textfile collector
			     * merges one metric from several files only then) */
};

/* A mount's rows: the counters every mount writes in this order, then
 * the ones a tree writes in its head. */
enum ckfs_stat {
	CKFS_STAT_HITS,
	CKFS_STAT_MISSES,
	CKFS_STAT_WAITS,
	CKFS_STAT_EVICTIONS,
	CKFS_STAT_FILLS,
	CKFS_STAT_FILL_ERRORS,
	CKFS_STAT_BYTES_FILLED,
	CKFS_STAT_BYTES_CACHED,
	CKFS_STAT_SLICES_CACHED,
	CKFS_STAT_BUDGET,
	CKFS_STAT_SLICE_SIZE,
	CKFS_STAT_PREFETCH_QUEUED,
	CKFS_STAT_PREFETCH_DROPPED,
	CKFS_STAT_PREFETCH_HITS,
	CKFS_STAT_RECYCLED,
	CKFS_STAT_READAHEAD_SEQUENTIAL,
	CKFS_STAT_READAHEAD_SLICES,
	CKFS_STAT_READAHEAD_SKIPPED,
	CKFS_STAT_READAHEAD_STORED,
	CKFS_STAT_READAHEAD_ROWS,
	CKFS_STAT_SOURCE_BYTES_READ,
	CKFS_STAT_READS,
	CKFS_STAT_BYTES_READ,
	CKFS_STAT_OPENS,
	CKFS_STAT_ERRORS,
	CKFS_STAT_SHARED_SLICES,
	CKFS_STAT_SHARED_BYTES,
	CKFS_STAT_BYTES_SAVED,
	CKFS_STAT_BYTES_HASHED,
	CKFS_STAT_STORE_REQUESTS,
	CKFS_STAT_STORE_RETRIES,
	CKFS_STAT_STORE_BYTES,
	CKFS_STAT_PRELOAD_BYTES,
	CKFS_STAT_PRELOAD_STORED,
	CKFS_STAT_PRELOAD_SKIPPED,
	CKFS_STAT_PRELOAD_ERRORS,
	CKFS_STAT_PRELOAD_DONE,
	CKFS_STAT_SLICE_MEMORY,
	CKFS_STAT_RSS,
	CKFS_STAT_RSS_ANON,
	CKFS_STAT_COUNTERS,         /* the rows above: every mount, in this order */
	CKFS_STAT_FILES = CKFS_STAT_COUNTERS,
	CKFS_STAT_UPTIME,
	CKFS_STAT_STEPS_SHOWN,      /* a run's */
	CKFS_STAT_PLANS_CACHED,
	CKFS_STAT_PLANS_OPEN,
	CKFS_STAT_MAX_PLANS,
	CKFS_STAT_ROWS
};
extern const struct ckfs_stat_row ckfs_stat_rows[CKFS_STAT_ROWS];

/* A run's rows per step, in the order they are written. */
enum ckfs_step_stat {
	CKFS_STEP_PLANS_CACHED,
	CKFS_STEP_PLANS_BUILT,
	CKFS_STEP_PLAN_ERRORS,
	CKFS_STEP_OPENS,
	CKFS_STEP_READS,
	CKFS_STEP_BYTES_READ,
	CKFS_STEP_ERRORS,
	CKFS_STEP_ROWS
};
extern const struct ckfs_stat_row ckfs_step_stat_rows[CKFS_STEP_ROWS];

/* The key of a row: CKFS_KEY(HITS) is "hits". */
#define CKFS_KEY(name) (ckfs_stat_rows[CKFS_STAT_##name].key)
#define CKFS_STEP_KEY(name) (ckfs_step_stat_rows[CKFS_STEP_##name].key)

/* ,"key":v of each of the n rows, the values v[0..n). */
void ckfs_stats_put(struct ckfs_strbuf *b, const struct ckfs_stat_row *rows, size_t n,
		    const uint64_t *v);

/* The JSON a mount answers in user.ckfs.stats: {"source", the tree's head,
 * the counters, the tree's tail}. */
struct ckfs_fs;
void ckfs_stats_json(struct ckfs_fs *fs, struct ckfs_strbuf *b);
/* ,"pid":the daemon's and ,"uptime_s":seconds since the mount became
 * ready: for the trees' heads. */
void ckfs_stats_put_pid(struct ckfs_strbuf *b);
void ckfs_stats_put_uptime(struct ckfs_fs *fs, struct ckfs_strbuf *b);

#endif
