/* SPDX-License-Identifier: MIT */
/* Logging: see include/ckfs/log.h. */
#include "ckfs/log.h"

#include "ckfs/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static enum ckfs_log_level current_level = CKFS_LOG_NOTICE;
static ckfs_log_sink current_sink;

void ckfs_log_set_level(enum ckfs_log_level level) { current_level = level; }
enum ckfs_log_level ckfs_log_get_level(void) { return current_level; }
void ckfs_log_set_sink(ckfs_log_sink sink) { current_sink = sink; }

void ckfs_log(enum ckfs_log_level level, const char *fmt, ...)
{
	char raw[2048], line[2048];
	va_list ap;

	if (level > current_level)
		return;
	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	/* One line, whatever names it quotes (include/ckfs/text.h). */
	ckfs_text_escape(line, sizeof(line), raw);
	if (current_sink) {
		current_sink(level, line);
		return;
	}
	size_t n = strlen(line);
	if (n + 1 < sizeof(line)) {
		line[n++] = '\n';
		line[n] = '\0';
	}
	/* One write per message keeps concurrent lines whole. */
	ssize_t rc = write(STDERR_FILENO, line, n);
	(void)rc;
}
