/* SPDX-License-Identifier: MIT */
/*
 * Derived local headers (CKFS_ZIP_DERIVE_LOCALS, include/ckfs/zip.h) and
 * the guards that check them before a storage is read (src/model/guards.c,
 * src/layouts/torch_guards.c).
 *
 * - Every torch.save file of tests/fixtures, opened with and without
 *   derivation, gives the same records at the same data offsets, and each
 *   derived header passes its check (argv paths are checked the same way:
 *   `test_zip_derive FILE...` for a large checkpoint by hand).
 * - A real rank file with one derived storage's local header damaged
 *   (copied to a temporary file, the damage written by hand): the
 *   derived open succeeds, the check of that record fails with the
 *   one-line message, through ckfs_zip_check_derived and through a guard
 *   of a source, every time, and records around it still pass.
 */
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/err.h"
#include "ckfs/model.h"
#include "ckfs/torch.h"
#include "ckfs/zip.h"
#include "layouts/layouts.h"
#include "test.h"

#define RANK1 CKFS_FIXTURES "/clients/fsdp/qwen2_fsdp2_w2/model_world_size_2_rank_1.pt"
#define VICTIM "model_world_size_2_rank_1/data/10"

static size_t files_seen, derived_seen;

static uint64_t size_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* path read both ways: same entries, same offsets, derived ones pass. */
static void compare_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct ckfs_zip a, b;
	struct ckfs_error err;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	uint64_t size = size_of(fd);
	enum ckfs_code ra = ckfs_zip_open(&a, ckfs_file_of_fd(fd), 0, size, path, &err);
	enum ckfs_code rb = ckfs_zip_open_ex(&b, ckfs_file_of_fd(fd), 0, size, path,
					     CKFS_ZIP_DERIVE_LOCALS, &err);
	CHECK_EQ_INT(ra, rb);
	if (ra == CKFS_OK && rb == CKFS_OK) {
		files_seen++;
		CHECK_EQ_INT(a.n_entries, b.n_entries);
		for (size_t i = 0; i < a.n_entries && i < b.n_entries; i++) {
			CHECK_EQ_STR(a.entries[i].name, b.entries[i].name);
			CHECK_EQ_INT(a.entries[i].data_offset, b.entries[i].data_offset);
			CHECK_EQ_INT(a.entries[i].header_offset, b.entries[i].header_offset);
			CHECK(!a.entries[i].derived);
			if (!b.entries[i].derived)
				continue;
			derived_seen++;
			CHECK_EQ_INT(ckfs_zip_check_derived(&b, &b.entries[i], &err), CKFS_OK);
		}
	}
	if (ra == CKFS_OK)
		ckfs_zip_release(&a);
	if (rb == CKFS_OK)
		ckfs_zip_release(&b);
	close(fd);
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	size_t n = strlen(path);

	(void)st;
	(void)ftw;
	if (type == FTW_F && n > 3 && strcmp(path + n - 3, ".pt") == 0)
		compare_file(path);
	return 0;
}

static void test_fixtures_agree(void)
{
	CHECK_EQ_INT(nftw(CKFS_FIXTURES, visit, 16, FTW_PHYS), 0);
	fprintf(stderr, "  %zu torch.save files, %zu derived local headers\n", files_seen,
		derived_seen);
	CHECK(files_seen > 100);
	CHECK(derived_seen > 0);
}

/* A copy of RANK1 in a temporary file with its bytes at off replaced;
 * the fd, or -1. */
static int damaged_copy(char *path, uint64_t off, const void *bytes, size_t n)
{
	size_t len;
	unsigned char *buf = test_slurp(RANK1, &len);
	int fd = mkstemp(path);

	if (!buf || fd < 0 || off + n > len) {
		free(buf);
		return -1;
	}
	memcpy(buf + off, bytes, n);
	if (write(fd, buf, len) != (ssize_t)len) {
		close(fd);
		fd = -1;
	}
	free(buf);
	return fd;
}

/* The local header of VICTIM, as the undamaged file has it. */
static uint64_t victim_header(uint64_t *data)
{
	int fd = open(RANK1, O_RDONLY | O_CLOEXEC);
	struct ckfs_zip z;
	struct ckfs_error err;
	uint64_t at = 0;

	if (fd < 0 || ckfs_zip_open_ex(&z, ckfs_file_of_fd(fd), 0, size_of(fd), RANK1,
				       CKFS_ZIP_DERIVE_LOCALS, &err) != CKFS_OK)
		return 0;
	for (size_t i = 0; i < z.n_entries; i++)
		if (strcmp(z.entries[i].name, VICTIM) == 0 && z.entries[i].derived) {
			at = z.entries[i].header_offset;
			*data = z.entries[i].data_offset;
		}
	ckfs_zip_release(&z);
	close(fd);
	return at;
}

struct damage {
	const char *what;
	unsigned rel;                   /* offset in the local header */
	unsigned char bytes[4];
	size_t n;
	const char *cause;              /* after "'<file>': " */
};

