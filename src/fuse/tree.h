/* SPDX-License-Identifier: MIT */
/*
 * The FUSE front end over a tree strategy (private to src/fuse), the way
 * squashfuse keeps one handler set over an inode-map strategy.
 *
 * One set of handlers (ll_ops.c) answers every mount. What an inode is
 * comes from the mount's tree, through resolve(ino) -> struct ckfs_at:
 * a served folder or one of its nodes (struct ckfs_served: its files are
 * read, listed and shown by the handlers themselves), or a folder or
 * symlink the tree makes of its own (a run's top, its steps, its latest),
 * whose attributes the tree fills and whose names it lists. Two trees:
 *
 *   checkpoint_tree.c   one checkpoint: the root is the served folder,
 *                       node i is inode i + 2, all fixed at mount
 *   run_tree.c          a training run (or one step of it): the top lists
 *                       the steps and latest, a step its roles, a role is
 *                       the served folder of its plan, built on first use
 *                       (run_plans.c) and listed again as the run changes
 *                       (run_watch.c)
 *
 * A served folder's node i is inode top + 1 + i, top being the inode of
 * the served folder itself; so a handler finds a child's inode, and its
 * attributes, without asking the tree again.
 *
 * References. resolve may hand out a reference on at->served (a run's plan
 * must outlive the request even when evicted meanwhile); every handler
 * drops it with ckfs_fs_put before returning, except open, whose file
 * handle keeps it until release.
 */
#ifndef CKFS_FUSE_TREE_H
#define CKFS_FUSE_TREE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/cache.h"
#include "ckfs/err.h"
#include "fuse/fs.h"
#include "fuse/preload.h"
#include "fuse/served.h"

/* Kernel cache timeouts, seconds. What never changes while mounted (a
 * checkpoint, a step's roles, a role's files) is kept a day; what does
 * (a run's top, latest, a role that cannot be served yet) a second. */
#define CKFS_TIMEOUT_FIXED 86400.0
#define CKFS_TIMEOUT_CHANGING 1.0
/* st_blksize: cp and friends size their buffers from it. */
#define CKFS_BLKSIZE (1u << 20)

enum ckfs_at_kind {
	CKFS_AT_SERVED,             /* a served folder (node NULL) or one of its nodes */
	CKFS_AT_DIR,                /* a folder of the tree's own */
	CKFS_AT_LINK,               /* a symlink of the tree's own */
};

/* What an inode is now. */
struct ckfs_at {
	enum ckfs_at_kind kind;
	uint64_t ino;
	bool fixed;                 /* its names and attributes never change */
	struct ckfs_served *served; /* SERVED: a reference, see ckfs_fs_put */
	const struct ckfs_node *node; /* SERVED: NULL for the served folder itself */
	uint64_t top;               /* SERVED: the served folder's inode */
	uint64_t parent;            /* the served folder's and DIR's "..": an inode */
	struct stat st;             /* DIR, LINK: the attributes (filled by the tree) */
	char link[64];              /* LINK: the target */
};

/* The entries of a folder of the tree's own, "." and ".." left out. */
struct ckfs_list {
	size_t n, cap;
	struct ckfs_list_entry {
		char *name;
		uint64_t ino;
		mode_t type;            /* S_IFDIR, S_IFLNK */
		bool lazy;              /* no attributes in a listing: they cost a
					 * plan; the kernel looks it up when used */
	} *e;
};
/* Append an entry: 0, or ENOMEM. */
int ckfs_list_add(struct ckfs_list *l, const char *name, uint64_t ino, mode_t type, bool lazy);
void ckfs_list_free(struct ckfs_list *l);

struct ckfs_fs;
struct fuse_session;
struct ckfs_strbuf;

/* A tree: the inode map the handlers serve. Errors are errno values. */
struct ckfs_tree_ops {
	/* What ino is now (*at filled): 0, or ENOENT (or ENOMEM). */
	int (*resolve)(struct ckfs_fs *fs, uint64_t ino, struct ckfs_at *at);
	/* Drop a reference resolve or file handed out. */
	void (*put)(struct ckfs_fs *fs, struct ckfs_served *s);
	/* The entries of a folder of the tree's own (lookups search them:
	 * such folders are small). */
	int (*list)(struct ckfs_fs *fs, const struct ckfs_at *dir, struct ckfs_list *l);
	/* The served folder holding cache file file_id, with a reference;
	 * NULL (err set) when it is no longer served. */
	struct ckfs_served *(*file)(struct ckfs_fs *fs, uint64_t file_id, struct ckfs_error *err);
	/* The stats JSON (src/fuse/counters.h): what comes after "source"
	 * and before the counters, and after them (NULL: nothing). */
	void (*stats_head)(struct ckfs_fs *fs, struct ckfs_strbuf *b);
	void (*stats_tail)(struct ckfs_fs *fs, struct ckfs_strbuf *b);
	/* The "serving ..." line, once ready. */
	void (*log_serving)(struct ckfs_fs *fs, const char *cache_size);
	/* Once mounted (NULL: nothing): start watching; stop before the
	 * session goes. */
	enum ckfs_code (*start)(struct ckfs_fs *fs, struct fuse_session *se,
				struct ckfs_error *err);
	void (*stop)(struct ckfs_fs *fs);
	/* Free the tree (fs included); the cache is already gone. */
	void (*free)(struct ckfs_fs *fs);
};

