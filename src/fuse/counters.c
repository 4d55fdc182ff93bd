/* SPDX-License-Identifier: MIT */
/*
 * The counters a mount reports (src/fuse/counters.h): the one table of
 * their names, and the JSON the daemon writes from it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/remote.h"
#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/tree.h"

const struct ckfs_stat_row ckfs_stat_rows[CKFS_STAT_ROWS] = {
	[CKFS_STAT_HITS] = { "hits", "ckfs_cache_hits_total", "counter",
			     "Slice lookups found ready in the slice cache." },
	[CKFS_STAT_MISSES] = { "misses", "ckfs_cache_misses_total", "counter",
			       "Slice lookups that needed a fill." },
	[CKFS_STAT_WAITS] = { "waits", "ckfs_cache_waits_total", "counter",
			      "Slice lookups that waited on another thread's fill." },
	[CKFS_STAT_EVICTIONS] = { "evictions", "ckfs_cache_evictions_total", "counter",
				  "Slices evicted from the slice cache." },
	[CKFS_STAT_FILLS] = { "fills", "ckfs_cache_fills_total", "counter",
			      "Slices assembled from the sources." },
	[CKFS_STAT_FILL_ERRORS] = { "fill_errors", "ckfs_cache_fill_errors_total", "counter",
				    "Slice fills that failed (a source changed or could not "
				    "be read)." },
	[CKFS_STAT_BYTES_FILLED] = { "bytes_filled", "ckfs_cache_filled_bytes_total", "counter",
				     "Bytes of slices assembled from the sources." },
	[CKFS_STAT_BYTES_CACHED] = { "bytes_cached", "ckfs_cache_bytes", "gauge",
				     "Bytes held by the slice cache." },
	[CKFS_STAT_SLICES_CACHED] = { "slices_cached", "ckfs_cache_slices", "gauge",
				      "Slices held by the slice cache." },
	[CKFS_STAT_BUDGET] = { "budget", "ckfs_cache_budget_bytes", "gauge",
			       "The slice cache's budget in bytes." },
	[CKFS_STAT_SLICE_SIZE] = { "slice_size", "ckfs_cache_slice_bytes", "gauge",
				   "The size of a cache slice in bytes." },
	[CKFS_STAT_PREFETCH_QUEUED] = { "prefetch_queued", "ckfs_prefetch_queued_total", "counter",
					"Slices queued for read-ahead." },
	[CKFS_STAT_PREFETCH_DROPPED] = { "prefetch_dropped", "ckfs_prefetch_dropped_total",
					 "counter",
					 "Read-ahead slices dropped because the "
					 "queue was full." },
	[CKFS_STAT_PREFETCH_HITS] = { "prefetch_hits", "ckfs_prefetch_hits_total", "counter",
				      "Read-ahead slices that were later read." },
	[CKFS_STAT_RECYCLED] = { "recycled", "ckfs_cache_recycled_total", "counter",
				 "Fills that reused the buffer of a slice already served." },
	[CKFS_STAT_READAHEAD_SEQUENTIAL] = { "readahead_sequential",
					     "ckfs_readahead_sequential_reads_total", "counter",
					     "Reads judged sequential." },
	[CKFS_STAT_READAHEAD_SLICES] = { "readahead_slices", "ckfs_readahead_slices_total",
					 "counter", "Slices handed to read-ahead." },
	[CKFS_STAT_READAHEAD_SKIPPED] = { "readahead_skipped", "ckfs_readahead_skipped_total",
					  "counter",
					  "Slices read-ahead left alone: the kernel "
					  "already had them." },
	[CKFS_STAT_READAHEAD_STORED] = { "readahead_stored", "ckfs_readahead_stored_bytes_total",
					 "counter",
					 "Bytes read-ahead stored into the kernel's page "
					 "cache (an s3:// source's streaming readers)." },
	[CKFS_STAT_READAHEAD_ROWS] = { "readahead_rows", "ckfs_readahead_rows_total", "counter",
				       "Pieces of rows stored into the kernel's page cache "
				       "ahead of a reader of a piece of every row (an s3:// "
				       "source's streaming readers)." },
	[CKFS_STAT_SOURCE_BYTES_READ] = { "source_bytes_read", "ckfs_source_read_bytes_total",
					  "counter",
					  "Bytes of checkpoint files read to serve "
					  "data since the mount became ready." },
	[CKFS_STAT_READS] = { "reads", "ckfs_reads_total", "counter", "FUSE read requests." },
	[CKFS_STAT_BYTES_READ] = { "bytes_read", "ckfs_read_bytes_total", "counter",
				   "Bytes replied to read requests." },
	[CKFS_STAT_OPENS] = { "opens", "ckfs_opens_total", "counter", "Files opened." },
	[CKFS_STAT_ERRORS] = { "errors", "ckfs_read_errors_total", "counter",
			       "Read requests answered with an error." },
	[CKFS_STAT_SHARED_SLICES] = { "shared_slices", "ckfs_cache_shared_slices_total", "counter",
				      "Fills whose bytes a slice held already had: held once." },
	[CKFS_STAT_SHARED_BYTES] = { "shared_bytes", "ckfs_cache_shared_bytes_total", "counter",
				     "Bytes of those fills." },
	[CKFS_STAT_BYTES_SAVED] = { "bytes_saved", "ckfs_cache_saved_bytes", "gauge",
				    "Bytes the slice cache would hold more if it held equal "
				    "slices apart." },
	[CKFS_STAT_BYTES_HASHED] = { "bytes_hashed", "ckfs_cache_hashed_bytes_total", "counter",
				     "Bytes of fills hashed to fingerprint them (share)." },
	[CKFS_STAT_STORE_REQUESTS] = { "store_requests", "ckfs_store_requests_total", "counter",
				       "Requests sent to the object store of s3:// sources "
				       "(since the daemon started: the mount's own included)." },
	[CKFS_STAT_STORE_RETRIES] = { "store_retries", "ckfs_store_retries_total", "counter",
				      "Of those, attempts repeated after a failure." },
	[CKFS_STAT_STORE_BYTES] = { "store_bytes", "ckfs_store_received_bytes_total", "counter",
				    "Bytes received from the object store." },
	[CKFS_STAT_PRELOAD_BYTES] = { "preload_bytes", "ckfs_preload_target_bytes", "gauge",
				      "Bytes of weight files the preload set out to store "
				      "(0: no preload)." },
	[CKFS_STAT_PRELOAD_STORED] = { "preload_stored", "ckfs_preload_stored_bytes_total",
				       "counter",
				       "Bytes the preload stored into the kernel's "
				       "page cache." },
	[CKFS_STAT_PRELOAD_SKIPPED] = { "preload_skipped", "ckfs_preload_skipped_bytes_total",
					"counter",
					"Bytes the preload left alone: reads had "
					"sent them to the kernel." },
	[CKFS_STAT_PRELOAD_ERRORS] = { "preload_errors", "ckfs_preload_errors_total", "counter",
				       "Slices the preload could not assemble or store (it "
				       "stops at the first)." },
	[CKFS_STAT_PRELOAD_DONE] = { "preload_done", "ckfs_preload_done", "gauge",
				     "1 once the preload has stopped: all stored, or an "
				     "error." },
	[CKFS_STAT_SLICE_MEMORY] = { "slice_memory", "ckfs_cache_memory_bytes", "gauge",
				     "Bytes of slice buffers mapped: the slices cached, "
				     "being filled and kept for the next fills." },
	[CKFS_STAT_RSS] = { "rss", "ckfs_resident_bytes", "gauge",
			    "The daemon's resident memory (VmRSS)." },
	[CKFS_STAT_RSS_ANON] = { "rss_anon", "ckfs_resident_anon_bytes", "gauge",
				 "The daemon's resident anonymous memory (RssAnon): its "
				 "heap and slice buffers, not mapped files." },
	[CKFS_STAT_FILES] = { "files", "ckfs_files", "gauge", "Files in the served folder." },
	[CKFS_STAT_UPTIME] = { "uptime_s", "ckfs_uptime_seconds", "gauge",
			       "Seconds since the mount became ready." },
	[CKFS_STAT_STEPS_SHOWN] = { "steps_shown", NULL, NULL, NULL },
	[CKFS_STAT_PLANS_CACHED] = { "plans_cached", NULL, NULL, NULL },
	[CKFS_STAT_PLANS_OPEN] = { "plans_open", NULL, NULL, NULL },
	[CKFS_STAT_MAX_PLANS] = { "max_plans", NULL, NULL, NULL },
};

const struct ckfs_stat_row ckfs_step_stat_rows[CKFS_STEP_ROWS] = {
	[CKFS_STEP_PLANS_CACHED] = { "plans_cached", NULL, NULL, NULL },
	[CKFS_STEP_PLANS_BUILT] = { "plans_built", "ckfs_step_plans_built_total", "counter",
				    "Plans (model and folder) built for the step's roles." },
	[CKFS_STEP_PLAN_ERRORS] = { "plan_errors", NULL, NULL, NULL },
	[CKFS_STEP_OPENS] = { "opens", "ckfs_step_opens_total", "counter",
			      "Files of the step opened." },
	[CKFS_STEP_READS] = { "reads", "ckfs_step_reads_total", "counter",
			      "Read requests on the step's files." },
	[CKFS_STEP_BYTES_READ] = { "bytes_read", "ckfs_step_read_bytes_total", "counter",
				   "Bytes replied from the step's files." },
	[CKFS_STEP_ERRORS] = { "errors", "ckfs_step_read_errors_total", "counter",
			       "Reads of the step's files answered with an error." },
};

void ckfs_stats_put(struct ckfs_strbuf *b, const struct ckfs_stat_row *rows, size_t n,
		    const uint64_t *v)
{
	for (size_t i = 0; i < n; i++)
		ckfs_strbuf_fmt(b, ",\"%s\":%" PRIu64, rows[i].key, v[i]);
}

static uint64_t ld(atomic_uint_fast64_t *a)
{
	return (uint64_t)atomic_load(a);
}

/* The daemon's VmRSS and RssAnon in bytes, from /proc/self/status (0 when
 * it cannot be read). */
