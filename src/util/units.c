/* SPDX-License-Identifier: MIT */
/* Sizes and shapes as people read and write them: include/ckfs/units.h. */
#include "ckfs/units.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t ckfs_parse_size(const char *text)
{
	static const struct { const char *unit; double mult; } units[] = {
		{ "KIB", 1024.0 }, { "MIB", 1048576.0 }, { "GIB", 1073741824.0 },
		{ "TIB", 1099511627776.0 }, { "KB", 1e3 }, { "MB", 1e6 },
		{ "GB", 1e9 }, { "TB", 1e12 }, { "B", 1.0 }, { "", 1.0 },
	};
	char *end;
	double v = strtod(text, &end);
	char unit[8];
	size_t n = 0;

	if (end == text || !(v > 0) || !isfinite(v))
		return 0;
	while (*end == ' ')
		end++;
	for (; *end && n < sizeof(unit) - 1; end++)
		unit[n++] = (char)toupper((unsigned char)*end);
	unit[n] = '\0';
	if (*end)
		return 0;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcmp(unit, units[i].unit) == 0) {
			double bytes = v * units[i].mult;
			if (bytes < 1 || bytes > 9e18)
				return 0;
			return (uint64_t)bytes;
		}
	return 0;
}

void ckfs_format_bytes(double bytes, char *buf, size_t size)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int u = 0;

	while (bytes >= 1024 && u < 4) {
		bytes /= 1024;
		u++;
	}
	snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

const char *ckfs_format_dims(int n, const int64_t *v, const char *open, const char *close,
			     char *buf, size_t size)
{
	size_t k = (size_t)snprintf(buf, size, "%s", open);
	for (int i = 0; i < n && k < size; i++)
		k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)v[i]);
	if (k < size)
		snprintf(buf + k, size - k, "%s", close);
	return buf;
}