/* Counters of the front end; the cache keeps its own. */
struct ckfs_fs_stats {
	struct ckfs_io_counters io;
	atomic_uint_fast64_t ra_sequential; /* reads seen as sequential */
	atomic_uint_fast64_t ra_slices;     /* slices handed to prefetch */
	atomic_uint_fast64_t ra_skipped;    /* not handed: the kernel has them */
	atomic_uint_fast64_t ra_stored;     /* bytes stored into the page cache
					     * ahead of a stream (read_stream.c) */
	atomic_uint_fast64_t ra_rows;       /* pieces of rows stored ahead of a
					     * reader of every row's piece */
};

/* A mount: the handlers' userdata, the first member of its tree's state.
 * Immutable once serving but for the counters, ra_pending and
 * reads_in_flight (preload is set by the tree's start, before the loop). */
struct ckfs_fs {
	const struct ckfs_tree_ops *ops;
	const struct ckfs_mount_options *opt;
	struct ckfs_cache *cache;
	bool share_slices;          /* the cache holds equal slices once */
	size_t slice_size;
	uid_t uid;                  /* the owner shown */
	gid_t gid;
	uint64_t statfs_bytes;      /* what statfs reports: a checkpoint's */
	uint64_t statfs_files;      /* totals; a run's are 0 */
	pthread_key_t scratch_key;  /* per-thread struct ckfs_read_scratch */
	bool scratch_key_made;
	struct ckfs_fs_stats stats;
	uint64_t source_bytes_at_ready; /* ckfs_source_bytes_read() then */
	struct timespec ready_at;   /* CLOCK_MONOTONIC */
	/* /sys/class/bdi/<dev>/read_ahead_kb to set to opt->kernel_readahead_kb
	 * once the kernel has taken the INIT reply (which would lower it
	 * again); ra_pending says it is still to do. */
	char bdi_ra_path[96];
	int bdi_ra_fd;                 /* open for the first request's write, or -1 */
	atomic_bool ra_pending;
	/* READ requests being answered: the preload starts no slice while
	 * there are any (the loader first). */
	atomic_int reads_in_flight;
	struct ckfs_preload *preload; /* set by a tree's start, or NULL */
	/* An s3:// source read with the default read-ahead: reads follow the
	 * reader (read_stream.c), the kernel's readahead is off. */
	bool stream;
	struct fuse_session *se; /* set by ckfs_fs_start: stores ahead */
	atomic_int storing;      /* READs storing ahead now (bounded) */
};

/* A run of contiguous reads of one handle (read_stream.c). */
struct ckfs_stream {
	uint64_t start; /* where the run began */
	uint64_t next;  /* end of what it was replied or stored */
	uint64_t trip;  /* the page left out of the latest store, or
			 * UINT64_MAX */
	uint64_t used;  /* LRU tick; 0: free */
	bool big;       /* through whole slices (read_stream.c) */
};
enum {
	CKFS_STREAMS = 4
};

/* A reader of the same piece of every row of a tensor (read_stream.c):
 * the piece of row i starts at origin + i row + a_lo or later and ends
 * by origin + i row + b_hi, as far as the rows done before cur tell. */
struct ckfs_rows {
	uint64_t row;             /* the tensor's row, bytes; 0: no such reader */
	uint64_t t_end;           /* the tensor's end */
	uint64_t origin;          /* the first page read of row 0 (a_lo >= -PAGE) */
	int64_t a_lo, b_hi;       /* b_hi INT64_MAX: not known yet */
	uint64_t cur;             /* the row being read */
	uint64_t cur_lo, cur_end; /* the pages of it read so far */
	uint64_t ahead;           /* the last row stored ahead (or read) */
	unsigned window;          /* rows to store at the next READ */
	uint64_t used;            /* LRU tick */
};

/* Per open file (fi->fh): what it reads and its read-ahead state. */
struct ckfs_handle {
	struct ckfs_served *served; /* a reference, dropped at release */
	size_t node;
	uint64_t file_id;           /* in the slice cache */
	bool direct;                /* opened O_DIRECT: replies bypass the
				     * kernel's page cache (read_reply.c) */
	pthread_mutex_t lock;       /* protects the fields below */
	uint64_t prev_end;          /* end of the latest sequential read */
	uint64_t slice;             /* slice holding the latest read's end */
	uint64_t ra_next;           /* first slice not yet queued */
	unsigned window;            /* read-ahead window, slices; 0 = random */
	bool seen;                  /* a read happened on this handle */
	uint64_t ino;               /* the kernel's inode (stores ahead) */
	/* fs->stream: the runs being read (several threads of one reader
	 * each walk their own part) */
	struct ckfs_stream streams[CKFS_STREAMS];
	uint64_t tick;
	/* fs->stream: readers of a piece of every row (each thread of a
	 * reader may walk its own rows) */
	struct ckfs_rows rows[CKFS_STREAMS];
};

