/* SPDX-License-Identifier: MIT */
/*
 * include/ckfs/perm.h: which classes of a served entry keep a permission,
 * for sources of every owner and mode, with and without an ACL (the
 * served owner, group and others never get what the source denies them,
 * whoever may fall in them), and
 * the modes of a real folder whose rank file, side file or metadata file
 * is private.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/perm.h"
#include "test.h"

static gid_t root_groups[] = { 0 };
static gid_t alice_groups[] = { 1001, 100 };

struct case_ {
	const char *what;
	uid_t owner_uid;
	gid_t owner_gid;
	gid_t *groups;          /* NULL: not known */
	size_t n_groups;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	bool acl;
	unsigned perm;
	mode_t want;
};

static void test_classes(void)
{
	static const struct case_ cases[] = {
		{ "world-readable, own", 0, 0, root_groups, 1, 0644, 0, 0, false, CKFS_PERM_READ, 0444 },
		{ "0600, own", 0, 0, root_groups, 1, 0600, 0, 0, false, CKFS_PERM_READ, 0400 },
		{ "0640 of the group shown", 0, 65534, root_groups, 1, 0640, 0, 65534, false,
		  CKFS_PERM_READ, 0440 },
		{ "0640 of another group", 0, 0, root_groups, 1, 0640, 0, 65534, false,
		  CKFS_PERM_READ, 0400 },
		{ "someone else's 0644", 0, 0, root_groups, 1, 0644, 1000, 1000, false,
		  CKFS_PERM_READ, 0444 },
		{ "someone else's 0600", 0, 0, root_groups, 1, 0600, 1000, 1000, false,
		  CKFS_PERM_READ, 0000 },
		{ "0640 of a group the owner is in", 1001, 1001, alice_groups, 2, 0640, 1000, 100, false,
		  CKFS_PERM_READ, 0400 },
		{ "0640, owner's groups unknown", 1001, 1001, NULL, 0, 0640, 1000, 100, false,
		  CKFS_PERM_READ, 0000 },
		{ "0644, owner's groups unknown", 1001, 1001, NULL, 0, 0644, 1000, 100, false,
		  CKFS_PERM_READ, 0444 },
		/* A group shut out explicitly stays out of "other" too. */
		{ "0604", 0, 0, root_groups, 1, 0604, 0, 1, false, CKFS_PERM_READ, 0400 },
		/* Its owner may be in the group shown or among the others, and
		 * may not read it: only the served owner, in its group, may. */
		{ "0044 of someone else", 0, 0, root_groups, 1, 0044, 1000, 0, false,
		  CKFS_PERM_READ, 0400 },
		{ "0711 folder", 0, 0, root_groups, 1, 0711, 0, 0, false, CKFS_PERM_SEARCH, 0111 },
		{ "0711 folder, list", 0, 0, root_groups, 1, 0711, 0, 0, false, CKFS_PERM_READ, 0400 },
		{ "0750 folder", 0, 0, root_groups, 1, 0750, 0, 0, false, CKFS_PERM_SEARCH, 0110 },
		{ "1777 /tmp for a user", 1001, 1001, alice_groups, 2, 01777, 0, 0, false,
		  CKFS_PERM_SEARCH, 0111 },
		/* An ACL may shut out named users and groups: only its owner. */
		{ "0644 with an ACL, own", 0, 0, root_groups, 1, 0644, 0, 0, true,
		  CKFS_PERM_READ, 0400 },
		{ "0644 with an ACL, someone else's", 0, 0, root_groups, 1, 0644, 1000, 0, true,
		  CKFS_PERM_READ, 0000 },
		{ "0755 folder with an ACL", 0, 0, root_groups, 1, 0755, 0, 0, true,
		  CKFS_PERM_SEARCH, 0100 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct case_ *c = &cases[i];
		struct ckfs_owner o = {
			.uid = c->owner_uid, .gid = c->owner_gid,
			.groups_known = c->groups != NULL,
			.n_groups = c->n_groups, .groups = c->groups,
		};
		const struct ckfs_file_access a = {
			.path = "/x", .mode = S_IFREG | c->mode, .uid = c->uid, .gid = c->gid,
			.acl = c->acl,
		};
		mode_t got = ckfs_perm_bits(ckfs_perm_classes(&o, &a, c->perm), c->perm);
		if (got != c->want)
			fprintf(stderr, "%s: %04o, expected %04o\n", c->what, (unsigned)got,
				(unsigned)c->want);
		CHECK_EQ_INT(got, c->want);
	}
}

static void test_bits(void)
{
	CHECK_EQ_INT(ckfs_perm_bits(CKFS_CLASS_ALL, CKFS_PERM_READ), 0444);
	CHECK_EQ_INT(ckfs_perm_bits(CKFS_CLASS_OWNER | CKFS_CLASS_OTHER, CKFS_PERM_READ), 0404);
	CHECK_EQ_INT(ckfs_perm_bits(CKFS_CLASS_GROUP, CKFS_PERM_SEARCH), 0010);
	CHECK_EQ_INT(ckfs_perm_bits(0, CKFS_PERM_READ), 0);
}

/* The modes of the folder of SRC (a copy of qwen2_fsdp2_w2) for this
 * user, sharded in 100 KB files; *n_out nodes. */
static mode_t *folder_modes(const char *src, mode_t *root, size_t *n_out,
			    struct ckfs_folder **fout, struct ckfs_model **mout)
{
	struct ckfs_model_options mopt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_folder_options fopt = { .max_shard_size = 100000 };
	struct ckfs_owner o;
	struct ckfs_error err;
	mode_t *modes = NULL;

	ckfs_error_clear(&err);
	*fout = NULL;
	*mout = NULL;
	if (ckfs_model_open(src, &mopt, mout, &err) != CKFS_OK ||
	    ckfs_folder_build(*mout, &fopt, fout, &err) != CKFS_OK ||
	    ckfs_owner_init(&o, geteuid(), getegid(), &err) != CKFS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return NULL;
	}
	modes = calloc((*fout)->n_nodes, sizeof(*modes));
	if (modes && ckfs_folder_modes(*fout, &o, modes, root, &err) != CKFS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		free(modes);
		modes = NULL;
	}
	ckfs_owner_release(&o);
	*n_out = (*fout)->n_nodes;
	return modes;
}

/* Each node's mode: weights (shards and index), config.json, tokenizer.json
 * and the other side files. */
static void check_modes(const char *src, mode_t weights, mode_t tokenizer, mode_t root_want)
{
	struct ckfs_folder *f;
	struct ckfs_model *m;
	mode_t root = 0;
	size_t n = 0, n_shards = 0;
	mode_t *modes = folder_modes(src, &root, &n, &f, &m);

	CHECK(modes != NULL);
	for (size_t i = 0; modes && i < n; i++) {
		const struct ckfs_node *node = &f->nodes[i];
		mode_t want = 0444;
		if (node->kind == CKFS_NODE_WEIGHTS ||
		    (node->kind == CKFS_NODE_RENDERED && !node->from))
			want = weights;
		if (strcmp(node->name, "tokenizer.json") == 0)
			want = tokenizer;
		n_shards += node->kind == CKFS_NODE_WEIGHTS;
		if (modes[i] != want)
			fprintf(stderr, "%s: %s is %04o, expected %04o\n", src, node->name,
				(unsigned)modes[i], (unsigned)want);
		CHECK_EQ_INT(modes[i], want);
	}
	CHECK(n_shards > 1);
	CHECK_EQ_INT(root, root_want);
	free(modes);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

static void test_folder(void)
{
	char dir[] = "/tmp/ckfs-test-perm-XXXXXX", src[64];

	CHECK(mkdtemp(dir) != NULL);
	snprintf(src, sizeof(src), "%s/ck", dir);
	CHECK(chmod(dir, 0755) == 0);
	CHECK(test_sh("mkdir '%s' && cp -r " CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w2/model_world_size_2_rank_*.pt "
		      CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w2/fsdp_config.json "
		      CKFS_FIXTURES "/fsdp/qwen2_fsdp2_w2/huggingface '%s' && "
		      "chmod -R u=rwX,go=rX '%s'", src, src, src) == 0);
	check_modes(src, 0444, 0444, 0555);
	/* A private rank file: every shard holds some of it, and the index. */
	CHECK(test_sh("chmod 600 '%s/model_world_size_2_rank_1.pt'", src) == 0);
	check_modes(src, 0400, 0444, 0555);
	/* A private metadata file (world size and FSDP version). */
	CHECK(test_sh("chmod 644 '%s/model_world_size_2_rank_1.pt' && "
		      "chmod 600 '%s/fsdp_config.json'", src, src) == 0);
	check_modes(src, 0400, 0444, 0555);
	/* A private side file alone. */
	CHECK(test_sh("chmod 644 '%s/fsdp_config.json' && "
		      "chmod 600 '%s/huggingface/tokenizer.json'", src, src) == 0);
	check_modes(src, 0444, 0400, 0555);
	/* A folder that others may search but not list. */
	CHECK(test_sh("chmod 644 '%s/huggingface/tokenizer.json' && chmod 711 '%s'", src,
		      src) == 0);
	check_modes(src, 0444, 0444, 0511);
	CHECK(test_sh("rm -rf '%s'", dir) == 0);
}

int main(void)
{
	RUN(test_classes);
	RUN(test_bits);
	RUN(test_folder);
	return test_summary();
}
