/* SPDX-License-Identifier: MIT */
/*
 * ckfs_bench_convert: the least CPU time any server needs to turn these
 * fp32 files into bf16 on this machine (benchmark tool, not part of ckfs).
 * Each file is pread in 1 MiB windows into one reused buffer, as
 * src/model/read.c does, and converted with ckfs_convert, ckfs's own
 * vectorised loop, into one reused 4 MiB buffer: no FUSE, no cache, no
 * plan, one thread. tests/bench/bench.sh compares it with the first reads.
 * With --mmap each window is mapped instead (MAP_POPULATE, unmapped after:
 * what read.c did before; the page-table work costs more than pread's copy).
 *
 *   ckfs_bench_convert [--mmap] FILE...    prints "CPU_SECONDS INPUT_BYTES"
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/dtype.h"

#define WINDOW (1u << 20)
#define OUT_BYTES (4u << 20)

static double cpu_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	unsigned char *out = aligned_alloc(4096, OUT_BYTES);
	unsigned char *win = aligned_alloc(4096, WINDOW);
	uint64_t total = 0, at = 0;
	int first = 1, map = 0;
	double t0;

	if (argc > 1 && strcmp(argv[1], "--mmap") == 0) {
		map = 1;
		first = 2;
	}
	if (argc <= first || !out || !win) {
		fputs("usage: ckfs_bench_convert [--mmap] FILE...\n", stderr);
		return 2;
	}
	t0 = cpu_now();
	for (int i = first; i < argc; i++) {
		struct stat st;
		int fd = open(argv[i], O_RDONLY | O_CLOEXEC);

		if (fd < 0 || fstat(fd, &st) != 0) {
			perror(argv[i]);
			return 1;
		}
		for (uint64_t pos = 0; pos + WINDOW <= (uint64_t)st.st_size; pos += WINDOW) {
			void *p = win;
			if (map) {
				p = mmap(NULL, WINDOW, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
					 (off_t)pos);
				if (p == MAP_FAILED) {
					perror(argv[i]);
					return 1;
				}
			} else if (pread(fd, win, WINDOW, (off_t)pos) != (ssize_t)WINDOW) {
				fprintf(stderr, "%s: short read\n", argv[i]);
				return 1;
			}
			ckfs_convert(CKFS_DTYPE_BF16, out + at, CKFS_DTYPE_F32, p, WINDOW / 4, 0);
			at = (at + WINDOW / 2) % OUT_BYTES;
			if (map)
				munmap(p, WINDOW);
			total += WINDOW;
		}
		close(fd);
	}
	printf("%.3f %" PRIu64 "\n", cpu_now() - t0, total);
	free(out);
	free(win);
	return 0;
}
