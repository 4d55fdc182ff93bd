/* SPDX-License-Identifier: MIT */
/* Options as data: see src/cli/options.h. */
#include "cli/options.h"

#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/log.h"
#include "ckfs/units.h"
#include "cli/cli.h"

/* ---- the words options take ---- */

static const struct cli_choice dtype_words[] = {
	{ "bf16", CKFS_DTYPE_BF16 },  { "bfloat16", CKFS_DTYPE_BF16 },
	{ "fp16", CKFS_DTYPE_F16 },   { "float16", CKFS_DTYPE_F16 },
	{ "half", CKFS_DTYPE_F16 },   { "fp32", CKFS_DTYPE_F32 },
	{ "float32", CKFS_DTYPE_F32 }, { "float", CKFS_DTYPE_F32 },
	{ "auto", CKFS_DTYPE_AUTO }, { "fp8", CKFS_DTYPE_F8_E4M3 },
	{ NULL, 0 }
};
static const struct cli_choice lora_words[] = {
	{ "adapter", CKFS_LORA_ADAPTER }, { "fuse", CKFS_LORA_FUSE },
	{ "base", CKFS_LORA_BASE }, { NULL, 0 }
};
static const struct cli_choice rank_checks_words[] = {
	{ "mount", CKFS_RANK_CHECKS_OPEN }, { "read", CKFS_RANK_CHECKS_READ },
	{ "auto", CKFS_RANK_CHECKS_AUTO }, { NULL, 0 }
};
/* ckfs_log_parse_level's names (util/log.c, below the CLI) */
static const struct cli_choice log_level_words[] = {
	{ "err", 0 }, { "error", 0 }, { "warning", 0 }, { "warn", 0 },
	{ "notice", 0 }, { "info", 0 }, { "debug", 0 }, { NULL, 0 }
};
/* the releases ckfs_transformers_release knows (each also as major.minor.patch) */
static const struct cli_choice transformers_words[] = {
	{ "5.10", 0 }, { "5.23", 0 }, { NULL, 0 }
};

const struct cli_choice *cli_choices(enum cli_opt_id id)
{
	switch (id) {
	case OPT_DTYPE: return dtype_words;
	case OPT_LORA: return lora_words;
	case OPT_RANK_CHECKS: return rank_checks_words;
	case OPT_LOG_LEVEL: return log_level_words;
	case OPT_TRANSFORMERS_VERSION: return transformers_words;
	default: return NULL;
	}
}

int cli_choice(enum cli_opt_id id, const char *word, int *value)
{
	for (const struct cli_choice *c = cli_choices(id); c && c->word; c++)
		if (strcmp(c->word, word) == 0) {
			*value = c->value;
			return 0;
		}
	return -1;
}