/* ---- fs.c: a mount's life ---- */

/* The fields every tree sets the same way (the owner shown, the options). */
void ckfs_fs_init(struct ckfs_fs *fs, const struct ckfs_tree_ops *ops,
		  const struct ckfs_mount_options *opt);
/* Open the tree opt->src asks for: a run or one of its steps, else one
 * checkpoint (built as `ckfs export` builds it). Starts no thread but
 * those the model's checks may run. *out NULL on failure. */
enum ckfs_code ckfs_fs_open(const struct ckfs_mount_options *opt, struct ckfs_fs **out,
			    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The slice cache and its read-ahead workers (they inherit the caller's
 * signal mask), and the per-thread scratch. */
enum ckfs_code ckfs_fs_start_cache(struct ckfs_fs *fs, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Mounted, before the sandbox: the kernel readahead of mount point mnt
 * planned (its sysfs file opened now, written on the first request). */
void ckfs_fs_plan_kernel_readahead(struct ckfs_fs *fs, const char *mnt);
/* Serving begins: mark the moment (baseline of the counters), start the
 * tree's watch. */
enum ckfs_code ckfs_fs_start(struct ckfs_fs *fs, struct fuse_session *se,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stop the tree's watch; NULL ignored. */
void ckfs_fs_stop(struct ckfs_fs *fs);
/* Stop the read-ahead workers, free everything; no request may be in
 * flight. NULL ignored. */
void ckfs_fs_free(struct ckfs_fs *fs);
/* Drop a reference on s (NULL ignored). */
void ckfs_fs_put(struct ckfs_fs *fs, struct ckfs_served *s);
/* Set the kernel readahead when still to do (see ckfs_fs_start): every
 * request after INIT may, the first one does. */
void ckfs_fs_apply_kernel_readahead(struct ckfs_fs *fs);
/* This thread's scratch for the core read path (NULL when out of memory). */
struct ckfs_read_scratch *ckfs_fs_scratch(struct ckfs_fs *fs);
/* Add n to counter io of the mount and of s's step, if it has one. */
void ckfs_fs_count(struct ckfs_fs *fs, const struct ckfs_served *s, enum ckfs_io io,
		   uint64_t n);

/* Attributes: of node n of s (NULL: its folder), and of a tree's own
 * folder (subdirs folders inside) and symlink (to len bytes), all owned
 * by the owner shown and timed mtime. */
void ckfs_fs_stat_served(const struct ckfs_fs *fs, const struct ckfs_served *s,
			 const struct ckfs_node *n, uint64_t ino, struct stat *st);
void ckfs_fs_stat_dir(const struct ckfs_fs *fs, uint64_t ino, mode_t mode, nlink_t subdirs,
		      struct timespec mtime, struct stat *st);
void ckfs_fs_stat_link(const struct ckfs_fs *fs, uint64_t ino, size_t len,
		       struct timespec mtime, struct stat *st);

/* ---- read_reply.c: answering READ ---- */

struct fuse_req;
/* Bytes [off, off + len) of h's file replied to req, counted; len ends
 * before the file does. On failure nothing is replied (err set): the
 * caller answers. */
enum ckfs_code ckfs_fs_reply_read(struct fuse_req *req, struct ckfs_fs *fs,
				  struct ckfs_handle *h, uint64_t off, size_t len,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The bytes [off, end) of h's weight file were handed to the kernel
 * (replied or stored): counted per slice in replied (read_reply.c). */
void ckfs_fs_note_replied(struct ckfs_fs *fs, _Atomic uint32_t *replied, uint64_t size,
			  uint64_t off, uint64_t end);
/* Reply [off, off + len) of h's weight file from the slice cache; ahead:
 * with the windowed read-ahead of read_reply.c. */
enum ckfs_code ckfs_fs_reply_slices(struct fuse_req *req, struct ckfs_fs *fs, struct ckfs_handle *h,
				    uint64_t off, size_t len, bool ahead,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* read_stream.c: a READ of a weight file of a streaming mount (fs->stream,
 * not O_DIRECT). */
enum ckfs_code ckfs_fs_reply_stream(struct fuse_req *req, struct ckfs_fs *fs, struct ckfs_handle *h,
				    uint64_t off, size_t len,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The slice cache's fill: bytes of cache file file_id from its sources. */
enum ckfs_code ckfs_fs_fill(void *ctx, uint64_t file_id, uint64_t offset, size_t len,
			    void *buf, struct ckfs_error *err);

/* ---- the trees ---- */

enum ckfs_code ckfs_checkpoint_tree_open(const struct ckfs_mount_options *opt,
					 struct ckfs_fs **out,
					 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* single: SRC is one global_step_<N> folder. Lists the run, reads no rank
 * file. */
enum ckfs_code ckfs_run_tree_open(const struct ckfs_mount_options *opt, bool single,
				  struct ckfs_fs **out, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* The low-level operations table (ll_ops.c); userdata: the struct ckfs_fs. */
struct fuse_lowlevel_ops;
extern const struct fuse_lowlevel_ops ckfs_ll_ops;

#endif
