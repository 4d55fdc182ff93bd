/* SPDX-License-Identifier: MIT */
/* Options as data: see src/cli/options.h. */
#include "cli/options.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ckfs/log.h"
#include "ckfs/remote.h"
#include "ckfs/units.h"
#include "cli/cli.h"

/* ---- the words options take ---- */

/* --dtype's table: what each word asks of the model (an element type for
 * every tensor, each as stored, or a view quantizing the linear weights
 * with bf16 for the rest) and of a GGUF (--format gguf; gguf_only: a
 * block type that means nothing else). */
enum dtype_row {
	DT_BF16,
	DT_F16,
	DT_F32,
	DT_AUTO,
	DT_FP8,
	DT_W4A16,
	DT_NVFP4,
	DT_Q8_0,
	DT_Q4_0
};
static const struct cli_dtype cli_dtypes[] = {
	[DT_BF16] = { "bf16", CKFS_DTYPE_BF16, .gguf = true, .gguf_type = CKFS_GGUF_BF16 },
	[DT_F16] = { "fp16", CKFS_DTYPE_F16, .gguf = true, .gguf_type = CKFS_GGUF_F16 },
	[DT_F32] = { "fp32", CKFS_DTYPE_F32 },
	[DT_AUTO] = { "auto", .as_stored = true },
	[DT_FP8] = { "fp8", CKFS_DTYPE_BF16, .quant = CKFS_QUANT_FP8 },
	[DT_W4A16] = { "w4a16", CKFS_DTYPE_BF16, .quant = CKFS_QUANT_W4A16 },
	[DT_NVFP4] = { "nvfp4", CKFS_DTYPE_BF16, .quant = CKFS_QUANT_NVFP4 },
	[DT_Q8_0] = { "q8_0", CKFS_DTYPE_BF16, .gguf = true, .gguf_only = true,
		      .gguf_type = CKFS_GGUF_Q8_0 },
	[DT_Q4_0] = { "q4_0", CKFS_DTYPE_BF16, .gguf = true, .gguf_only = true,
		      .gguf_type = CKFS_GGUF_Q4_0 },
};
/* Each row's word, and llama.cpp's spelling (convert_hf_to_gguf.py
 * --outtype f16; GGML's type names are q8_0's pattern: a letter, the
 * bits) and torch's. */
static const struct cli_choice dtype_words[] = { { "bf16", DT_BF16 },
						 { "bfloat16", DT_BF16 },
						 { "fp16", DT_F16 },
						 { "f16", DT_F16 },
						 { "float16", DT_F16 },
						 { "half", DT_F16 },
						 { "fp32", DT_F32 },
						 { "f32", DT_F32 },
						 { "float32", DT_F32 },
						 { "float", DT_F32 },
						 { "auto", DT_AUTO },
						 { "fp8", DT_FP8 },
						 { "w4a16", DT_W4A16 },
						 { "nvfp4", DT_NVFP4 },
						 { "q8_0", DT_Q8_0 },
						 { "q4_0", DT_Q4_0 },
						 { NULL, 0 } };
static const struct cli_choice format_words[] = {
	{ "safetensors", 0 }, { "gguf", 1 }, { NULL, 0 }
};
static const struct cli_choice lora_words[] = {
	{ "adapter", CKFS_LORA_ADAPTER }, { "fuse", CKFS_LORA_FUSE },
	{ "base", CKFS_LORA_BASE }, { NULL, 0 }
};
static const struct cli_choice rank_checks_words[] = {
	{ "mount", CKFS_RANK_CHECKS_OPEN }, { "read", CKFS_RANK_CHECKS_READ },
	{ "auto", CKFS_RANK_CHECKS_AUTO }, { NULL, 0 }
};
static const struct cli_choice log_level_words[] = {
	{ "err", CKFS_LOG_ERR }, { "error", CKFS_LOG_ERR },
	{ "warning", CKFS_LOG_WARNING }, { "warn", CKFS_LOG_WARNING },
	{ "notice", CKFS_LOG_NOTICE }, { "info", CKFS_LOG_INFO },
	{ "debug", CKFS_LOG_DEBUG }, { NULL, 0 }
};
/* the releases ckfs_transformers_release knows (each also as
 * major.minor.patch, so the value is text it checks) */
