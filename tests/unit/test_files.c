/* SPDX-License-Identifier: MIT */
/*
 * Every file ckfs opens, of every layout, replaced by something that is
 * not a regular file inside the checkpoint, or by a symlink leading
 * outside it (include/ckfs/file.h): a FIFO (whose open or read would
 * block), a folder, a character device, a link to a garbage file outside
 * and a link to a FIFO outside. Opening the checkpoint must fail at once
 * with one line naming the file, never hang (an alarm fails the test),
 * never read the outside target (a parse error would show it was read),
 * and leak no descriptor.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ckfs/file.h"
#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "test.h"

static const struct {
	const char *fixture; /* under tests/fixtures */
	const char *file;    /* the file replaced */
} targets[] = {
	{ "fsdp/qwen2_fsdp2_w2", "model_world_size_2_rank_1.pt" },
	{ "fsdp/qwen2_fsdp2_w2", "fsdp_config.json" },
	{ "fsdp/qwen2_fsdp2_w2", "huggingface/config.json" },
	{ "dcp/qwen2_fsdp2_w2_optim", ".metadata" },
	{ "dcp/qwen2_fsdp2_w2_optim", "__1_0.distcp" },
	{ "hf/qwen2_single", "model.safetensors" },
	{ "hf/qwen2_single", "config.json" },
	{ "hf/qwen2_sharded", "model.safetensors.index.json" },
	{ "hf/qwen2_sharded", "model-00002-of-00004.safetensors" },
	{ "megatron/llama_tp2", "model/mp_rank_01/model.pt" },
	{ "megatron/llama_tp2", "hf_config_and_tokenizer/config.json" },
	{ "mcore_dist/llama_pp2_vpp2_head", "ckpt_contents.json" },
	{ "mcore_dist/llama_pp2_vpp2_head", "model/dist_ckpt/.metadata" },
	{ "mcore_dist/llama_pp2_vpp2_head", "model/dist_ckpt/metadata.json" },
	{ "mcore_dist/llama_pp2_vpp2_head", "model/dist_ckpt/__1_0.distcp" },
	{ "mcore_dist/llama_pp2_vpp2_head", "model/huggingface/config.json" },
};

enum kind { FIFO, FOLDER, DEVICE, LINK_TO_GARBAGE, LINK_TO_FIFO, N_KINDS };
static const char *const kind_names[] = { "a FIFO", "a folder", "a character device",
					  "a link to a garbage file outside",
					  "a link to a FIFO outside" };

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Replace path by the kind of thing asked for; 0, or -1 when this machine
 * cannot make it (a device node needs CAP_MKNOD). */
static int replace(const char *path, enum kind k, const char *outside)
{
	char target[PATH_MAX + 32];

	CHECK(unlink(path) == 0);
	switch (k) {
	case FIFO: return mkfifo(path, 0644);
	case FOLDER: return mkdir(path, 0755);
	case DEVICE: return mknod(path, S_IFCHR | 0644, makedev(1, 3)); /* /dev/null */
	case LINK_TO_GARBAGE:
		snprintf(target, sizeof(target), "%s/garbage", outside);
		return symlink(target, path);
	case LINK_TO_FIFO:
		snprintf(target, sizeof(target), "%s/fifo", outside);
		return symlink(target, path);
	case N_KINDS: break;
	}
	return -1;
}