const struct cli_opt cli_opt_dtype = {
	OPT_DTYPE, "dtype", 0, "dtype", "T",
	"output dtype: bf16 (default, as verl's merger), fp16, fp32, auto "
	"(each tensor as stored), or fp8 (linear weights block-quantized to "
	"float8_e4m3fn with their scales, the rest bf16)"
};
const struct cli_opt cli_opt_max_shard_size = {
	OPT_MAX_SHARD_SIZE, "max-shard-size", 0, "max_shard_size", "SIZE",
	"split the weights into shards of at most SIZE (e.g. 5GB, 500MB, 2GiB) "
	"with model.safetensors.index.json; default one model.safetensors"
};
const struct cli_opt cli_opt_transformers_version = {
	OPT_TRANSFORMERS_VERSION, "transformers-version", 0, "transformers_version", "V",
	"write config.json as verl's merger does with transformers V (5.10 or "
	"5.23; default 5.23, the newest checked)"
};
const struct cli_opt cli_opt_config = {
	OPT_CONFIG, "config", 0, "config", "PATH",
	"config.json (or a folder holding one, whose other files are served "
	"too) when the checkpoint has none"
};
const struct cli_opt cli_opt_follow_symlinks = {
	OPT_FOLLOW_SYMLINKS, "follow-symlinks", 0, "follow_symlinks", NULL,
	"read files whose symlinks lead outside SRC (refused by default)"
};
const struct cli_opt cli_opt_raw_names = {
	OPT_RAW_NAMES, "raw-names", 0, "raw_names", NULL,
	"serve Megatron keys without a Hugging Face name under their own names "
	"(per rank from mp_rank_* folders, whole from a dist_ckpt)"
};
const struct cli_opt cli_opt_lora = {
	OPT_LORA, "lora", 0, "lora", "MODE",
	"a LoRA actor as: adapter (default: the base weights plus lora_adapter/, "
	"as verl's merger writes them), fuse (one model, W + scale * B @ A "
	"computed on read) or base (the base weights alone)"
};
const struct cli_opt cli_opt_base = {
	OPT_BASE, "base", 0, "base", "DIR",
	"the base weights of a LoRA checkpoint saved with the adapter only: a "
	"Hugging Face folder, or any checkpoint ckfs reads"
};
const struct cli_opt cli_opt_lora_alpha = {
	OPT_LORA_ALPHA, "lora-alpha", 0, "lora_alpha", "N",
	"LoRA alpha, when lora_train_meta.json does not record it as trained"
};
const struct cli_opt cli_opt_rslora = {
	OPT_RSLORA, "rslora", 0, "rslora", NULL,
	"the adapter was trained with rsLoRA: scale alpha / sqrt(r), not alpha / r"
};
const struct cli_opt cli_opt_fp8_skip = {
	OPT_FP8_SKIP, "fp8-skip", 0, "fp8_skip", "REGEX",
	"with --dtype fp8, weights whose names match REGEX (POSIX extended) stay "
	"bf16; default: the vision tower and multimodal projector"
};
const struct cli_opt cli_opt_rank_checks = {
	OPT_RANK_CHECKS, NULL, 0, "rank_checks", "WHEN",
	"when a verl FSDP actor's ranks other than rank 0 are read and checked "
	"against it: mount (before the mount is ready; a bad rank fails it), "
	"read (by threads after it; no tensor byte is served until all passed, "
	"reads fail with EIO after one failed) or auto (default: read when there "
	"are at least 100,000 entries to check, (world size - 1) x keys, else "
	"mount)"
};
const struct cli_opt cli_opt_log_level = {
	OPT_LOG_LEVEL, "log-level", 0, "log_level", "LEVEL",
	"err, warning, notice (default), info or debug"
};
const struct cli_opt cli_opt_json = {
	OPT_JSON, "json", 'j', NULL, NULL, "print JSON"
};

const struct cli_opt cli_opt_help = { 0, "help", 'h', NULL, NULL, "show this help" };

static size_t count(const struct cli_command *cmd)
{
	size_t n = 0;
	while (cmd->opts[n])
		n++;
	return n;
}

/* "SRC DIR" -> "expected SRC and DIR". */
static int wrong_args(const struct cli_command *cmd)
{
	char what[128] = "";
	const char *p = cmd->args;

	for (int i = 0; *p; i++) {
		size_t len = strcspn(p, " ");
		snprintf(what + strlen(what), sizeof(what) - strlen(what), "%s%.*s",
			 i == 0 ? "" : " and ", (int)len, p);
		p += len + (p[len] == ' ');
	}
	return ckfs_cli_usage_error(cmd->name, "expected %s", what);
}

