/* SPDX-License-Identifier: MIT */
/*
 * Command-line options as data (git's parse-options is the model): each
 * command declares its options once, in one table, and the parser, the
 * mount's -o keys, --help (and the man page and shell completion made
 * from the same tables) all come from it, so they cannot disagree.
 */
#ifndef CKFS_CLI_OPTIONS_H
#define CKFS_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdio.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"

/* What an option sets; each command's apply() switches on it. */
enum cli_opt_id {
	/* options of several commands (cli_apply_common) */
	OPT_DTYPE = 1, OPT_MAX_SHARD_SIZE, OPT_CONFIG, OPT_FOLLOW_SYMLINKS, OPT_RAW_NAMES,
	OPT_LOG_LEVEL, OPT_JSON, OPT_LORA, OPT_BASE, OPT_LORA_ALPHA, OPT_RSLORA,
	OPT_QUANT_SKIP,
	OPT_RANK_CHECKS,
	OPT_TRANSFORMERS_VERSION,
	OPT_S3_ENDPOINT,
	OPT_S3_CACHE,
	OPT_FORMAT, OPT_MODEL_NAME,
	/* export */
	OPT_FORCE, OPT_EXPORT_THREADS, OPT_QUIET,
	/* verify */
	OPT_AGAINST, OPT_ATOL, OPT_RTOL,
	/* mount */
	OPT_FOREGROUND, OPT_DEBUG, OPT_MOUNT_OPTIONS, OPT_CACHE_SIZE, OPT_THREADS,
	OPT_READAHEAD, OPT_PREFETCH_THREADS, OPT_SLICE_SIZE, OPT_KERNEL_READAHEAD, OPT_UID,
	OPT_GID, OPT_UMASK, OPT_MAX_PLANS, OPT_SHARE_SLICES, OPT_S3_POLL, OPT_PRELOAD,
	OPT_PRELOAD_MAX, OPT_NOSANDBOX,
	/* umount */
	OPT_LAZY,
	/* stats */
	OPT_PROMETHEUS,
	/* diff, export --since */
	OPT_SVG,
	OPT_SINCE,
	OPT_PART,
	OPT_ID_END /* one past the last */
};

/* What an option's value is: the parser checks it by its kind, so each
 * command's apply() gets a value already known to be good. */
enum cli_kind {
	CLI_FLAG,   /* no value */
	CLI_TEXT,   /* a path, a regex: as given (choices, if any, are offered) */
	CLI_CHOICE, /* one of choices' words: value.n is its value */
	CLI_COUNT,  /* a whole number from lo to hi: value.n */
	CLI_SIZE,   /* bytes, "512MiB" or "5GB" (ckfs_parse_size), lo to hi: value.n */
	CLI_REAL,   /* a real number from 0: value.real */
	CLI_OCTAL,  /* an octal number from 0 to hi: value.n */
};

/* The words an option takes, with what each means: the parser looks a
 * value up here and the completion offers every word, so they cannot
 * disagree (tests/cli/test_docs.sh). The first word of each value is the
 * one help and messages name. NULL-terminated. */
struct cli_choice {
	const char *word;
	int value;
};

struct cli_opt {
	enum cli_opt_id id;
	const char *name;    /* long option without "--"; NULL: an -o key only */
	char letter;         /* short option, 0: none */
	const char *key;     /* the mount's -o key, NULL: none */
	const char *old_name, *old_key; /* former spellings, still taken */
	const char *arg;     /* the value's name in help ("T"); NULL: a flag */
	const char *help;    /* one line; "\n" starts another */
	enum cli_kind kind;
	const struct cli_choice *choices; /* CLI_CHOICE's words (CLI_TEXT: offered) */
	long long lo, hi;    /* CLI_COUNT, CLI_SIZE, CLI_OCTAL: the bounds */
	const char *def;     /* the default, applied before the command line and
			      * shown in help; NULL: none, or one help explains */
};

/* A value, parsed by its option's kind; text as given. */
struct cli_value {
	const char *text;
	long long n;
	double real;
};

struct cli_command {
	const char *name;       /* "export" */
	const char *args;       /* "SRC DIR" */
	int n_args;             /* positional arguments it takes */
	int n_optional;         /* and how many more it may take */
	const char *brief;      /* one line for `ckfs --help` */
	const char *about;      /* a paragraph for its --help */
	const struct cli_opt *const *opts; /* NULL-terminated; --help is implied */
	int (*run)(int argc, char **argv);
};