static const struct cli_choice transformers_words[] = {
	{ "5.10", 510 }, { "5.23", 523 }, { NULL, 0 }
};

const struct cli_opt cli_opt_dtype = {
	.id = OPT_DTYPE,
	.name = "dtype",
	.key = "dtype",
	.arg = "T",
	.kind = CLI_CHOICE,
	.choices = dtype_words,
	.def = "bf16",
	.help = "output dtype: bf16 (as verl's merger), fp16, fp32, auto (each "
		"tensor as stored); or the linear weights quantized, the rest bf16: fp8 "
		"(block-wise float8_e4m3fn with scales), w4a16 (compressed-tensors' "
		"pack-quantized INT4, groups of 128) or nvfp4 (its nvfp4-pack-quantized "
		"FP4, groups of 16); "
		"with --format gguf: bf16, fp16, q8_0 or q4_0. A block-FP8 release "
		"(DeepSeek-V3's) is served as stored unless T is given: bf16, fp16 or "
		"fp32 dequantize it"
};
const struct cli_opt cli_opt_format = {
	.id = OPT_FORMAT, .name = "format", .key = "format", .arg = "F", .kind = CLI_CHOICE,
	.choices = format_words, .def = "safetensors",
	.help = "safetensors (the Hugging Face folder) or gguf (model.gguf alone, as "
		"llama.cpp's convert_hf_to_gguf.py writes it from that folder)"
};
const struct cli_opt cli_opt_model_name = {
	.id = OPT_MODEL_NAME, .name = "model-name", .key = "model_name", .arg = "NAME",
	.kind = CLI_TEXT,
	.help = "with --format gguf, general.name (the converter's --model-name); default "
		"the checkpoint folder's name"
};
const struct cli_opt cli_opt_dtype_as_stored = {
	.id = OPT_DTYPE,
	.name = "dtype",
	.arg = "T",
	.kind = CLI_CHOICE,
	.choices = dtype_words,
	.def = "auto",
	.help = "compare values as served in dtype T: auto (each tensor as stored), bf16, "
		"fp16, fp32, fp8, w4a16 or nvfp4"
};
const struct cli_opt cli_opt_max_shard_size = {
	.id = OPT_MAX_SHARD_SIZE, .name = "max-shard-size", .key = "max_shard_size",
	.arg = "SIZE", .kind = CLI_SIZE, .lo = 1, .hi = INT64_MAX,
	.help = "split the weights into shards of at most SIZE (e.g. 5GB, 500MB, "
		"2GiB) with model.safetensors.index.json; default one model.safetensors"
};
const struct cli_opt cli_opt_transformers_version = {
	.id = OPT_TRANSFORMERS_VERSION, .name = "transformers-version",
	.key = "transformers_version", .arg = "V", .kind = CLI_TEXT,
	.choices = transformers_words, .def = "5.23",
	.help = "write config.json as verl's merger does with transformers V "
		"(5.10 or 5.23, the newest checked)"
};
const struct cli_opt cli_opt_config = {
	.id = OPT_CONFIG, .name = "config", .key = "config", .arg = "PATH", .kind = CLI_TEXT,
	.help = "config.json (or a folder holding one, whose other files are served "
		"too) when the checkpoint has none"
};
const struct cli_opt cli_opt_s3_endpoint = {
	.id = OPT_S3_ENDPOINT, .name = "s3-endpoint", .key = "s3_endpoint", .arg = "URL",
	.kind = CLI_TEXT,
	.help = "the object store of s3:// sources (scheme://host[:port]); default "
		"AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS S3 in the region"
};
const struct cli_opt cli_opt_s3_cache = {
	.id = OPT_S3_CACHE, .name = "s3-cache", .key = "s3_cache", .arg = "DIR,SIZE",
	.kind = CLI_TEXT,
	.help = "keep bytes fetched from the object store in DIR, at most SIZE (e.g. "
		"~/.cache/ckfs/s3,20GiB; -o s3_cache=DIR:SIZE), for every mount and export "
		"naming it"
};
const struct cli_opt cli_opt_follow_symlinks = {
	.id = OPT_FOLLOW_SYMLINKS, .name = "follow-symlinks", .key = "follow_symlinks",
	.help = "read files whose symlinks lead outside SRC (refused by default)"
};
const struct cli_opt cli_opt_raw_names = {
	.id = OPT_RAW_NAMES, .name = "raw-names", .key = "raw_names",
	.help = "serve Megatron keys without a Hugging Face name under their own names "
		"(per rank from mp_rank_* folders, whole from a dist_ckpt)"
};
const struct cli_opt cli_opt_lora = {
	.id = OPT_LORA, .name = "lora", .key = "lora", .arg = "MODE", .kind = CLI_CHOICE,
	.choices = lora_words, .def = "adapter",
	.help = "a LoRA actor as: adapter (the base weights plus lora_adapter/, as "
		"verl's merger writes them), fuse (one model, W + scale * B @ A "
		"computed on read) or base (the base weights alone)"
};
const struct cli_opt cli_opt_base = {
	.id = OPT_BASE, .name = "base", .key = "base", .arg = "DIR", .kind = CLI_TEXT,
	.help = "the base weights of a LoRA checkpoint saved with the adapter only: a "
		"Hugging Face folder, or any checkpoint ckfs reads"
};
const struct cli_opt cli_opt_lora_alpha = {
	.id = OPT_LORA_ALPHA, .name = "lora-alpha", .key = "lora_alpha", .arg = "N",
	.kind = CLI_COUNT, .lo = 1, .hi = INT32_MAX,
	.help = "LoRA alpha, when lora_train_meta.json does not record it as trained"
};
const struct cli_opt cli_opt_rslora = {
	.id = OPT_RSLORA, .name = "rslora", .key = "rslora",
	.help = "the adapter was trained with rsLoRA: scale alpha / sqrt(r), not alpha / r"
};
const struct cli_opt cli_opt_quant_skip = {
	.id = OPT_QUANT_SKIP,
	.name = "quant-skip",
	.key = "quant_skip",
	.arg = "REGEX",
	.old_name = "fp8-skip",
	.old_key = "fp8_skip",
	.kind = CLI_TEXT,
	.help = "with --dtype fp8, w4a16 or nvfp4, weights whose names match REGEX (POSIX "
		"extended) stay bf16; default: the vision tower and multimodal projector "
		"(--fp8-skip, its former name, is taken too)"
};
const struct cli_opt cli_opt_rank_checks = {
	.id = OPT_RANK_CHECKS, .key = "rank_checks", .arg = "WHEN", .kind = CLI_CHOICE,
	.choices = rank_checks_words, .def = "auto",
	.help = "when a verl FSDP actor's ranks other than rank 0 are read and checked "
		"against it: mount (before the mount is ready; a bad rank fails it), "
		"read (by threads after it; no tensor byte is served until all passed, "
		"reads fail with EIO after one failed) or auto (read when there are at "
		"least 100,000 entries to check, (world size - 1) x keys, else mount)"
};
const struct cli_opt cli_opt_log_level = {
	.id = OPT_LOG_LEVEL, .name = "log-level", .key = "log_level", .arg = "LEVEL",
	.kind = CLI_CHOICE, .choices = log_level_words, .def = "notice",
	.help = "err, warning, notice, info or debug"
};
const struct cli_opt cli_opt_json = {
	.id = OPT_JSON, .name = "json", .letter = 'j', .help = "print JSON"
};

