/* SPDX-License-Identifier: MIT */
/*
 * Source identity (include/ckfs/model.h): what a source file was when it
 * was opened, and the check that it still is. A file deleted, truncated,
 * extended, rewritten (mtime) or replaced under its name is "changed": its
 * bytes may no longer be the checkpoint's, so reads that need it fail
 * instead of serving stale or mixed data. Its permissions and owner are
 * recorded too: the served files' modes are derived from them when the
 * folder is served (src/folder/perm.c), so a chmod or chown afterwards is a
 * change as well, and reads fail rather than serve bytes under
 * permissions the file no longer has.
 */
#include "ckfs/model.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Process-wide: a daemon serves one model, and a relaxed add per read of
 * up to a megabyte costs nothing measurable. */
static _Atomic uint64_t source_bytes;

uint64_t ckfs_source_bytes_read(void)
{
	return atomic_load_explicit(&source_bytes, memory_order_relaxed);
}

void ckfs_source_note_read(uint64_t n)
{
	atomic_fetch_add_explicit(&source_bytes, n, memory_order_relaxed);
}

enum ckfs_code ckfs_source_init(struct ckfs_source *s, struct ckfs_file f, const char *path,
				const char *name, struct ckfs_error *err)
{
	struct stat st;

	if (ckfs_file_stat(f, &st) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", path);
	s->path = path;
	s->name = name;
	s->f = f;
	s->size = (uint64_t)st.st_size;
	s->dev = st.st_dev;
	s->ino = st.st_ino;
	s->mtime = st.st_mtim;
	s->mode = st.st_mode;
	s->uid = st.st_uid;
	s->gid = st.st_gid;
	s->acl = f.fd >= 0 && ckfs_fd_has_acl(f.fd);
	return CKFS_OK;
}

enum ckfs_code ckfs_source_check(const struct ckfs_source *s,
				 struct ckfs_error *err)
{
	struct stat st;

	if (s->f.remote)
		return CKFS_OK;
	if (stat(s->path, &st) != 0)
		return errno == ENOENT
			       ? ckfs_fail(err, CKFS_E_CHANGED,
					   "'%s': source was deleted", s->path)
			       : ckfs_fail_errno(err, "'%s': cannot stat", s->path);
	if (st.st_dev != s->dev || st.st_ino != s->ino)
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': source was replaced",
				 s->path);
	if (fstat(s->f.fd, &st) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", s->path);
	if (st.st_nlink == 0)
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': source was deleted",
				 s->path);
	if ((uint64_t)st.st_size != s->size)
		return ckfs_fail(err, CKFS_E_CHANGED,
				 "'%s': source size changed from %llu to %llu bytes",
				 s->path, (unsigned long long)s->size,
				 (unsigned long long)st.st_size);
	if (st.st_mtim.tv_sec != s->mtime.tv_sec ||
	    st.st_mtim.tv_nsec != s->mtime.tv_nsec)
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': source was modified",
				 s->path);
	if (st.st_mode != s->mode)
		return ckfs_fail(err, CKFS_E_CHANGED,
				 "'%s': source permissions changed from %04o to %04o",
				 s->path, (unsigned)(s->mode & 07777),
				 (unsigned)(st.st_mode & 07777));
	if (st.st_uid != s->uid || st.st_gid != s->gid)
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': source owner changed",
				 s->path);
	return CKFS_OK;
}

enum ckfs_code ckfs_source_open(struct ckfs_source *s, const struct ckfs_file_policy *pol,
				const char *path, const char *name, struct ckfs_error *err)
{
	struct ckfs_file f;

	CKFS_TRY(ckfs_file_open(pol, path, &f, NULL, err));
	if (ckfs_source_init(s, f, path, name, err) != CKFS_OK) {
		ckfs_file_close(&f);
		return err->code;
	}
	return CKFS_OK;
}

void ckfs_model_free(struct ckfs_model *m)
{
	if (!m)
		return;
	ckfs_checks_free(m); /* its thread reads the sources */
	for (size_t i = 0; i < m->n_sources; i++) {
		ckfs_file_close(&m->sources[i].f);
		ckfs_guards_free(m->sources[i].guards);
	}
	for (size_t i = 0; m->lora && i < m->lora->n_pairs; i++) {
		free(atomic_load(&m->lora->pairs[i].ab));
		pthread_mutex_destroy(&m->lora->pairs[i].lock);
	}
	if (m->view && m->view->release)
		m->view->release(m);
	ckfs_model_free(m->base);
	ckfs_model_dims_release(m);
	ckfs_arena_release(&m->arena);
	free(m);
}
