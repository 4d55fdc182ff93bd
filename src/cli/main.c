/* SPDX-License-Identifier: MIT */
/*
 * ckfs command line: sub-command dispatch and helpers shared by the
 * sub-commands. Exit status: 0 success, 1 failure (one line on stderr
 * naming the file and the cause), 2 usage error.
 *
 * mount.fuse3 runs "ckfs SRC MNT -o OPTS": a first argument that is not a
 * sub-command but names a path is taken as a mount; any other word is a
 * mistyped command, answered with the closest ones as git does.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "ckfs/log.h"
#include "ckfs/remote.h"
#include "ckfs/text.h"
#include "cli/built_with.h"
#include "cli/cli.h"
#include "cli/options.h"

int ckfs_cli_report(const struct ckfs_error *err)
{
	fprintf(stderr, "ckfs: %s\n", err->msg[0] ? err->msg : ckfs_strerror(err->code));
	return 1;
}

/* fmt's message, escaped as every message is (include/ckfs/text.h). */
CKFS_PRINTF(3, 0)
static void escaped(char *line, size_t size, const char *fmt, va_list ap)
{
	char raw[2048];

	vsnprintf(raw, sizeof(raw), fmt, ap);
	ckfs_text_escape(line, size, raw);
}

int ckfs_cli_usage_error(const char *cmd, const char *fmt, ...)
{
	char line[2048];
	va_list ap;

	va_start(ap, fmt);
	escaped(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ckfs %s: %s\nTry 'ckfs %s --help'.\n", cmd, line, cmd);
	return 2;
}

void ckfs_cli_say(const char *fmt, ...)
{
	char line[2048];
	va_list ap;

	va_start(ap, fmt);
	escaped(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ckfs: %s\n", line);
}

/* The library's log lines as the command's other lines: "ckfs: <line>"
 * (a mount's daemon sets its own sink, src/fuse/session.c). */
static void cli_log_sink(enum ckfs_log_level level, const char *line)
{
	(void)level;
	fprintf(stderr, "ckfs: %s\n", line);
}

const char *ckfs_cli_shown(const char *s)
{
	static char bufs[4][4096];
	static unsigned next;
	char *b = bufs[next++ % 4];

	ckfs_text_escape(b, sizeof(bufs[0]), s);
	return b;
}

const struct cli_command *const ckfs_commands[] = {
	&ckfs_cmd_inspect_def, &ckfs_cmd_export_def, &ckfs_cmd_verify_def, &ckfs_cmd_diff_def,
	&ckfs_cmd_mount_def, &ckfs_cmd_umount_def, &ckfs_cmd_stats_def, NULL,
};

static void usage(FILE *to)
{
	fputs("usage: ckfs <command> [options]\n\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++) {
		char left[64];
		snprintf(left, sizeof(left), "%s %s", (*c)->name, (*c)->args);
		fprintf(to, "  %-24s %s\n", left, (*c)->brief);
	}
	fputs("\nRun 'ckfs <command> --help' for its options, 'ckfs --version' for the\n"
	      "version; the manual page is ckfs(1).\n", to);
}

/* The optimal string alignment distance (Damerau-Levenshtein where no
 * substring is edited twice): 'inpsect' is one swap from 'inspect'. */
static size_t edit_distance(const char *a, const char *b)
{
	enum { MAX = 32 };
	size_t la = strlen(a), lb = strlen(b), d[MAX + 1][MAX + 1];

	if (la > MAX || lb > MAX)
		return SIZE_MAX;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++) {
		for (size_t j = 1; j <= lb; j++) {
			size_t cost = a[i - 1] != b[j - 1], best = d[i - 1][j - 1] + cost;
			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	}
	return d[la][lb];
}

/* A mount.fuse3 source: a path (a '/', a leading '.' or '~', an s3:// URL)
 * or a name that exists here; a bare word that names nothing is a command. */
static bool path_like(const char *arg)
{
	return strchr(arg, '/') || arg[0] == '.' || arg[0] == '~' || access(arg, F_OK) == 0;
}

/* "ckfs: 'inpsect' is not a ckfs command. Did you mean 'inspect'?", naming
 * every command at the smallest distance when that is at most 2 edits (1
 * for a word shorter than 3 letters, which 2 edits turn into anything). */
static int not_a_command(const char *word)
{
	static const char *const aliases[] = { "unmount", "help", "version", NULL };
	const char *names[16];
	size_t n = 0, best = SIZE_MAX, limit = strlen(word) < 3 ? 1 : 2;
	char line[512];
	int len;

	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		names[n++] = (*c)->name;
	for (const char *const *a = aliases; *a; a++)
		names[n++] = *a;
	for (size_t i = 0; i < n; i++) {
		size_t d = edit_distance(word, names[i]);
		best = d < best ? d : best;
	}
	len = snprintf(line, sizeof(line), "'%s' is not a ckfs command.", word);
	if (best > limit) {
		ckfs_cli_say("%s See 'ckfs --help'.", line);
		return 2;
	}
	for (size_t i = 0, said = 0; i < n && len < (int)sizeof(line); i++) {
		if (edit_distance(word, names[i]) != best)
			continue;
		len += snprintf(line + len, sizeof(line) - len, "%s'%s'",
				said++ == 0 ? " Did you mean " : " or ", names[i]);
	}
	ckfs_cli_say("%s?", line);
	return 2;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : NULL;

#ifdef __GLIBC__
	/* glibc's dynamic thresholds from the start, at the values they
	 * converge to (32 MiB, twice that): opening a checkpoint parses one
	 * rank file after another, each allocating and freeing tens of MB,
	 * and below the converged threshold every such block is a fresh
	 * mmap whose pages all fault (a third of the CPU time of opening a
	 * 64-rank actor; docs/benchmarks.md). */
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif

	ckfs_log_set_sink(cli_log_sink);
	atexit(ckfs_remote_detach_all); /* s3:// sources' listings and client */
	if (cmd && strcmp(cmd, "help") == 0 && argc > 2)
		return ckfs_cmd_help(argc - 1, argv + 1);
	if (!cmd || strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 ||
	    strcmp(cmd, "help") == 0) {
		usage(cmd ? stdout : stderr);
		return cmd ? 0 : 2;
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("ckfs %s\nbuilt with %s\n", CKFS_VERSION, CKFS_BUILT_WITH);
		return 0;
	}
	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		if (strcmp(cmd, (*c)->name) == 0)
			return (*c)->run(argc - 1, argv + 1);
	if (strcmp(cmd, "unmount") == 0)
		return ckfs_cmd_umount(argc - 1, argv + 1);
	if (cmd[0] != '-' && argc >= 3 && path_like(cmd))
		return ckfs_cmd_mount(argc, argv); /* mount.fuse3: ckfs SRC MNT -o ... */
	if (cmd[0] != '-')
		return not_a_command(cmd);
	ckfs_cli_say("unknown option '%s'", cmd);
	fputc('\n', stderr);
	usage(stderr);
	return 2;
}
