/* SPDX-License-Identifier: MIT */
/*
 * Mount-point helpers for mount, umount and stats (src/fuse/fs.h): the
 * canonical absolute form of a path whose last component may be a dead
 * FUSE mount (stat on it fails with ENOTCONN, so realpath cannot be used
 * on it), and the lookup of a path in /proc/self/mountinfo.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuse/fs.h"

int ckfs_abs_path(const char *path, char *out, size_t size)
{
	char copy[PATH_MAX], dir[PATH_MAX];
	const char *base;
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(copy)) {
		errno = n ? ENAMETOOLONG : ENOENT;
		return -1;
	}
	memcpy(copy, path, n + 1);
	while (n > 1 && copy[n - 1] == '/')
		copy[--n] = '\0';
	char *slash = strrchr(copy, '/');
	if (!slash) {
		base = copy;
		snprintf(dir, sizeof(dir), ".");
	} else if (slash == copy) {
		base = copy + 1;
		snprintf(dir, sizeof(dir), "/");
	} else {
		*slash = '\0';
		base = slash + 1;
		snprintf(dir, sizeof(dir), "%s", copy);
	}
	if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
		/* "/", "x/.", "..": nothing to protect, resolve it all. */
		if (!realpath(path, dir))
			return -1;
		if (strlen(dir) >= size) {
			errno = ENAMETOOLONG;
			return -1;
		}
		memcpy(out, dir, strlen(dir) + 1);
		return 0;
	}
	char real[PATH_MAX];
	if (!realpath(dir, real))
		return -1;
	int w = snprintf(out, size, "%s/%s", strcmp(real, "/") == 0 ? "" : real, base);
	if (w < 0 || (size_t)w >= size) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

/* Undo mountinfo's octal escapes (\040 space, \011 tab, \012, \134). */
static void unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' &&
		    s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*w++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*w++ = *s;
		}
	}
	*w = '\0';
}

int ckfs_mountinfo_lookup(const char *path, char *fstype, size_t fstype_size,
			  char *dev, size_t dev_size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int found = 0;

	if (!f)
		return -1;
	while (getline(&line, &cap, f) > 0) {
		/* id parent major:minor root mountpoint options [tags] - type src */
		char *save = NULL, *tok = strtok_r(line, " ", &save);
		char *mnt = NULL, *type = NULL, *devno = NULL;
		for (int field = 0; tok; field++, tok = strtok_r(NULL, " \n", &save)) {
			if (field == 2)
				devno = tok;
			if (field == 4)
				mnt = tok;
			if (strcmp(tok, "-") == 0 && field >= 6) {
				type = strtok_r(NULL, " \n", &save);
				break;
			}
		}
		if (!mnt || !type)
			continue;
		unescape(mnt);
		if (strcmp(mnt, path) != 0)
			continue;
		/* The last entry for a path is the mount on top. */
		found = 1;
		if (fstype && fstype_size)
			snprintf(fstype, fstype_size, "%s", type);
		if (dev && dev_size)
			snprintf(dev, dev_size, "%s", devno ? devno : "");
	}
	free(line);
	fclose(f);
	return found;
}