static void resident(uint64_t *rss, uint64_t *anon)
{
	char line[128];
	unsigned long long kb;
	FILE *f = fopen("/proc/self/status", "re");

	*rss = *anon = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			*rss = (uint64_t)kb << 10;
		else if (sscanf(line, "RssAnon: %llu kB", &kb) == 1)
			*anon = (uint64_t)kb << 10;
	}
	fclose(f);
}

static void counters_now(struct ckfs_fs *fs, uint64_t v[CKFS_STAT_COUNTERS])
{
	struct ckfs_cache_stats cs;
	struct ckfs_preload_stats ps;

	ckfs_cache_get_stats(fs->cache, &cs);
	v[CKFS_STAT_HITS] = cs.hits;
	v[CKFS_STAT_MISSES] = cs.misses;
	v[CKFS_STAT_WAITS] = cs.waits;
	v[CKFS_STAT_EVICTIONS] = cs.evictions;
	v[CKFS_STAT_FILLS] = cs.fills;
	v[CKFS_STAT_FILL_ERRORS] = cs.fill_errors;
	v[CKFS_STAT_BYTES_FILLED] = cs.bytes_filled;
	v[CKFS_STAT_BYTES_CACHED] = cs.bytes_cached;
	v[CKFS_STAT_SLICES_CACHED] = cs.slices_cached;
	v[CKFS_STAT_BUDGET] = cs.budget_bytes;
	v[CKFS_STAT_SLICE_SIZE] = fs->slice_size;
	v[CKFS_STAT_PREFETCH_QUEUED] = cs.prefetch_queued;
	v[CKFS_STAT_PREFETCH_DROPPED] = cs.prefetch_dropped;
	v[CKFS_STAT_PREFETCH_HITS] = cs.prefetch_hits;
	v[CKFS_STAT_RECYCLED] = cs.recycled;
	v[CKFS_STAT_READAHEAD_SEQUENTIAL] = ld(&fs->stats.ra_sequential);
	v[CKFS_STAT_READAHEAD_SLICES] = ld(&fs->stats.ra_slices);
	v[CKFS_STAT_READAHEAD_SKIPPED] = ld(&fs->stats.ra_skipped);
	v[CKFS_STAT_READAHEAD_STORED] = ld(&fs->stats.ra_stored);
	v[CKFS_STAT_READAHEAD_ROWS] = ld(&fs->stats.ra_rows);
	v[CKFS_STAT_SOURCE_BYTES_READ] = ckfs_source_bytes_read() - fs->source_bytes_at_ready;
	v[CKFS_STAT_READS] = ld(&fs->stats.io.n[CKFS_IO_READS]);
	v[CKFS_STAT_BYTES_READ] = ld(&fs->stats.io.n[CKFS_IO_BYTES_READ]);
	v[CKFS_STAT_OPENS] = ld(&fs->stats.io.n[CKFS_IO_OPENS]);
	v[CKFS_STAT_ERRORS] = ld(&fs->stats.io.n[CKFS_IO_ERRORS]);
	v[CKFS_STAT_SHARED_SLICES] = cs.shared_fills;
	v[CKFS_STAT_SHARED_BYTES] = cs.shared_bytes;
	v[CKFS_STAT_BYTES_SAVED] = cs.bytes_saved;
	v[CKFS_STAT_BYTES_HASHED] = cs.bytes_hashed;
	struct ckfs_s3_counts sc;
	ckfs_remote_counts(&sc);
	v[CKFS_STAT_STORE_REQUESTS] = sc.requests;
	v[CKFS_STAT_STORE_RETRIES] = sc.retries;
	v[CKFS_STAT_STORE_BYTES] = sc.bytes;
	ckfs_preload_get_stats(fs->preload, &ps);
	v[CKFS_STAT_PRELOAD_BYTES] = ps.target;
	v[CKFS_STAT_PRELOAD_STORED] = ps.stored;
	v[CKFS_STAT_PRELOAD_SKIPPED] = ps.skipped;
	v[CKFS_STAT_PRELOAD_ERRORS] = ps.errors;
	v[CKFS_STAT_PRELOAD_DONE] = ps.done;
	v[CKFS_STAT_SLICE_MEMORY] = cs.bytes_mapped;
	resident(&v[CKFS_STAT_RSS], &v[CKFS_STAT_RSS_ANON]);
}

void ckfs_stats_put_uptime(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ckfs_strbuf_fmt(b, ",\"%s\":%.3f", CKFS_KEY(UPTIME),
			(double)(now.tv_sec - fs->ready_at.tv_sec) +
				(double)(now.tv_nsec - fs->ready_at.tv_nsec) / 1e9);
}

void ckfs_stats_put_pid(struct ckfs_strbuf *b)
{
	ckfs_strbuf_fmt(b, ",\"pid\":%ld", (long)getpid());
}

void ckfs_stats_json(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	uint64_t v[CKFS_STAT_COUNTERS];

	ckfs_strbuf_str(b, "{\"source\":");
	ckfs_strbuf_json(b, fs->opt->src);
	fs->ops->stats_head(fs, b);
	counters_now(fs, v);
	ckfs_stats_put(b, ckfs_stat_rows, CKFS_STAT_COUNTERS, v);
	if (fs->ops->stats_tail)
		fs->ops->stats_tail(fs, b);
	ckfs_strbuf_str(b, "}\n");
}