static void open_refused(const char *fixture, const char *file, enum kind k)
{
	char tmp[] = "/tmp/ckfs-files-XXXXXX", real[PATH_MAX], dir[PATH_MAX + 16],
	     outside[PATH_MAX + 16], path[2 * PATH_MAX], want[3 * PATH_MAX];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	CHECK(mkdtemp(tmp) != NULL);
	CHECK(realpath(tmp, real) != NULL);
	snprintf(dir, sizeof(dir), "%s/ckpt", real);
	snprintf(outside, sizeof(outside), "%s/outside", real);
	CHECK(test_sh("cp -r '%s/%s' '%s' && mkdir '%s' && head -c 4096 /dev/urandom > "
		      "'%s/garbage' && mkfifo '%s/fifo'", CKFS_FIXTURES, fixture, dir,
		      outside, outside, outside) == 0);
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (replace(path, k, outside) != 0) {
		printf("note: %s: cannot make %s here (%s): variant not run\n", file,
		       kind_names[k], strerror(errno));
		CHECK(test_sh("rm -rf '%s'", real) == 0);
		return;
	}
	if (k == LINK_TO_GARBAGE || k == LINK_TO_FIFO)
		snprintf(want, sizeof(want), "'%s': symlink leads outside the checkpoint; "
			 "use --follow-symlinks", path);
	else
		snprintf(want, sizeof(want), "'%s': not a regular file", path);

	int fds = count_fds();
	ckfs_error_clear(&err);
	alarm(60); /* a blocked open or read ends the test here */
	enum ckfs_code rc = ckfs_model_open(dir, &opt, &m, &err);
	alarm(0);
	CHECK_EQ_INT(rc, CKFS_E_INVALID);
	CHECK(m == NULL);
	ckfs_model_free(m);
	CHECK(strstr(err.msg, want) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
	CHECK_EQ_INT(count_fds(), fds);
	if (test_case_failed)
		fprintf(stderr, "  %s as %s: got '%s'\n", file, kind_names[k], err.msg);
	CHECK(test_sh("rm -rf '%s'", real) == 0);
}

static void test_every_file_of_every_layout(void)
{
	for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++)
		for (int k = 0; k < N_KINDS; k++)
			open_refused(targets[i].fixture, targets[i].file, (enum kind)k);
	printf("%zu files x %d replacements\n", sizeof(targets) / sizeof(targets[0]),
	       (int)N_KINDS);
}

/* ckfs_path_within: by identity, through symlinks and "..", files from
 * the folder that really holds them (bind mounts: tests/cli/
 * test_export_dest.sh, which needs root). */
static void test_path_within(void)
{
	char top[] = "/tmp/ckfs-within-XXXXXX", p[PATH_MAX];
	struct stat a, b, root;

	CHECK(mkdtemp(top) != NULL);
	CHECK(test_sh("cd '%s' && mkdir -p a/sub b && touch a/sub/f b/g && "
		      "ln -s ../a/sub b/link && ln -s ../a/sub/f b/flink", top) == 0);
	snprintf(p, sizeof(p), "%s/a", top);
	CHECK(stat(p, &a) == 0);
	snprintf(p, sizeof(p), "%s/b", top);
	CHECK(stat(p, &b) == 0);
	CHECK(stat("/", &root) == 0);
	snprintf(p, sizeof(p), "%s/a/sub/f", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 1);
	CHECK_EQ_INT(ckfs_path_within(p, &b), 0);
	CHECK_EQ_INT(ckfs_path_within(p, &root), 1);
	snprintf(p, sizeof(p), "%s/a", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 1); /* the folder itself */
	/* through links: where they lead, not where they are */
	snprintf(p, sizeof(p), "%s/b/link", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 1);
	CHECK_EQ_INT(ckfs_path_within(p, &b), 0);
	snprintf(p, sizeof(p), "%s/b/flink", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 1);
	CHECK_EQ_INT(ckfs_path_within(p, &b), 0);
	snprintf(p, sizeof(p), "%s/b/../a/sub/../sub/f", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 1);
	snprintf(p, sizeof(p), "%s/b/g", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), 0);
	snprintf(p, sizeof(p), "%s/missing", top);
	CHECK_EQ_INT(ckfs_path_within(p, &a), -1);
	CHECK_EQ_INT(errno, ENOENT);
	CHECK(test_sh("rm -rf '%s'", top) == 0);
}

int main(void)
{
	RUN(test_every_file_of_every_layout);
	RUN(test_path_within);
	return test_summary();
}
