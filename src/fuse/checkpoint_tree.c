/* SPDX-License-Identifier: MIT */
/*
 * One checkpoint as a mount (src/fuse/tree.h): the root is its served
 * folder, built once at mount exactly as `ckfs export` builds it.
 *
 * Inodes are plain indices: the root is 1 (FUSE_ROOT_ID) and node i of
 * the folder's sorted node array is i + 2. They derive from the sorted
 * names of an immutable folder, so a remount of the same checkpoint
 * reports the same inodes, sizes and times. Everything is fixed, and the
 * one served folder lives as long as the mount: no references to count.
 */
#include <errno.h>
#include <stdlib.h>

#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/tree.h"

#define ROOT_INO 1

struct checkpoint_tree {
	struct ckfs_fs fs;          /* first: the handlers' userdata */
	struct ckfs_served served;
};

static struct checkpoint_tree *tree_of(struct ckfs_fs *fs)
{
	return (struct checkpoint_tree *)fs;
}

static int cp_resolve(struct ckfs_fs *fs, uint64_t ino, struct ckfs_at *at)
{
	struct ckfs_served *s = &tree_of(fs)->served;

	if (ino != ROOT_INO && (ino < 2 || ino - 2 >= s->f->n_nodes))
		return ENOENT;
	at->kind = CKFS_AT_SERVED;
	at->ino = ino;
	at->fixed = true;
	at->served = s;
	at->node = ino == ROOT_INO ? NULL : &s->f->nodes[ino - 2];
	at->top = ROOT_INO;
	at->parent = ROOT_INO;
	return 0;
}

static struct ckfs_served *cp_file(struct ckfs_fs *fs, uint64_t file_id,
				   struct ckfs_error *err)
{
	(void)file_id;
	(void)err;
	return &tree_of(fs)->served;
}

static void cp_stats_head(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	ckfs_stats_put_pid(b);
	ckfs_strbuf_fmt(b, ",\"%s\":%zu", CKFS_KEY(FILES), tree_of(fs)->served.f->n_nodes);
	ckfs_stats_put_uptime(fs, b);
}

static void cp_log_serving(struct ckfs_fs *fs, const char *cache_size)
{
	ckfs_log(CKFS_LOG_NOTICE, "serving '%s' at '%s': %zu files, cache %s, %d threads",
		 fs->opt->src, fs->opt->mountpoint, tree_of(fs)->served.f->n_nodes, cache_size,
		 fs->opt->threads);
}

/* Mounted: start the preload when asked (src/fuse/preload.c). */
static enum ckfs_code cp_start(struct ckfs_fs *fs, struct fuse_session *se,
			       struct ckfs_error *err)
{
	const struct ckfs_mount_options *opt = fs->opt;

	if (!opt->preload)
		return CKFS_OK;
	return ckfs_preload_start(fs, se, &tree_of(fs)->served, ROOT_INO, opt->mountpoint,
				  opt->has_preload_max ? opt->preload_max
						       : ckfs_preload_default_budget(),
				  &fs->preload, err);
}

static void cp_free(struct ckfs_fs *fs)
{
	ckfs_served_close(&tree_of(fs)->served);
	free(tree_of(fs));
}

static const struct ckfs_tree_ops checkpoint_tree_ops = {
	.resolve = cp_resolve,
	.file = cp_file,
	.stats_head = cp_stats_head,
	.log_serving = cp_log_serving,
	.start = cp_start,
	.free = cp_free,
};

/* With allow_other, say how many files others cannot read because their
 * sources are closed to them, and how to publish them anyway. */
static void note_closed_files(const struct ckfs_fs *fs, const struct ckfs_served *s)
{
	size_t closed = 0;

	if (!fs->opt->allow_other || fs->opt->has_umask)
		return;
	for (size_t i = 0; i < s->f->n_nodes; i++)
		closed += (s->modes[i] & 0004) == 0;
	if (closed || !(s->root_mode & 0001))
		ckfs_log(CKFS_LOG_NOTICE, "allow_other: %zu of %zu files%s are not open "
			 "to other users because their sources are not; -o umask=0222 "
			 "publishes them", closed, s->f->n_nodes,
			 (s->root_mode & 0001) ? "" : " and the folder");
}

enum ckfs_code ckfs_checkpoint_tree_open(const struct ckfs_mount_options *opt,
					 struct ckfs_fs **out, struct ckfs_error *err)
{
	struct checkpoint_tree *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (!t)
		return ckfs_nomem(err);
	ckfs_fs_init(&t->fs, &checkpoint_tree_ops, opt);
	if (ckfs_served_open(&t->served, opt, NULL, "", t->fs.uid, t->fs.gid, err) != CKFS_OK) {
		cp_free(&t->fs);
		return err->code;
	}
	note_closed_files(&t->fs, &t->served);
	for (size_t i = 0; i < t->served.f->n_nodes; i++)
		t->fs.statfs_bytes += t->served.f->nodes[i].size;
	t->fs.statfs_files = t->served.f->n_nodes + 1;
	*out = &t->fs;
	return CKFS_OK;
}
