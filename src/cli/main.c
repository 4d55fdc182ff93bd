/* SPDX-License-Identifier: MIT */
/*
 * ckfs command line: sub-command dispatch and helpers shared by the
 * sub-commands. Exit status: 0 success, 1 failure (one line on stderr
 * naming the file and the cause), 2 usage error.
 *
 * mount.fuse3 runs "ckfs SRC MNT -o OPTS": a first argument that is not a
 * sub-command is taken as a mount.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	if (cmd[0] != '-' && argc >= 3)
		return ckfs_cmd_mount(argc, argv); /* mount.fuse3: ckfs SRC MNT -o ... */
	ckfs_cli_say("unknown command '%s'", cmd);
	fputc('\n', stderr);
	usage(stderr);
	return 2;
}
