/* SPDX-License-Identifier: MIT */
/*
 * A training run as verl writes it (src/layouts/run.c): a folder holding
 * global_step_<N>/ folders, each with one checkpoint per role (actor/,
 * critic/), and latest_checkpointed_iteration.txt naming the last step
 * saved whole. Discovery looks at names, the tracker file and stat(2)
 * only: no rank file is opened. The rules (docs/formats.md, "Runs"):
 *
 *  - A step name is "global_step_" and a decimal number without sign,
 *    spaces or leading zeros ("global_step_0" is step 0), at most
 *    CKFS_RUN_MAX_STEP. Any other name that starts with "global_step_"
 *    (global_step_007, global_step_1a, global_step_99999999999999999999)
 *    is ignored, never served, and listed with its reason by inspect.
 *  - The tracker holds one such number, optionally surrounded by ASCII
 *    white space, nothing else. A tracker that does not parse keeps the
 *    last value that did (verl rewrites it in place, so it may be read
 *    empty); with no good value yet, no step is shown.
 *  - With a tracker, a step is complete when its number is at most the
 *    tracker's: verl writes the tracker only after the step is saved.
 *  - Without one, every step but the newest is complete (a trainer saves
 *    one step at a time), and the newest is complete once no file under
 *    it has changed for CKFS_RUN_QUIET_S seconds.
 *  - A complete step with no role folder (rotated away) is left out.
 */
#ifndef CKFS_RUN_H
#define CKFS_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ckfs/err.h"

#define CKFS_RUN_TRACKER "latest_checkpointed_iteration.txt"
#define CKFS_RUN_STEP_PREFIX "global_step_"
/* The largest step number accepted: 2^53, exactly representable where
 * verl (Python int) or a JSON reader round-trips it. */
#define CKFS_RUN_MAX_STEP (UINT64_C(1) << 53)
/* Seconds without a change after which a run's newest step counts as
 * complete when the run has no tracker file. */
#define CKFS_RUN_QUIET_S 10

enum ckfs_step_name {
	CKFS_STEP_NAME_NONE,   /* not "global_step_..." */
	CKFS_STEP_NAME_OK,     /* a step; *step set */
	CKFS_STEP_NAME_BAD,    /* "global_step_..." refused; *why set */
};
/* Classify a folder entry's name. */
enum ckfs_step_name ckfs_run_step_name(const char *name, uint64_t *step, const char **why);

/* The tracker's text (len bytes): CKFS_OK with *step, or CKFS_E_FORMAT
 * naming label and the cause. */
enum ckfs_code ckfs_run_parse_tracker(const char *label, const char *text, size_t len,
				      uint64_t *step, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* What a folder is, by names alone. */
enum ckfs_run_kind {
	CKFS_RUN_NOT,          /* a plain checkpoint folder (or nothing ckfs knows) */
	CKFS_RUN_RUN,          /* holds the tracker or a global_step_* folder */
	CKFS_RUN_STEP,         /* is a global_step_<N> folder (its roles below)
				* holding none of the names a checkpoint is
				* detected by (docs/formats.md) */
};
/* For SRC (an existing folder); listing failures give CKFS_RUN_NOT, and the
 * checkpoint reader then reports them. */
enum ckfs_run_kind ckfs_run_kind(const char *src);

enum ckfs_step_state {
	CKFS_STEP_SHOWN,
	CKFS_STEP_AHEAD,       /* newer than the tracker's step */
	CKFS_STEP_NO_TRACKER,  /* the tracker exists but never parsed */
	CKFS_STEP_WRITING,     /* no tracker: newest, changed within the quiet time */
	CKFS_STEP_EMPTY,       /* complete, but no role folder left (rotated away:
				* verl removes global_step_<N>/actor, not the step) */
};
const char *ckfs_step_state_name(enum ckfs_step_state s);

struct ckfs_run_step {
	uint64_t step;
	char name[40];             /* global_step_<N> */
	enum ckfs_step_state state;
	struct timespec newest;    /* no tracker, newest step: newest mtime below */
	struct timespec mtime;     /* of the step folder */
	size_t n_roles;            /* role folders (ckfs_run_roles) */
	uint64_t roles_hash;       /* of their names, folders' inodes and mtimes:
				    * a step whose roles changed is a new step */
};
struct ckfs_run_ignored {
	char name[64];             /* printable, cut */
	const char *why;
};
struct ckfs_run_scan {
	struct timespec mtime;     /* of the run folder */
	bool has_tracker;          /* the file exists */
	bool tracker_ok;           /* tracker holds a value (now or before) */
	uint64_t tracker;
	char tracker_error[1100];   /* why the file read now did not parse; "" */
	struct ckfs_run_step *steps; /* by step number */
	size_t n_steps;
	struct ckfs_run_ignored *ignored;
	size_t n_ignored;
};

/*
 * List the run folder src: its step folders (sorted), the names refused,
 * the tracker (prev, when not NULL and tracker_ok, supplies the value kept
 * when the file does not parse now), and for a run without tracker the
 * newest mtime under its newest step. States are left to
 * ckfs_run_classify. Out of memory and an unlistable src fail.
 */
enum ckfs_code ckfs_run_scan(const char *src, const struct ckfs_run_scan *prev,
			     struct ckfs_run_scan *out, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Set every step's state by the rules above, at time now (CLOCK_REALTIME).
 * Returns the seconds until the newest step of a run without tracker may
 * become complete (0: nothing pending). Pure: no file is touched. */
long ckfs_run_classify(struct ckfs_run_scan *s, const struct timespec *now);
void ckfs_run_scan_release(struct ckfs_run_scan *s);
/* `latest`: the step the tracker names, when shown; without a tracker
 * file, the newest step shown; NULL otherwise. */
const struct ckfs_run_step *ckfs_run_latest(const struct ckfs_run_scan *s);

/* The role folders of a step folder: its sub-folders whose names do not
 * start with '.', sorted; a malloc'd array of malloc'd names. */
enum ckfs_code ckfs_run_roles(const char *step_dir, char ***names, size_t *n,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_run_roles_free(char **names, size_t n);

struct ckfs_model;
struct ckfs_model_options;
/* Open the checkpoint of role folder role_dir as `ckfs export role_dir`
 * would, after the run's symlink policy: unless opt->follow_symlinks,
 * role_dir must resolve inside src, the run (or step) the user named
 * (CKFS_E_INVALID "symlink leads outside the checkpoint" otherwise), as
 * any file a checkpoint names must. */
enum ckfs_code ckfs_run_open_role(const char *src, const char *role_dir,
				  const struct ckfs_model_options *opt,
				  struct ckfs_model **out, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A fingerprint of everything under dir (relative names, types, sizes,
 * mtimes; sorted, 8 levels deep at most): equal fingerprints mean a plan
 * built before still describes the folder. Sets *newest to the newest
 * mtime seen when not NULL. */
enum ckfs_code ckfs_run_fingerprint(const char *dir, uint64_t *fp, struct timespec *newest,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