const struct cli_opt cli_opt_help = { .name = "help", .letter = 'h', .help = "show this help" };

/* The option as a user wrote it: "--threads" or "-o max_plans". */
static void opt_spelling(const struct cli_opt *o, char *buf, size_t size)
{
	snprintf(buf, size, "%s%s", o->name ? "--" : "-o ", o->name ? o->name : o->key);
}

/* "bf16, fp16, fp32, auto or fp8": the words without their aliases (an
 * alias follows its word in the table, with the same value). */
static void choice_words(const struct cli_choice *c, char *buf, size_t size)
{
	const char *words[32];
	size_t n = 0, len = 0;

	for (size_t i = 0; c[i].word && n < 32; i++)
		if (i == 0 || c[i].value != c[i - 1].value)
			words[n++] = c[i].word;
	buf[0] = '\0';
	for (size_t i = 0; i < n && len < size; i++)
		len += (size_t)snprintf(buf + len, size - len, "%s%s",
					i == 0 ? "" : i + 1 == n ? " or " : ", ", words[i]);
}

/* text as a value of o (command cmd): 0, or 2 for a usage error, reported. */
static int cli_value_parse(const struct cli_command *cmd, const struct cli_opt *o,
			   const char *text, struct cli_value *v)
{
	char who[64], what[160];
	char *end;

	*v = (struct cli_value){ .text = text };
	errno = 0;
	switch (o->kind) {
	case CLI_FLAG:
	case CLI_TEXT:
		return 0;
	case CLI_CHOICE: /* any case: Q8_0 and F16 as llama-quantize prints them */
		for (const struct cli_choice *c = o->choices; c->word; c++)
			if (strcasecmp(c->word, text) == 0) {
				v->n = c->value;
				return 0;
			}
		choice_words(o->choices, what, sizeof(what));
		opt_spelling(o, who, sizeof(who));
		return ckfs_cli_usage_error(cmd->name, "unknown %s '%s' (%s)", who, text, what);
	case CLI_COUNT:
		v->n = strtoll(text, &end, 10);
		if (!errno && end != text && !*end && v->n >= o->lo && v->n <= o->hi)
			return 0;
		snprintf(what, sizeof(what), "a whole number from %lld to %lld", o->lo, o->hi);
		break;
	case CLI_SIZE:
		v->n = strcmp(text, "0") == 0 ? 0 : (long long)ckfs_parse_size(text);
		if ((v->n > 0 || strcmp(text, "0") == 0) && v->n >= o->lo && v->n <= o->hi)
			return 0;
		snprintf(what, sizeof(what), "a size such as 512MiB or 5GB%s",
			 o->lo == 0 ? ", or 0" : "");
		break;
	case CLI_REAL:
		v->real = strtod(text, &end);
		if (end != text && !*end && v->real >= 0)
			return 0;
		snprintf(what, sizeof(what), "a number from 0");
		break;
	case CLI_OCTAL:
		v->n = strtoll(text, &end, 8);
		if (*text >= '0' && *text <= '7' && !errno && !*end && v->n <= o->hi)
			return 0;
		snprintf(what, sizeof(what), "octal, 0 to 0%llo", (unsigned long long)o->hi);
		break;
	}
	opt_spelling(o, who, sizeof(who));
	return ckfs_cli_usage_error(cmd->name, "bad %s '%s' (%s)", who, text, what);
}

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

