/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for src/fmt/zip.c. Valid inputs come from real writers
 * (torch.save in several modes, Python's zipfile, torch DCP) under
 * tests/fixtures/zip/; broken ones are hand-crafted under tests/corpus/zip/.
 * Both are produced by tests/gen/make_zip_vectors.py and committed, and
 * each broken file is listed below with its exact code and message.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/err.h"
#include "ckfs/limits.h"
#include "ckfs/zip.h"
#include "test.h"

#define FIX(name) CKFS_FIXTURES "/zip/" name
#define CORPUS(name) CKFS_CORPUS "/zip/" name

static const char hello[] = "hello, zip\n";

/* Whole small file into memory (test inputs only), NUL-terminated. */
static uint64_t file_size(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Open path as a zip covering [base, size - tail). Returns the code. */
static enum ckfs_code open_zip(struct ckfs_zip *z, const char *path,
			       uint64_t base, uint64_t tail, const char *label,
			       struct ckfs_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	uint64_t size;
	enum ckfs_code rc;

	ckfs_error_clear(err);
	memset(z, 0, sizeof(*z));
	z->file = CKFS_FILE_NONE;
	if (fd < 0) {
		fprintf(stderr, "cannot open %s\n", path);
		return CKFS_E_IO;
	}
	size = file_size(fd);
	rc = ckfs_zip_open(z, ckfs_file_of_fd(fd), base, size - base - tail, label, err);
	if (rc)
		close(fd);
	return rc;
}

static void close_zip(struct ckfs_zip *z)
{
	int fd = z->file.fd;

	ckfs_zip_release(z);
	if (fd >= 0)
		close(fd);
}

/* Read a record through the public API, expecting success. */
static char *record(const struct ckfs_zip *z, const char *name, size_t *len)
{
	const struct ckfs_zip_entry *e = ckfs_zip_find(z, name);
	struct ckfs_error err;
	void *buf = NULL;

	*len = 0;
	ckfs_error_clear(&err);
	if (!e) {
		fprintf(stderr, "record '%s' not found\n", name);
		return NULL;
	}
	if (ckfs_zip_read_record(z, e, CKFS_MAX_METADATA_BYTES, &buf, len,
				 &err) != CKFS_OK) {
		fprintf(stderr, "reading '%s': %s\n", name, err.msg);
		return NULL;
	}
	return buf;
}

/* Raw bytes at an entry's data_offset, as the tensor reader will read them. */
static int data_equals(const struct ckfs_zip *z, const char *name,
		       const char *expect_path)
{
	const struct ckfs_zip_entry *e = ckfs_zip_find(z, name);
	size_t n;
	char *want = (char *)test_slurp(expect_path, &n);
	char *got = NULL;
	int ok = 0;

	if (e && want && e->size == n && e->method == 0) {
		got = malloc(n + 1);
		ok = got && pread(z->file.fd, got, n, (off_t)e->data_offset) ==
				    (ssize_t)n &&
		     memcmp(got, want, n) == 0;
	}
	free(got);
	free(want);
	return ok;
}

/* The 40-line text the generator uses for compressible records. */
static char *make_text(size_t *len)
{
	char *buf = malloc(4096);
	size_t n = 0;

	for (int i = 0; buf && i < 40; i++)
		n += (size_t)snprintf(buf + n, 4096 - n,
				      "line %d of a compressible record\n", i);
	*len = n;
	return buf;
}

/*
 * Compare the directory with a manifest written by Python's zipfile
 * ("name size crc" per entry, central directory order) after skip lines.
 */
static void check_manifest(const struct ckfs_zip *z, const char *path,
			   int skip)
{
	size_t len, i = 0;
	char *text = (char *)test_slurp(path, &len), *line, *save = NULL;

	CHECK(text != NULL);
	if (!text)
		return;
	line = strtok_r(text, "\n", &save);
	for (; line && skip > 0; skip--)
		line = strtok_r(NULL, "\n", &save);
	for (; line; line = strtok_r(NULL, "\n", &save), i++) {
		char name[256];
		unsigned long long size;
		unsigned int crc;

		CHECK_EQ_INT(sscanf(line, "%255s %llu %x", name, &size, &crc), 3);
		CHECK(i < z->n_entries);
		if (i >= z->n_entries)
			break;
		CHECK_EQ_STR(z->entries[i].name, name);
		CHECK_EQ_INT(z->entries[i].size, size);
		CHECK_EQ_INT(z->entries[i].crc32, crc);
	}
	CHECK_EQ_INT(i, z->n_entries);
	free(text);
}

/* torch.save to "sd.pt": folder "sd", 64-byte aligned stored records. */
static void test_torch_save(void)
{
	static const char *const records[] = {
		"data.pkl", ".format_version", ".storage_alignment", "byteorder",
		"data/0", "data/1", "data/2", "version",
		".data/serialization_id",
	};
	struct ckfs_error err;
	struct ckfs_zip z;
	size_t len, checked = 0;
	char *s;

	CHECK_EQ_INT(open_zip(&z, FIX("sd.pt"), 0, 0, "sd.pt", &err), CKFS_OK);
	if (err.code) {
		fprintf(stderr, "%s\n", err.msg);
		return;
	}
	CHECK_EQ_STR(z.prefix, "sd/");
	CHECK_EQ_INT(z.n_entries, 9);
	check_manifest(&z, FIX("sd.records.txt"), 0);
	for (size_t i = 0; i < sizeof(records) / sizeof(records[0]); i++) {
		const struct ckfs_zip_entry *e = ckfs_zip_find(&z, records[i]);

		CHECK(e != NULL);
		if (!e)
			continue;
		CHECK(e == &z.entries[i]); /* torch's file order */
		CHECK_EQ_INT(e->data_offset % 64, 0);
		CHECK_EQ_INT(e->method, 0);
		CHECK_EQ_INT(e->comp_size, e->size);
		CHECK(e->data_offset > e->header_offset + 30);
		/* Bit 3 (data descriptor) is set except for the empty record. */
		CHECK_EQ_INT(e->flags, e->size ? 0x0808 : 0x0800);
	}
	CHECK(data_equals(&z, "data/0", FIX("sd.data0.bin")));
	CHECK(data_equals(&z, "data/1", FIX("sd.data1.bin")));

	s = record(&z, "version", &len);
	CHECK_EQ_STR(s, "3\n");
	free(s);
	s = record(&z, "byteorder", &len);
	CHECK_EQ_STR(s, "little");
	free(s);
	s = record(&z, ".storage_alignment", &len);
	CHECK_EQ_STR(s, "64");
	free(s);
	s = record(&z, "data/2", &len); /* the empty tensor's storage */
	CHECK(s != NULL && len == 0 && s[0] == '\0');
	free(s);
	s = record(&z, "data.pkl", &len);
	CHECK(s != NULL && len == 300 && (unsigned char)s[0] == 0x80);
	free(s);

	CHECK(ckfs_zip_find(&z, "sd/data.pkl") == NULL);
	CHECK(ckfs_zip_find(&z, "data") == NULL);
	CHECK(ckfs_zip_find(&z, "data/3") == NULL);
	CHECK(ckfs_zip_find(&z, "") == NULL);

	CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
	CHECK_EQ_INT(checked, 8); /* all but the empty record (CRC 0) */
	close_zip(&z);
}

/* torch.save to a BytesIO or a non-ASCII path: folder "archive". */
static void test_torch_archive_prefix(void)
{
	static const char *const files[] = { FIX("bytesio.pt"),
					     FIX("nonascii.pt") };
	for (size_t i = 0; i < 2; i++) {
		struct ckfs_error err;
		struct ckfs_zip z;
		size_t checked;

		CHECK_EQ_INT(open_zip(&z, files[i], 0, 0, "archive.pt", &err),
			     CKFS_OK);
		if (err.code)
			continue;
		CHECK_EQ_STR(z.prefix, "archive/");
		CHECK_EQ_STR(z.entries[0].name, "archive/data.pkl");
		CHECK(ckfs_zip_find(&z, "data.pkl") == &z.entries[0]);
		CHECK(data_equals(&z, "data/0", FIX("sd.data0.bin")));
		for (size_t j = 0; j < z.n_entries; j++)
			CHECK_EQ_INT(z.entries[j].data_offset % 64, 0);
		CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
		CHECK_EQ_INT(checked, 8);
		close_zip(&z);
	}
}

/* torch.serialization.set_crc32_options(False): all CRCs are 0. */
static void test_torch_nocrc(void)
{
	struct ckfs_error err;
	struct ckfs_zip z;
	size_t checked = 99;

	CHECK_EQ_INT(open_zip(&z, FIX("nocrc.pt"), 0, 0, "nocrc.pt", &err),
		     CKFS_OK);
	if (err.code)
		return;
	CHECK_EQ_STR(z.prefix, "nocrc/");
	CHECK_EQ_INT(z.n_entries, 9);
	for (size_t i = 0; i < z.n_entries; i++) {
		CHECK_EQ_INT(z.entries[i].crc32, 0);
		CHECK_EQ_INT(z.entries[i].data_offset % 64, 0);
	}
	CHECK(data_equals(&z, "data/0", FIX("sd.data0.bin")));
	CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
	CHECK_EQ_INT(checked, 0);
	close_zip(&z);
}

/* The same records rewritten by zipfile: two deflated, one zip64 local. */
static void test_zipfile_rewrite(void)
{
	struct ckfs_error err;
	struct ckfs_zip z, ref;
	size_t checked = 0;

	CHECK_EQ_INT(open_zip(&z, FIX("rezip.zip"), 0, 0, "rezip.zip", &err),
		     CKFS_OK);
	if (err.code)
		return;
	CHECK_EQ_INT(open_zip(&ref, FIX("sd.pt"), 0, 0, "sd.pt", &err),
		     CKFS_OK);
	CHECK_EQ_STR(z.prefix, "sd/");
	check_manifest(&z, FIX("rezip.records.txt"), 0);
	CHECK_EQ_INT(ckfs_zip_find(&z, "data.pkl")->method, 8);
	CHECK_EQ_INT(ckfs_zip_find(&z, "data/0")->method, 8);
	CHECK(ckfs_zip_find(&z, "data/0")->comp_size <
	      ckfs_zip_find(&z, "data/0")->size);
	CHECK_EQ_INT(ckfs_zip_find(&z, "data/1")->method, 0);
	/* data/1 has a 20-byte zip64 block in its local header only. */
	CHECK_EQ_INT(ckfs_zip_find(&z, "data/1")->data_offset -
		     ckfs_zip_find(&z, "data/1")->header_offset,
		     30 + strlen("sd/data/1") + 20);
	CHECK(data_equals(&z, "data/1", FIX("sd.data1.bin")));
	for (size_t i = 0; i < ref.n_entries; i++) {
		const char *name = ref.entries[i].name + strlen(ref.prefix);
		size_t la, lb;
		char *a = record(&z, name, &la), *b = record(&ref, name, &lb);

		CHECK(a && b && la == lb && memcmp(a, b, la) == 0);
		free(a);
		free(b);
	}
	CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
	CHECK_EQ_INT(checked, 8);
	close_zip(&ref);
	close_zip(&z);
}

/* 7 bytes before and 13 after: offsets are relative to base. */
static void test_embedded(void)
{
	struct ckfs_error err;
	struct ckfs_zip z, ref;

	CHECK_EQ_INT(open_zip(&z, FIX("embedded.bin"), 7, 13, "embedded.bin",
			      &err), CKFS_OK);
	if (err.code) {
		fprintf(stderr, "%s\n", err.msg);
		return;
	}
	CHECK_EQ_INT(open_zip(&ref, FIX("sd.pt"), 0, 0, "sd.pt", &err),
		     CKFS_OK);
	CHECK_EQ_STR(z.prefix, "sd/");
	CHECK_EQ_INT(z.n_entries, ref.n_entries);
	for (size_t i = 0; i < z.n_entries && i < ref.n_entries; i++) {
		CHECK_EQ_STR(z.entries[i].name, ref.entries[i].name);
		CHECK_EQ_INT(z.entries[i].header_offset,
			     ref.entries[i].header_offset + 7);
		CHECK_EQ_INT(z.entries[i].data_offset,
			     ref.entries[i].data_offset + 7);
	}
	CHECK(data_equals(&z, "data/0", FIX("sd.data0.bin")));
	size_t checked = 0;
	CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
	CHECK_EQ_INT(checked, 8);
	close_zip(&ref);
	close_zip(&z);

	/* The whole file: the end records are found, but offsets are off. */
	CHECK_EQ_INT(open_zip(&z, FIX("embedded.bin"), 0, 0, "embedded.bin",
			      &err), CKFS_E_FORMAT);
	CHECK_EQ_STR(err.msg,
		     "'embedded.bin': bad zip64 end of central directory signature");
	/* A window one byte short cuts the end record. */
	CHECK_EQ_INT(open_zip(&z, FIX("embedded.bin"), 7, 14, "embedded.bin",
			      &err), CKFS_E_TRUNCATED);
	CHECK_EQ_STR(err.msg,
		     "'embedded.bin': zip end of central directory truncated");
	/* Bytes after the end record are tolerated, as most readers do. */
	CHECK_EQ_INT(open_zip(&z, FIX("embedded.bin"), 7, 0, "embedded.bin",
			      &err), CKFS_OK);
	close_zip(&z);
	/* A window past the end of the file, or past 2^63. */
	int fd = open(FIX("embedded.bin"), O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_zip_open(&z, ckfs_file_of_fd(fd), 7, file_size(fd), "embedded.bin",
				   &err), CKFS_E_TRUNCATED);
	CHECK_EQ_STR(err.msg,
		     "'embedded.bin': file is 1928 bytes, zip expected to end at 1935");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_zip_open(&z, ckfs_file_of_fd(fd), UINT64_MAX - 5, 10, "embedded.bin",
				   &err), CKFS_E_INVALID);
	ckfs_zip_release(&z);
	close(fd);
}

/*
 * A 4.4 GB torch.save made with skip_data(): past 4 GiB miniz writes zip64
 * extras in the central directory (sizes of the big record, offsets of the
 * later ones). Only its head and tail are committed; the rest is a hole,
 * so it is rebuilt here as a sparse file.
 */
static void test_torch_zip64(void)
{
	char path[512], *head, *tail, *text;
	const char *tmp = getenv("TMPDIR");
	unsigned long long size = 0, tail_off = 0;
	size_t hlen, tlen, tx, checked = 0;
	struct ckfs_error err;
	struct ckfs_zip z;
	int fd;

	head = (char *)test_slurp(FIX("big_skipdata.head"), &hlen);
	tail = (char *)test_slurp(FIX("big_skipdata.tail"), &tlen);
	text = (char *)test_slurp(FIX("big_skipdata.records.txt"), &tx);
	CHECK(head && tail && text);
	if (!head || !tail || !text)
		goto out;
	CHECK_EQ_INT(sscanf(text, "%llu %llu", &size, &tail_off), 2);
	CHECK_EQ_INT(tail_off + tlen, size);
	snprintf(path, sizeof(path), "%s/ckfs-test-zip64-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	fd = mkstemp(path);
	CHECK(fd >= 0);
	if (fd < 0)
		goto out;
	unlink(path);
	if (pwrite(fd, head, hlen, 0) != (ssize_t)hlen ||
	    pwrite(fd, tail, tlen, (off_t)tail_off) != (ssize_t)tlen) {
		fprintf(stderr, "  skipped: cannot write a sparse %llu-byte file\n",
			size);
		close(fd);
		goto out;
	}
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_zip_open(&z, ckfs_file_of_fd(fd), 0, size, "big.pt", &err), CKFS_OK);
	if (err.code) {
		fprintf(stderr, "%s\n", err.msg);
		close(fd);
		goto out;
	}
	CHECK_EQ_STR(z.prefix, "big/");
	/* The manifest follows the "size tail_offset" line. */
	check_manifest(&z, FIX("big_skipdata.records.txt"), 1);
	for (size_t i = 0; i < z.n_entries; i++)
		CHECK_EQ_INT(z.entries[i].data_offset % 64, 0);
	const struct ckfs_zip_entry *big = ckfs_zip_find(&z, "data/3");
	const struct ckfs_zip_entry *after = ckfs_zip_find(&z, "data/4");
	CHECK(big && big->size == 4400000000ull && big->comp_size == big->size);
	/* The big record ends with a 24-byte zip64 data descriptor. */
	CHECK(big && after && after->header_offset > 0xffffffffull &&
	      after->header_offset == big->data_offset + big->size + 24);
	CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
	CHECK_EQ_INT(checked, 6); /* skipped storages have CRC 0 */
	close_zip(&z);
out:
	free(head);
	free(tail);
	free(text);
}

/* A real DCP .distcp: every item is a torch.save zip at an offset. */
static void test_dcp_items(void)
{
	size_t len, n = 0;
	char *items = (char *)test_slurp(FIX("dcp.items.txt"), &len), *line, *save = NULL;

	CHECK(items != NULL);
	if (!items)
		return;
	for (line = strtok_r(items, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save), n++) {
		char key[64];
		unsigned long long off, size;
		struct ckfs_error err;
		struct ckfs_zip z;
		int fd;

		CHECK_EQ_INT(sscanf(line, "%63s %llu %llu", key, &off, &size), 3);
		fd = open(FIX("dcp.distcp"), O_RDONLY | O_CLOEXEC);
		CHECK(fd >= 0);
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_zip_open(&z, ckfs_file_of_fd(fd), off, size, "dcp.distcp", &err),
			     CKFS_OK);
		if (err.code) {
			fprintf(stderr, "%s\n", err.msg);
			close(fd);
			continue;
		}
		CHECK_EQ_STR(z.prefix, "archive/");
		CHECK(ckfs_zip_find(&z, "data.pkl") != NULL);
		for (size_t i = 0; i < z.n_entries; i++) {
			CHECK(z.entries[i].data_offset >= off);
			CHECK_EQ_INT((z.entries[i].data_offset - off) % 64, 0);
		}
		if (strcmp(key, "w") == 0)
			CHECK(data_equals(&z, "data/0", FIX("sd.data0.bin")));
		else
			CHECK(data_equals(&z, "data/0", FIX("sd.data1.bin")));
		size_t checked = 0;
		CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
		CHECK(checked > 0);
		ckfs_zip_release(&z);
		close(fd);
	}
	CHECK_EQ_INT(n, 2);
	free(items);
}

