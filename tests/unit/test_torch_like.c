/* SPDX-License-Identifier: MIT */
/*
 * A rank file read by rank 0's template (ckfs_torch_open with .like,
 * include/ckfs/torch.h) against the same file run through the pickle
 * (.derive_locals alone): equal entries, or the same refusal.
 *
 * - Every rank file of tests/fixtures beside its rank 0 (torch 2.4 to
 *   2.15, verl 0.5 to 0.8, 1-d and 2-d meshes, plain tensors, edge
 *   cases): both ways agree, and the template is taken where the file is
 *   rank 0's but for the mesh coordinate.
 * - Rank 1 of a verl FSDP2 actor (torch 2.8) and rank 3 of a torch 2.13
 *   FSDP2 save (a DeviceMesh with a layout and _rank), each byte of
 *   data.pkl and of the zip directory changed in turn (two ways): both
 *   ways agree on every copy, and the template accepts no copy whose
 *   data.pkl changed, but in a value the decode does not read (a hash,
 *   _rank, a process group name).
 */
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/err.h"
#include "ckfs/torch.h"
#include "ckfs/zip.h"
#include "../fuzz/like_diff.h"
#include "test.h"

static size_t pairs_seen, like_taken;

/* The mesh coordinate the file at f holds (its first DTensor's), in c;
 * NULL when it holds none. */
static const int64_t *coord_of(struct ckfs_file f, const char *label, int64_t *c)
{
	struct ckfs_torch_file a;
	struct ckfs_error err;
	const int64_t *coord = NULL;

	if (ckfs_torch_open(&a, f, &(struct ckfs_torch_open_opts){ .label = label }, &err) != CKFS_OK)
		return NULL;
	for (size_t i = 0; !coord && i < a.n_entries; i++)
		if (a.entries[i].kind == CKFS_ENTRY_DTENSOR && a.entries[i].dtensor->have_coord)
			coord = memcpy(c, a.entries[i].dtensor->coord, sizeof(int64_t) * CKFS_MAX_DIMS);
	ckfs_torch_close(&a);
	return coord;
}

/* The file at f read both ways with like, the template's with coord (the
 * rank's place in the mesh); true when the template was taken. The
 * results and the messages must agree. */
static bool both_ways(struct ckfs_file f, const char *label, const struct ckfs_torch_like *like,
		      const int64_t *coord)
{
	char why[2200];
	bool taken;

	if (!like_agrees(f, label, like, coord, &taken, why, sizeof(why))) {
		fprintf(stderr, "  %s: the template and the pickle differ: %s\n", label, why);
		CHECK(0);
	}
	return taken;
}

/* rank 0's file as a template, or NULL. */
static struct ckfs_torch_like *template_of(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct ckfs_torch_file t;
	struct ckfs_torch_like *like = NULL;
	struct ckfs_error err;

	if (fd < 0)
		return NULL;
	const struct ckfs_torch_open_opts o = { .label = path, .derive_locals = true,
						.as_template = true };
	if (ckfs_torch_open(&t, ckfs_file_of_fd(fd), &o, &err) == CKFS_OK) {
		CHECK_EQ_INT(ckfs_torch_like_new(&t, &like, &err), CKFS_OK);
		ckfs_torch_close(&t);
	}
	close(fd);
	return like;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	size_t n = strlen(path);
	const char *tail = "_rank_0.pt";
	size_t tl = strlen(tail);

	(void)st;
	(void)ftw;
	if (type != FTW_F || n <= tl || strcmp(path + n - tl, tail) != 0)
		return 0;
	struct ckfs_torch_like *like = template_of(path);
	if (!like)
		return 0;
	for (int r = 1; r < 8; r++) {
		char other[4096];
		snprintf(other, sizeof(other), "%.*s_rank_%d.pt", (int)(n - tl), path, r);
		int fd = open(other, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			break;
		int64_t c[CKFS_MAX_DIMS];
		const int64_t *coord = coord_of(ckfs_file_of_fd(fd), other, c);
		pairs_seen++;
		bool t = both_ways(ckfs_file_of_fd(fd), other, like, coord);
		like_taken += t;
		close(fd);
	}
	ckfs_torch_like_free(like);
	return 0;
}

static void test_fixtures_agree(void)
{
	CHECK_EQ_INT(nftw(CKFS_FIXTURES, visit, 16, FTW_PHYS), 0);
	fprintf(stderr, "  %zu rank files beside their rank 0, %zu read by the template\n",
		pairs_seen, like_taken);
	CHECK(pairs_seen > 100);
	CHECK(like_taken > pairs_seen / 3);
}

/* The record of data.pkl and the central directory of the zip in buf. */
static void regions(const char *path, uint64_t *pkl_at, uint64_t *pkl_len, uint64_t *dir_at)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct ckfs_zip z;
	struct ckfs_error err;
	struct stat st;

	*pkl_at = *pkl_len = *dir_at = 0;
	if (fd < 0 || fstat(fd, &st) != 0 ||
	    ckfs_zip_open(&z, ckfs_file_of_fd(fd), 0, (uint64_t)st.st_size, path, &err) != CKFS_OK) {
		CHECK(0);
		if (fd >= 0)
			close(fd);
		return;
	}
	const struct ckfs_zip_entry *p = ckfs_zip_find(&z, "data.pkl");
	uint64_t last = 0;
	for (size_t i = 0; i < z.n_entries; i++)
		if (z.entries[i].data_offset + z.entries[i].comp_size > last)
			last = z.entries[i].data_offset + z.entries[i].comp_size;
	*pkl_at = p ? p->data_offset : 0;
	*pkl_len = p ? p->comp_size : 0;
	*dir_at = last; /* the central directory and the end records follow the data */
	ckfs_zip_release(&z);
	close(fd);
}