int cli_apply_text(const struct cli_command *cmd, const struct cli_opt *o, const char *text,
		   cli_apply_fn apply, void *ctx)
{
	struct cli_value v;

	if (!text)
		return apply(ctx, o, NULL);
	int rc = cli_value_parse(cmd, o, text, &v);
	return rc ? rc : apply(ctx, o, &v);
}

int cli_parse(const struct cli_command *cmd, int argc, char **argv, cli_apply_fn apply,
	      void *ctx, int *first_arg)
{
	/* On the stack: an allocation failure must not look like a usage
	 * error (the allocation-failure tests count every allocation). */
	enum { LONG_BASE = 1000, MAX_OPTS = 40 };
	struct option longs[2 * MAX_OPTS + 2];
	char shorts[2 * MAX_OPTS + 3];
	size_t n = count(cmd), nl = 0, ns = 0;
	int rc = 0, c;

	if (n > MAX_OPTS)
		abort(); /* a table longer than this file allows: a bug */
	shorts[ns++] = ':'; /* a missing value is ':', not '?' */
	shorts[ns++] = 'h';
	for (size_t i = 0; i < n; i++) {
		const struct cli_opt *o = cmd->opts[i];
		for (int k = 0; k < 2; k++) {
			const char *name = k ? o->old_name : o->name;
			if (name)
				longs[nl++] =
					(struct option){ name,
							 o->arg ? required_argument : no_argument,
							 NULL, LONG_BASE + (int)i };
		}
		if (o->letter) {
			shorts[ns++] = o->letter;
			if (o->arg)
				shorts[ns++] = ':';
		}
	}
	for (size_t i = 0; i < n && rc == 0; i++)
		if (cmd->opts[i]->def)
			rc = cli_apply_text(cmd, cmd->opts[i], cmd->opts[i]->def, apply, ctx);
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
			rc = cli_apply_text(cmd, o, o->arg ? optarg : NULL, apply, ctx);
	}
	if (rc)
		return rc;
	if (argc - optind < cmd->n_args || argc - optind > cmd->n_args + cmd->n_optional)
		return wrong_args(cmd);
	*first_arg = optind;
	return 0;
}