static void test_legacy(void)
{
	struct ckfs_error err;
	struct ckfs_zip z;

	CHECK_EQ_INT(open_zip(&z, FIX("legacy.pt"), 0, 0, "legacy.pt", &err),
		     CKFS_E_UNSUPPORTED);
	CHECK_EQ_STR(err.msg,
		     "'legacy.pt': legacy (non-zip) torch.save format is not supported; re-save with torch >= 1.6");
	/* A failed open leaves nothing to release, and releasing is safe. */
	CHECK(z.entries == NULL && z.hash == NULL && z.prefix == NULL);
	CHECK_EQ_INT(z.n_entries, 0);
	ckfs_zip_release(&z);
	ckfs_zip_release(&z);
	CHECK(ckfs_zip_find(&z, "data.pkl") == NULL);
}

/* Hand-crafted valid archives: stored, deflated, empty; zip64 extras. */
static void test_handcrafted_ok(void)
{
	struct ckfs_error err;
	struct ckfs_zip z;
	size_t len, tlen, checked;
	char *s, *text = make_text(&tlen);

	CHECK_EQ_INT(open_zip(&z, CORPUS("ok_small.zip"), 0, 0, "ok_small.zip",
			      &err), CKFS_OK);
	if (!err.code) {
		CHECK_EQ_STR(z.prefix, "top/");
		CHECK_EQ_INT(z.n_entries, 3);
		s = record(&z, "a.txt", &len);
		CHECK_EQ_STR(s, hello);
		free(s);
		s = record(&z, "b.txt", &len);
		CHECK(s && text && len == tlen && memcmp(s, text, len) == 0);
		free(s);
		s = record(&z, "empty", &len);
		CHECK(s && len == 0 && s[0] == '\0');
		free(s);
		CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
		CHECK_EQ_INT(checked, 2);

		/* max is inclusive; one byte less is refused. */
		const struct ckfs_zip_entry *e = ckfs_zip_find(&z, "a.txt");
		void *buf = NULL;

		CHECK_EQ_INT(ckfs_zip_read_record(&z, e, strlen(hello), &buf,
						  &len, &err), CKFS_OK);
		free(buf);
		CHECK_EQ_INT(ckfs_zip_read_record(&z, e, strlen(hello) - 1,
						  &buf, &len, &err),
			     CKFS_E_LIMIT);
		CHECK(buf == NULL && len == 0);
		CHECK_EQ_STR(err.msg,
			     "'ok_small.zip': record 'top/a.txt' is 11 bytes, more than the limit of 10");
		close_zip(&z);
	}

	CHECK_EQ_INT(open_zip(&z, CORPUS("ok_zip64_extra.zip"), 0, 0,
			      "ok_zip64_extra.zip", &err), CKFS_OK);
	if (!err.code) {
		CHECK_EQ_STR(z.prefix, "z/");
		CHECK_EQ_INT(z.entries[0].header_offset, 0);
		s = record(&z, "lho-only", &len);
		CHECK_EQ_STR(s, hello);
		free(s);
		s = record(&z, "all-three", &len);
		CHECK(s && text && len == tlen && memcmp(s, text, len) == 0);
		free(s);
		s = record(&z, "csize-only", &len);
		CHECK(s && text && len == tlen && memcmp(s, text, len) == 0);
		free(s);
		CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
		CHECK_EQ_INT(checked, 3);
		close_zip(&z);
	}
	free(text);

	/* An archive with no entries: no prefix, nothing to find. */
	CHECK_EQ_INT(open_zip(&z, CORPUS("ok_no_entries.zip"), 0, 0,
			      "ok_no_entries.zip", &err), CKFS_OK);
	if (!err.code) {
		CHECK_EQ_INT(z.n_entries, 0);
		CHECK_EQ_STR(z.prefix, "");
		CHECK(ckfs_zip_find(&z, "data.pkl") == NULL);
		CHECK_EQ_INT(ckfs_zip_verify_crc(&z, &checked, &err), CKFS_OK);
		CHECK_EQ_INT(checked, 0);
		close_zip(&z);
	}
}