int cli_parse(const struct cli_command *cmd, int argc, char **argv, cli_apply_fn apply,
	      void *ctx, int *first_arg)
{
	/* On the stack: an allocation failure must not look like a usage
	 * error (the allocation-failure tests count every allocation). */
	enum { LONG_BASE = 1000, MAX_OPTS = 40 };
	struct option longs[MAX_OPTS + 2];
	char shorts[2 * MAX_OPTS + 3];
	size_t n = count(cmd), nl = 0, ns = 0;
	int rc = 0, c;

	if (n > MAX_OPTS)
		abort(); /* a table longer than this file allows: a bug */
	shorts[ns++] = ':'; /* a missing value is ':', not '?' */
	shorts[ns++] = 'h';
	for (size_t i = 0; i < n; i++) {
		const struct cli_opt *o = cmd->opts[i];
		if (o->name)
			longs[nl++] = (struct option){ o->name, o->arg ? required_argument
								       : no_argument,
						       NULL, LONG_BASE + (int)i };
		if (o->letter) {
			shorts[ns++] = o->letter;
			if (o->arg)
				shorts[ns++] = ':';
		}
	}
	longs[nl++] = (struct option){ "help", no_argument, NULL, 'h' };
	longs[nl] = (struct option){ 0 };
	shorts[ns] = '\0';
	optind = 1;
	opterr = 0;
	while (rc == 0 && (c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
		const struct cli_opt *o = NULL;
		if (c >= LONG_BASE) {
			o = cmd->opts[c - LONG_BASE];
		} else if (c == 'h') {
			cli_help(cmd, stdout);
			rc = CLI_HELP_SHOWN;
		} else if (c == ':') {
			rc = ckfs_cli_usage_error(cmd->name, "option '%s' needs a value",
						  argv[optind - 1]);
		} else if (c == '?') {
			rc = ckfs_cli_usage_error(cmd->name, "unknown option '%s'",
						  optopt ? (char[]){ '-', (char)optopt, 0 }
							 : argv[optind - 1]);
		} else {
			for (size_t i = 0; i < n && !o; i++)
				if (cmd->opts[i]->letter == c)
					o = cmd->opts[i];
		}
		if (o)
			rc = apply(ctx, o, o->arg ? optarg : NULL);
	}
	if (rc)
		return rc;
	if (argc - optind != cmd->n_args)
		return wrong_args(cmd);
	*first_arg = optind;
	return 0;
}

const struct cli_opt *cli_find_key(const struct cli_command *cmd, const char *key)
{
	for (const struct cli_opt *const *o = cmd->opts; *o; o++)
		if ((*o)->key && strcmp((*o)->key, key) == 0)
			return *o;
	return NULL;
}

/* One option's help: "  -f, --force  text", the text wrapped at 80
 * columns and aligned under its first line. */
static void help_line(FILE *to, const char *left, const char *help)
{
	enum { COL = 28, WIDTH = 80 };
	int w = fprintf(to, "  %s", left);

	if (w >= COL) {
		fputc('\n', to);
		w = 0;
	}
	while (*help) {
		size_t room = WIDTH - COL, len = strlen(help);
		if (len > room) {
			len = room;
			while (len > 0 && help[len] != ' ' && help[len] != '\n')
				len--;
			if (len == 0)
				len = strcspn(help, " \n");
		}
		for (size_t k = 0; k < len; k++)
			if (help[k] == '\n')
				len = k; /* an explicit line break */
		fprintf(to, "%*s%.*s\n", COL - w, "", (int)len, help);
		help += len;
		while (*help == ' ' || *help == '\n')
			help++;
		w = 0;
	}
}

void cli_help(const struct cli_command *cmd, FILE *to)
{
	char left[96];
	int keys_only = 0;
	bool takes_o = false; /* the mount's -o: say each option's key */

	for (const struct cli_opt *const *p = cmd->opts; *p; p++)
		takes_o |= (*p)->id == OPT_MOUNT_OPTIONS;

	fprintf(to, "usage: ckfs %s [options] %s\n%s\n\nOptions:\n", cmd->name, cmd->args,
		cmd->about);
	for (const struct cli_opt *const *p = cmd->opts;; p++) {
		const struct cli_opt *o = *p ? *p : &cli_opt_help;
		if (!o->name) {
			keys_only = 1;
		} else {
			char help[512];
			snprintf(left, sizeof(left), "%c%c%s--%s%s%s", o->letter ? '-' : ' ',
				 o->letter ? o->letter : ' ', o->letter ? ", " : "  ", o->name,
				 o->arg ? " " : "", o->arg ? o->arg : "");
			bool key = takes_o && o->key;
			snprintf(help, sizeof(help), "%s%s%s%s%s%s", o->help, key ? "\n(-o " : "",
				 key ? o->key : "", key && o->arg ? "=" : "",
				 key && o->arg ? o->arg : "", key ? ")" : "");
			help_line(to, left, help);
		}
		if (!*p)
			break;
	}
	if (!keys_only)
		return;
	fprintf(to, "\nMount options only given with -o:\n");
	for (const struct cli_opt *const *p = cmd->opts; *p; p++) {
		if ((*p)->name)
			continue;
		snprintf(left, sizeof(left), "-o %s%s%s", (*p)->key, (*p)->arg ? "=" : "",
			 (*p)->arg ? (*p)->arg : "");
		help_line(to, left, (*p)->help);
	}
}

int cli_apply_common(const struct cli_command *cmd, struct cli_common *c,
		     const struct cli_opt *o, const char *value)
{
	int v;

	switch (o->id) {
	case OPT_DTYPE:
		if (cli_choice(o->id, value, &v) != 0)
			return ckfs_cli_usage_error(cmd->name, "unknown dtype '%s'", value);
		c->model.out_dtype = (enum ckfs_dtype)v;
		return 0;
	case OPT_MAX_SHARD_SIZE:
		if (!(c->folder.max_shard_size = ckfs_parse_size(value)))
			return ckfs_cli_usage_error(cmd->name, "bad size '%s'", value);
		return 0;
	case OPT_CONFIG:
		c->model.config_path = value;
		return 0;
	case OPT_TRANSFORMERS_VERSION:
		if (!(c->folder.transformers = ckfs_transformers_release(value)))
			return ckfs_cli_usage_error(cmd->name, "--transformers-version %s: ckfs "
						    "knows what verl's merger writes with "
						    "transformers %s", value,
						    ckfs_transformers_releases_known());
		return 0;
	case OPT_FOLLOW_SYMLINKS:
		c->model.follow_symlinks = true;
		return 0;
	case OPT_RAW_NAMES:
		c->model.raw_names = true;
		return 0;
	case OPT_LOG_LEVEL: {
		int lv = ckfs_log_parse_level(value);
		if (lv < 0)
			return ckfs_cli_usage_error(cmd->name, "bad log level '%s'", value);
		ckfs_log_set_level((enum ckfs_log_level)lv);
		return 0;
	}
	case OPT_JSON:
		c->json = true;
		return 0;
	case OPT_LORA:
		if (cli_choice(o->id, value, &v) != 0)
			return ckfs_cli_usage_error(cmd->name, "--lora is adapter, fuse or base, "
						    "not '%s'", value);
		c->model.lora = (enum ckfs_lora_mode)v;
		return 0;
	case OPT_BASE:
		c->model.base_path = value;
		return 0;
	case OPT_LORA_ALPHA: {
		char *end;
		long long alpha = strtoll(value, &end, 10);
		if (!*value || *end || alpha < 1 || alpha > INT32_MAX)
			return ckfs_cli_usage_error(cmd->name, "--lora-alpha is a whole number "
						    "from 1, not '%s'", value);
		c->model.lora_alpha = alpha;
		return 0;
	}
	case OPT_RSLORA:
		c->model.rslora = true;
		return 0;
	case OPT_FP8_SKIP:
		c->model.fp8_skip = value;
		return 0;
	case OPT_RANK_CHECKS:
		if (cli_choice(o->id, value, &v) != 0)
			return ckfs_cli_usage_error(cmd->name, "rank_checks is mount, read or "
						    "auto, not '%s'", value);
		c->model.rank_checks = (enum ckfs_rank_checks)v;
		return 0;
	default:
		return -1;
	}
}