const struct cli_opt *cli_find_key(const struct cli_command *cmd, const char *key)
{
	for (const struct cli_opt *const *o = cmd->opts; *o; o++)
		if (((*o)->key && strcmp((*o)->key, key) == 0) ||
		    ((*o)->old_key && strcmp((*o)->old_key, key) == 0))
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

void cli_opt_help_text(const struct cli_opt *o, char *buf, size_t size)
{
	snprintf(buf, size, "%s%s%s%s", o->help, o->def ? " (default " : "",
		 o->def ? o->def : "", o->def ? ")" : "");
}

/* --help's groups, as git's OPT_GROUP: each option's by what it is about,
 * in one place so every command sorts a shared option alike. */
enum cli_group { GROUP_SOURCE, GROUP_OUTPUT, GROUP_COMPARE, GROUP_CACHE, GROUP_S3, GROUP_MOUNT,
		 GROUP_OTHER, GROUP_END };

static const char *const group_title[GROUP_END] = {
	[GROUP_SOURCE] = "Reading the checkpoint",
	[GROUP_OUTPUT] = "What is written or served",
	[GROUP_COMPARE] = "Comparing",
	[GROUP_CACHE] = "Cache and read-ahead",
	[GROUP_S3] = "s3:// sources",
	[GROUP_MOUNT] = "The mount",
	[GROUP_OTHER] = "Other",
};

static enum cli_group opt_group(const struct cli_opt *o)
{
	switch (o->id) {
	case OPT_CONFIG: case OPT_FOLLOW_SYMLINKS: case OPT_RAW_NAMES: case OPT_LORA:
	case OPT_BASE: case OPT_LORA_ALPHA: case OPT_RSLORA: case OPT_RANK_CHECKS:
		return GROUP_SOURCE;
	case OPT_DTYPE:
	case OPT_QUANT_SKIP:
	case OPT_MAX_SHARD_SIZE:
	case OPT_TRANSFORMERS_VERSION:
	case OPT_FORMAT: case OPT_MODEL_NAME: case OPT_FORCE: case OPT_EXPORT_THREADS:
	case OPT_SINCE: case OPT_QUIET: case OPT_JSON: case OPT_SVG: case OPT_PROMETHEUS:
		return GROUP_OUTPUT;
	case OPT_AGAINST: case OPT_ATOL: case OPT_RTOL:
		return GROUP_COMPARE;
	case OPT_CACHE_SIZE: case OPT_READAHEAD: case OPT_PREFETCH_THREADS: case OPT_SLICE_SIZE:
	case OPT_KERNEL_READAHEAD: case OPT_SHARE_SLICES: case OPT_PRELOAD: case OPT_PRELOAD_MAX:
	case OPT_MAX_PLANS:
		return GROUP_CACHE;
	case OPT_S3_ENDPOINT: case OPT_S3_CACHE: case OPT_S3_POLL:
		return GROUP_S3;
	case OPT_FOREGROUND: case OPT_DEBUG: case OPT_MOUNT_OPTIONS: case OPT_THREADS:
	case OPT_UID: case OPT_GID: case OPT_UMASK: case OPT_LAZY: case OPT_NOSANDBOX:
		return GROUP_MOUNT;
	default: /* --log-level, --help */
		return GROUP_OTHER;
	}
}

/* One option's line: "-f, --force", or "-o key=V" for a mount option only
 * given with -o; where the command takes -o, each option's key follows
 * its text. */
static void help_opt(FILE *to, const struct cli_opt *o, bool takes_o)
{
	char left[96], help[512];
	size_t len;

	if (o->name)
		snprintf(left, sizeof(left), "%c%c%s--%s%s%s", o->letter ? '-' : ' ',
			 o->letter ? o->letter : ' ', o->letter ? ", " : "  ", o->name,
			 o->arg ? " " : "", o->arg ? o->arg : "");
	else
		snprintf(left, sizeof(left), "-o %s%s%s", o->key, o->arg ? "=" : "",
			 o->arg ? o->arg : "");
	cli_opt_help_text(o, help, sizeof(help));
	len = strlen(help);
	if (takes_o && o->name && o->key)
		snprintf(help + len, sizeof(help) - len, "\n(-o %s%s%s)", o->key,
			 o->arg ? "=" : "", o->arg ? o->arg : "");
	help_line(to, left, help);
}

void cli_help(const struct cli_command *cmd, FILE *to)
{
	bool takes_o = false;
	size_t n = 0;

	while (cmd->opts[n]) {
		takes_o |= cmd->opts[n]->id == OPT_MOUNT_OPTIONS;
		n++;
	}
	fprintf(to, "usage: ckfs %s [options] %s\n%s\n", cmd->name, cmd->args, cmd->about);
	for (enum cli_group g = 0; g < GROUP_END; g++) {
		bool titled = false;
		for (size_t i = 0; i <= n; i++) { /* the table, then the implied --help */
			const struct cli_opt *o = i < n ? cmd->opts[i] : &cli_opt_help;
			if (opt_group(o) != g)
				continue;
			if (!titled)
				fprintf(to, "\n%s:\n", group_title[g]);
			titled = true;
			help_opt(to, o, takes_o);
		}
	}
}

static bool takes(const struct cli_command *cmd, enum cli_opt_id id)
{
	for (const struct cli_opt *const *o = cmd->opts; *o; o++)
		if ((*o)->id == id)
			return true;
	return false;
}

/* --s3-cache DIR,SIZE */
static int apply_s3_cache(const struct cli_command *cmd, const char *text)
{
	/* DIR:SIZE too, for -o (where a comma ends the option) */
	const char *comma = strrchr(text, ',') ? strrchr(text, ',') : strrchr(text, ':');
	uint64_t size = comma ? ckfs_parse_size(comma + 1) : 0;
	struct ckfs_error err;

	if (!comma || comma == text || !size)
		return ckfs_cli_usage_error(cmd->name, "bad --s3-cache '%s' (DIR,SIZE, e.g. "
					    "/var/cache/ckfs,20GiB)", text);
	char *dir = strndup(text, (size_t)(comma - text));
	if (!dir)
		return ckfs_cli_usage_error(cmd->name, "out of memory");
	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_remote_set_cache(dir, size, &err);
	free(dir);
	return rc == CKFS_OK ? 0 : ckfs_cli_report(&err);
}

int cli_attach_stores(const struct cli_common *c, const char *const *paths, int n)
{
	const char *opts[] = { c->model.base_path, c->model.config_path };
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_remote_attach_urls(paths, (size_t)n, &err) != CKFS_OK ||
	    ckfs_remote_attach_urls(opts, 2, &err) != CKFS_OK)
		return ckfs_cli_report(&err);
	return 0;
}