/* The commands, NULL-terminated (main.c), for `ckfs --help`, the man page
 * and completion. */
extern const struct cli_command *const ckfs_commands[];

/* Options several commands share, declared once. */
extern const struct cli_opt cli_opt_dtype, cli_opt_max_shard_size, cli_opt_config,
	cli_opt_follow_symlinks, cli_opt_raw_names, cli_opt_log_level, cli_opt_json, cli_opt_lora,
	cli_opt_base, cli_opt_lora_alpha, cli_opt_rslora, cli_opt_quant_skip, cli_opt_rank_checks,
	cli_opt_transformers_version, cli_opt_s3_endpoint, cli_opt_s3_cache, cli_opt_format,
	cli_opt_model_name;
/* The runs of shared options every command that reads a checkpoint
 * lists, in its help's order: where the files are, and how the model is
 * read. A new shared option goes into one of these once. */
#define CLI_SOURCE_OPTS &cli_opt_config, &cli_opt_s3_endpoint, &cli_opt_s3_cache
#define CLI_MODEL_OPTS                                                                             \
	&cli_opt_follow_symlinks, &cli_opt_raw_names, &cli_opt_lora, &cli_opt_base,                \
		&cli_opt_lora_alpha, &cli_opt_rslora, &cli_opt_quant_skip
/* --dtype defaulting to auto (each tensor as stored): what ckfs diff compares. */
extern const struct cli_opt cli_opt_dtype_as_stored;
/* -h, --help: implied in every command (after its table). */
extern const struct cli_opt cli_opt_help;

/* apply(ctx, opt, value) for each option's default, then for each option
 * given (value NULL for a flag): 0, or the exit status to stop with (2 for
 * a usage error, reported by the callback). */
typedef int (*cli_apply_fn)(void *ctx, const struct cli_opt *opt, const struct cli_value *value);

/*
 * Parse argv (argv[0] is the command's name) against cmd's table, calling
 * apply for each default in the table, then for each option in order. Returns 0 with *first_arg the index of
 * the first positional argument (exactly cmd->n_args of them);
 * CLI_HELP_SHOWN after --help (exit 0); or the exit status to stop with
 * (2 on a usage error, reported). So: rc = cli_parse(...); if (rc) return
 * rc < 0 ? 0 : rc;
 */
#define CLI_HELP_SHOWN (-1)
int cli_parse(const struct cli_command *cmd, int argc, char **argv, cli_apply_fn apply,
	      void *ctx, int *first_arg);
/* text (NULL for a flag) parsed as o's value, then applied: 0, or the
 * exit status to stop with (a bad value reported). */
int cli_apply_text(const struct cli_command *cmd, const struct cli_opt *o, const char *text,
		   cli_apply_fn apply, void *ctx);
/* The option of cmd with -o key `key`, or NULL. */
const struct cli_opt *cli_find_key(const struct cli_command *cmd, const char *key);
/* cmd's --help text. */
void cli_help(const struct cli_command *cmd, FILE *to);
/* o's help with its default appended, as --help and the man page show it. */
void cli_opt_help_text(const struct cli_opt *o, char *buf, size_t size);

/* A row of --dtype's table (options.c): what its word asks of the model,
 * and of a GGUF. */
struct cli_dtype {
	const char *word;
	enum ckfs_dtype dtype; /* every tensor's (the rest's, with quant) */
	bool as_stored;        /* auto: each tensor as stored instead */
	enum ckfs_quant quant; /* the linear weights' view */
	bool gguf, gguf_only;  /* a GGUF type (only that) */
	enum ckfs_gguf_type gguf_type;
};

/* What the shared options set. */
struct cli_common {
	struct ckfs_model_options model;
	struct ckfs_folder_options folder;
	bool json;
	const struct cli_dtype *dtype; /* --dtype's row (NULL: none given) */
};
/* Apply a shared option to c: 0, 2 (a bad value, reported), or -1 when o
 * is not one of them. */
int cli_apply_common(const struct cli_command *cmd, struct cli_common *c,
		     const struct cli_opt *o, const struct cli_value *value);
/* The checks across the shared options once all are applied (--format
 * gguf with --dtype): 0, or 2 (reported). Commands with --format call it. */
int cli_common_settle(const struct cli_command *cmd, struct cli_common *c);

/* List each of paths that is an s3:// URL, and c's --base and --config
 * when they are, so that they read as folders (include/ckfs/remote.h):
 * 0, or 1 after reporting why one cannot be. */
int cli_attach_stores(const struct cli_common *c, const char *const *paths, int n);

#endif