static void test_damaged_header(void)
{
	uint64_t data = 0, lho = victim_header(&data);
	char msg[512];
	const struct damage cases[] = {
		{ "extra field 64 bytes longer", 28, { 0 }, 2, NULL },
		{ "signature", 0, { 'P', 'K', 9, 9 }, 4,
		  "bad local header signature for zip entry '" VICTIM "'" },
		{ "name", 30 + 26, { 'x' }, 1,
		  "local header name of zip entry '" VICTIM "' differs from the central "
		  "directory" },
		{ "method", 8, { 8, 0 }, 2,
		  "local header of zip entry '" VICTIM "' has method 8, central directory 0" },
	};

	CHECK(lho > 0);
	if (!lho)
		return;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct damage d = cases[c];
		char path[] = "/tmp/ckfs-derive-XXXXXX";
		struct ckfs_zip z;
		struct ckfs_error err;
		unsigned char bytes[4];
		uint64_t xlen = data - lho - 30 - strlen(VICTIM);

		memcpy(bytes, d.bytes, sizeof(bytes));
		if (c == 0) { /* the extra field's length, 64 more */
			bytes[0] = (unsigned char)((xlen + 64) & 0xff);
			bytes[1] = (unsigned char)((xlen + 64) >> 8);
			snprintf(msg, sizeof(msg), "local header of zip entry '" VICTIM "' puts "
				 "its data at %llu, not at %llu where torch.save's alignment would",
				 (unsigned long long)(data + 64), (unsigned long long)data);
		} else {
			snprintf(msg, sizeof(msg), "%s", d.cause);
		}
		int fd = damaged_copy(path, lho + d.rel, bytes, d.n);
		CHECK(fd >= 0);
		if (fd < 0)
			continue;
		char want[700];
		snprintf(want, sizeof(want), "'%s': %s", path, msg);

		/* the open passes: the header was not read */
		CHECK_EQ_INT(ckfs_zip_open_ex(&z, ckfs_file_of_fd(fd), 0, size_of(fd), path,
					      CKFS_ZIP_DERIVE_LOCALS, &err), CKFS_OK);
		const struct ckfs_zip_entry *e = NULL;
		for (size_t i = 0; i < z.n_entries; i++)
			if (strcmp(z.entries[i].name, VICTIM) == 0)
				e = &z.entries[i];
		CHECK(e && e->derived);
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_zip_check_derived(&z, e, &err), CKFS_E_FORMAT);
		CHECK_EQ_STR(err.msg, want);
		ckfs_zip_release(&z);

		/* through a source's guards: the damaged storage refused each
		 * time, others served */
		struct ckfs_torch_file tf;
		struct ckfs_source s = { .path = path, .f = ckfs_file_of_fd(fd) };
		const struct ckfs_torch_open_opts o = { .label = path, .derive_locals = true };
		CHECK_EQ_INT(ckfs_torch_open(&tf, s.f, &o, &err), CKFS_OK);
		CHECK_EQ_INT(ckfs_torch_guards(&s, &tf, &err), CKFS_OK);
		ckfs_torch_close(&tf);
		CHECK(s.guards && s.guards->n > 1);
		for (int again = 0; again < 2; again++) {
			ckfs_error_clear(&err);
			CHECK_EQ_INT(ckfs_source_guard(&s, data, 4, &err), CKFS_E_FORMAT);
			CHECK_EQ_STR(err.msg, want);
		}
		for (size_t i = 0; s.guards && i < s.guards->n; i++) {
			uint64_t at = ckfs_guard_start(&s.guards->v[i]);
			if (at != lho)
				CHECK_EQ_INT(ckfs_source_guard(&s, at, 1, &err), CKFS_OK);
		}
		CHECK_EQ_INT(ckfs_guards_passed(s.guards), s.guards ? s.guards->n - 1 : 0);
		/* back from the plan cache's words: the same */
		if (s.guards) {
			size_t n = ckfs_guards_words(s.guards, NULL), used = 0;
			uint64_t *v = malloc(n * sizeof(*v));
			struct ckfs_guards *back = NULL;
			CHECK(v != NULL);
			ckfs_guards_words(s.guards, v);
			CHECK_EQ_INT(ckfs_guards_from_words(ckfs_torch_guard_fn(), v, n, &used, &back,
							    &err), CKFS_OK);
			CHECK_EQ_INT(used, n);
			CHECK_EQ_INT(back ? back->n : 0, s.guards->n);
			CHECK_EQ_INT(ckfs_guards_passed(back), 0);
			ckfs_guards_free(s.guards);
			s.guards = back;
			ckfs_error_clear(&err);
			CHECK_EQ_INT(ckfs_source_guard(&s, data + 1, 8, &err), CKFS_E_FORMAT);
			CHECK_EQ_STR(err.msg, want);
			free(v);
		}
		ckfs_guards_free(s.guards);
		close(fd);
		unlink(path);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			compare_file(argv[i]);
		fprintf(stderr, "%zu files, %zu derived local headers\n", files_seen,
			derived_seen);
		return test_failures_total ? 1 : 0;
	}
	RUN(test_fixtures_agree);
	RUN(test_damaged_header);
	return test_summary();
}