int cli_apply_common(const struct cli_command *cmd, struct cli_common *c,
		     const struct cli_opt *o, const struct cli_value *v)
{
	switch (o->id) {
	case OPT_DTYPE:
		c->dtype = &cli_dtypes[v->n];
		if (c->dtype->gguf_only && !takes(cmd, OPT_FORMAT))
			return ckfs_cli_usage_error(cmd->name, "--dtype %s is a GGUF type "
						    "(export and mount --format gguf)", v->text);
		c->model.out_dtype = c->dtype->dtype;
		c->model.as_stored = c->dtype->as_stored;
		c->model.quant = c->dtype->quant;
		/* the parser applies each default with the table's own text */
		c->model.dtype_is_default = v->text == o->def;
		return 0;
	case OPT_FORMAT:
		c->folder.gguf = v->n == 1;
		return 0;
	case OPT_MODEL_NAME:
		c->folder.gguf_options.model_name = v->text;
		return 0;
	case OPT_MAX_SHARD_SIZE:
		c->folder.max_shard_size = (uint64_t)v->n;
		return 0;
	case OPT_CONFIG:
		c->model.config_path = v->text;
		return 0;
	case OPT_S3_ENDPOINT:
		ckfs_remote_set_endpoint(v->text);
		return 0;
	case OPT_S3_CACHE:
		return apply_s3_cache(cmd, v->text);
	case OPT_TRANSFORMERS_VERSION:
		if (!(c->folder.transformers = ckfs_transformers_release(v->text)))
			return ckfs_cli_usage_error(cmd->name, "--transformers-version %s: ckfs "
						    "knows what verl's merger writes with "
						    "transformers %s", v->text,
						    ckfs_transformers_releases_known());
		return 0;
	case OPT_FOLLOW_SYMLINKS:
		c->model.follow_symlinks = true;
		return 0;
	case OPT_RAW_NAMES:
		c->model.raw_names = true;
		return 0;
	case OPT_LOG_LEVEL:
		ckfs_log_set_level((enum ckfs_log_level)v->n);
		return 0;
	case OPT_JSON:
		c->json = true;
		return 0;
	case OPT_LORA:
		c->model.lora = (enum ckfs_lora_mode)v->n;
		return 0;
	case OPT_BASE:
		c->model.base_path = v->text;
		return 0;
	case OPT_LORA_ALPHA:
		c->model.lora_alpha = v->n;
		return 0;
	case OPT_RSLORA:
		c->model.rslora = true;
		return 0;
	case OPT_QUANT_SKIP:
		c->model.quant_skip = v->text;
		return 0;
	case OPT_RANK_CHECKS:
		c->model.rank_checks = (enum ckfs_rank_checks)v->n;
		return 0;
	default:
		return -1;
	}
}

int cli_common_settle(const struct cli_command *cmd, struct cli_common *c)
{
	const struct cli_dtype *d = c->dtype;

	if (!c->folder.gguf) {
		if (d && d->gguf_only)
			return ckfs_cli_usage_error(cmd->name, "--dtype %s needs --format gguf",
						    d->word);
		if (c->folder.gguf_options.model_name)
			return ckfs_cli_usage_error(cmd->name, "--model-name needs --format gguf");
		return 0;
	}
	if (!d || !d->gguf)
		return ckfs_cli_usage_error(cmd->name, "--format gguf takes --dtype bf16, fp16, "
						       "q8_0 or q4_0");
	c->folder.gguf_options.type = d->gguf_type;
	/* the GGUF is made from the bf16 folder, as the converter is run on it */
	c->model.out_dtype = CKFS_DTYPE_BF16;
	if (c->folder.max_shard_size)
		return ckfs_cli_usage_error(cmd->name, "--max-shard-size is for "
						       "--format safetensors");
	return 0;
}