enum stage { AT_OPEN, AT_READ, AT_VERIFY };

struct bad_case {
	const char *file;
	enum stage stage;
	uint64_t max;            /* for AT_READ */
	enum ckfs_code code;
	const char *msg;         /* after "'<file>': " */
};

static const struct bad_case bad_cases[] = {
	{ "empty.zip", AT_OPEN, 0, CKFS_E_TRUNCATED, "empty file" },
	{ "not_zip.txt", AT_OPEN, 0, CKFS_E_FORMAT, "not a zip archive" },
	{ "eocd_truncated.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip end of central directory truncated" },
	{ "eocd_missing.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip end of central directory not found; the file looks truncated (259 bytes)" },
	{ "cd_truncated.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip central directory truncated" },
	{ "cd_past_end.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip central directory truncated" },
	{ "cd_offset_outside.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip central directory offset out of range" },
	{ "cd_bad_sig.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "bad zip central directory signature at entry 0" },
	{ "cd_trailing.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip central directory has 47 bytes after its 1 entries" },
	{ "count_mismatch.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip entry count 100 does not fit in a central directory of 47 bytes" },
	{ "cd_count_high.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip central directory truncated" },
	{ "count_huge.zip", AT_OPEN, 0, CKFS_E_LIMIT,
	  "zip has 1099511627776 entries, more than the limit of 4194304" },
	{ "zip64_locator_outside.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip64 end of central directory offset out of range" },
	{ "zip64_bad_sig.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "bad zip64 end of central directory signature" },
	{ "zip64_size_lie.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "zip central directory truncated" },
	{ "zip64_disagree.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip64 end of central directory disagrees with end of central directory" },
	{ "zip64_extra_short.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip64 extra field of 'a' is too short" },
	{ "multidisk.zip", AT_OPEN, 0, CKFS_E_UNSUPPORTED,
	  "multi-disk zip archives are not supported" },
	{ "name_nul.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "name of zip entry 0 contains a NUL byte" },
	{ "data_past_eof.zip", AT_OPEN, 0, CKFS_E_TRUNCATED,
	  "data of zip entry 'a' extends past end of archive" },
	{ "data_over_cd.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "data of zip entry 'a' overlaps the central directory" },
	{ "local_out_of_range.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "local header of zip entry 'a' out of range" },
	{ "local_sig_bad.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "bad local header signature for zip entry 'a'" },
	{ "local_name_mismatch.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "local header name of zip entry 'b' differs from the central directory" },
	{ "local_method_mismatch.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "local header of zip entry 'a' has method 8, central directory 0" },
	{ "stored_size_mismatch.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "stored zip entry 'a' has compressed size 11 but size 10" },
	{ "dup_name.zip", AT_OPEN, 0, CKFS_E_FORMAT, "duplicate zip entry 'a'" },
	{ "overlap.zip", AT_OPEN, 0, CKFS_E_FORMAT,
	  "zip entries 'a' and 'b' overlap" },
	{ "encrypted.zip", AT_OPEN, 0, CKFS_E_UNSUPPORTED,
	  "zip entry 'a' is encrypted" },
	{ "method_lzma.zip", AT_OPEN, 0, CKFS_E_UNSUPPORTED,
	  "zip entry 'a' uses unsupported compression method 14" },
	{ "bomb.zip", AT_READ, 1u << 20, CKFS_E_LIMIT,
	  "record 'bomb' is 4194304 bytes, more than the limit of 1048576" },
	{ "bomb_lying.zip", AT_READ, 1u << 20, CKFS_E_FORMAT,
	  "record 'bomb' inflates past its declared size of 100 bytes" },
	{ "bomb_lying.zip", AT_VERIFY, 0, CKFS_E_FORMAT,
	  "record 'bomb' inflates past its declared size of 100 bytes" },
	{ "deflate_corrupt.zip", AT_READ, 1u << 20, CKFS_E_FORMAT,
	  "corrupt deflate data in record 'a' (invalid block type)" },
	{ "deflate_truncated.zip", AT_READ, 1u << 20, CKFS_E_TRUNCATED,
	  "deflate data of record 'a' truncated" },
	{ "crc_bad.zip", AT_VERIFY, 0, CKFS_E_FORMAT,
	  "crc mismatch in record 'b'" },
};

static void test_corpus_bad(void)
{
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const struct bad_case *c = &bad_cases[i];
		char path[512], want[1024];
		struct ckfs_error err;
		struct ckfs_zip z;
		enum ckfs_code rc;
		int failed_before = test_case_failed;

		snprintf(path, sizeof(path), "%s/zip/%s", CKFS_CORPUS, c->file);
		snprintf(want, sizeof(want), "'%s': %s", c->file, c->msg);
		test_case_failed = 0;
		rc = open_zip(&z, path, 0, 0, c->file, &err);
		if (c->stage == AT_OPEN) {
			CHECK_EQ_INT(rc, c->code);
			CHECK_EQ_STR(err.msg, want);
			CHECK(z.entries == NULL && z.prefix == NULL);
			ckfs_zip_release(&z);
		} else {
			CHECK_EQ_INT(rc, CKFS_OK);
			if (rc) {
				fprintf(stderr, "%s\n", err.msg);
			} else if (c->stage == AT_READ) {
				void *buf = (void *)1;
				size_t len = 1;

				rc = ckfs_zip_read_record(&z, &z.entries[z.n_entries - 1],
							  c->max, &buf, &len, &err);
				CHECK_EQ_INT(rc, c->code);
				CHECK_EQ_STR(err.msg, want);
				CHECK(buf == NULL && len == 0);
			} else {
				size_t checked = 99;

				rc = ckfs_zip_verify_crc(&z, &checked, &err);
				CHECK_EQ_INT(rc, c->code);
				CHECK_EQ_STR(err.msg, want);
				CHECK(checked < z.n_entries);
			}
			close_zip(&z);
		}
		if (test_case_failed)
			fprintf(stderr, "  in case %s\n", c->file);
		test_case_failed |= failed_before;
	}
}

/* Concurrent readers of one opened archive (meaningful under TSan, and a
 * smoke test of the pread-only design under ASan). */
struct reader_arg {
	const struct ckfs_zip *z;
	int failures;
};

static void *reader(void *p)
{
	struct reader_arg *a = p;

	for (int round = 0; round < 50; round++) {
		struct ckfs_error err;
		size_t checked;

		ckfs_error_clear(&err);
		if (ckfs_zip_verify_crc(a->z, &checked, &err) != CKFS_OK ||
		    checked != 8)
			a->failures++;
		for (size_t i = 0; i < a->z->n_entries; i++) {
			void *buf = NULL;
			size_t len;

			if (ckfs_zip_read_record(a->z, &a->z->entries[i], 1 << 20,
						 &buf, &len, &err) != CKFS_OK ||
			    len != a->z->entries[i].size)
				a->failures++;
			free(buf);
		}
	}
	return NULL;
}

static void test_threads(void)
{
	struct ckfs_error err;
	struct ckfs_zip z;
	pthread_t t[4];
	struct reader_arg a[4];

	CHECK_EQ_INT(open_zip(&z, FIX("rezip.zip"), 0, 0, "rezip.zip", &err),
		     CKFS_OK);
	if (err.code)
		return;
	for (int i = 0; i < 4; i++) {
		a[i].z = &z;
		a[i].failures = 0;
		CHECK_EQ_INT(pthread_create(&t[i], NULL, reader, &a[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ_INT(a[i].failures, 0);
	}
	close_zip(&z);
}

int main(void)
{
	RUN(test_torch_save);
	RUN(test_torch_archive_prefix);
	RUN(test_torch_nocrc);
	RUN(test_zipfile_rewrite);
	RUN(test_embedded);
	RUN(test_torch_zip64);
	RUN(test_dcp_items);
	RUN(test_legacy);
	RUN(test_handcrafted_ok);
	RUN(test_corpus_bad);
	RUN(test_threads);
	return test_summary();
}