/* Whether pkl[off] is in a value the decode does not read: the 8 value
 * bytes of a LONG1 (what torch writes for the _hash of a DeviceMesh and
 * of a DTensorSpec), the BININT1 of a DeviceMesh's _rank (torch 2.11 on:
 * "_rank", BINPUT n, BININT1 r), or a process group name (a BINUNICODE
 * within 64 bytes after "_dim_group_names"). Only those bytes of
 * data.pkl may change in a rank file read by its template. */
static bool unread_value(const unsigned char *pkl, size_t len, size_t off)
{
	for (size_t j = off >= 9 ? off - 9 : 0; j + 1 < len && j + 2 <= off; j++)
		if (pkl[j] == 0x8a && pkl[j + 1] == 8 && off < j + 10)
			return true;
	if (off >= 9 && pkl[off - 1] == 'K' && memcmp(pkl + off - 8, "_rank", 5) == 0)
		return true;
	for (size_t g = off >= 80 ? off - 80 : 0; g + 16 <= off; g++) {
		if (memcmp(pkl + g, "_dim_group_names", 16) != 0)
			continue;
		for (size_t j = g + 16; j + 5 <= off && j < g + 16 + 64; j++)
			if (pkl[j] == 'X' && off < j + 5 + (pkl[j + 1] | (size_t)pkl[j + 2] << 8))
				return true;
	}
	return false;
}

/* Every byte of rank's data.pkl and zip directory changed in turn, the
 * copy read both ways. */
static void mutate_all(const char *rank0, const char *rank)
{
	struct ckfs_torch_like *like = template_of(rank0);
	size_t len;
	unsigned char *buf = test_slurp(rank, &len);
	uint64_t pkl_at, pkl_len, dir_at;
	char path[] = "/tmp/ckfs-test-like-XXXXXX";
	int fd = mkstemp(path);
	size_t copies = 0, taken = 0, taken_pkl = 0;

	CHECK(like && buf && fd >= 0);
	if (!like || !buf || fd < 0)
		goto out;
	int64_t c[CKFS_MAX_DIMS];
	const int64_t *coord = NULL;
	int rfd = open(rank, O_RDONLY | O_CLOEXEC);
	if (rfd >= 0) {
		coord = coord_of(ckfs_file_of_fd(rfd), rank, c);
		close(rfd);
	}
	CHECK(coord != NULL);
	regions(rank, &pkl_at, &pkl_len, &dir_at);
	CHECK(pkl_len > 0 && dir_at > pkl_at);
	for (uint64_t off = pkl_at; off < len; off++) {
		if (off == pkl_at + pkl_len)
			off = dir_at;
		static const unsigned char flips[] = { 0x01, 0xff };
		for (size_t k = 0; k < sizeof(flips); k++) {
			buf[off] ^= flips[k];
			CHECK(pwrite(fd, buf, len, 0) == (ssize_t)len && ftruncate(fd, (off_t)len) == 0);
			bool t = both_ways(ckfs_file_of_fd(fd), rank, like, coord);
			buf[off] ^= flips[k];
			copies++;
			taken += t;
			taken_pkl += t && off < pkl_at + pkl_len;
			if (t && off < pkl_at + pkl_len)
				CHECK(unread_value(buf + pkl_at, pkl_len, off - pkl_at));
		}
	}
	fprintf(stderr, "  %s: %zu changed copies, %zu read by the template (%zu with data.pkl "
		"changed)\n", rank, copies, taken, taken_pkl);
	CHECK(copies > 1000);
	CHECK(taken > 0);
out:
	ckfs_torch_like_free(like);
	free(buf);
	if (fd >= 0) {
		close(fd);
		unlink(path);
	}
}

#define FSDP2 CKFS_FIXTURES "/clients/fsdp/qwen2_fsdp2_w2/model_world_size_2_rank_"
#define T213 CKFS_FIXTURES "/matrix/torch-2.13.0/fsdp2/model_world_size_4_rank_"

static void test_mutations(void)
{
	mutate_all(FSDP2 "0.pt", FSDP2 "1.pt");
	mutate_all(T213 "0.pt", T213 "3.pt");
}

int main(void)
{
	RUN(test_fixtures_agree);
	RUN(test_mutations);
	return test_summary();
}
