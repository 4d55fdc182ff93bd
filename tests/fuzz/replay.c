/* SPDX-License-Identifier: MIT */
/*
 * Replay driver: runs a fuzz target over every file of the folders given
 * on the command line (corpora and seeds), so the corpus is exercised by
 * every build, with any compiler, in CI. Prints the closing count line.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	struct stat st;

	if (!f || fstat(fileno(f), &st) != 0) {
		if (f)
			fclose(f);
		return -1;
	}
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	size_t n = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
	fclose(f);
	if (!buf)
		return -1;
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	return 0;
}

static int run_tree(const char *dir, int *count)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d)
		return run_file(dir) == 0 ? (++*count, 0) : -1;
	while ((de = readdir(d))) {
		char path[4096];
		struct stat st;
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (stat(path, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode))
			run_tree(path, count);
		else if (S_ISREG(st.st_mode) && run_file(path) == 0)
			(*count)++;
	}
	closedir(d);
	return 0;
}

int main(int argc, char **argv)
{
	int count = 0, failed = 0;

	for (int i = 1; i < argc; i++)
		if (run_tree(argv[i], &count) != 0) {
			fprintf(stderr, "replay: cannot read '%s'\n", argv[i]);
			failed++;
		}
	/* Reaching here means no input crashed, hung or tripped a sanitizer. */
	printf("%d passed, %d failed\n", count, failed);
	return failed || count == 0;
}
