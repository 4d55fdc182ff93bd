/* SPDX-License-Identifier: MIT */
/*
 * Carried permissions: the modes of a served folder's entries, derived
 * from the files and folders they are made from, so that a mount (with
 * allow_other) or an export never lets anyone read what they could not
 * read on disk.
 *
 * The served entries belong to one owner (the mounting user, or uid= and
 * gid=; the exporting user). For each of the entry's classes (its owner,
 * its group, everyone else) a permission is kept only when every user who
 * may fall in that class is sure to have it on every object the entry
 * comes from: read on the file (or list on a folder), and search on every
 * folder from / down to it, along the path as opened and along its
 * resolved path. Who falls in which class of a source is decided as the
 * kernel does (its owner, then its group, then the rest); what is not
 * known (the group list of a uid= that is not the mounting user, whether
 * some other user is in a group) counts against the permission. An ACL
 * may shut out any user or group its mode bits let in, so an object with
 * one grants only the served owner, and only when that owns it.
 */
#ifndef CKFS_PERM_H
#define CKFS_PERM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "ckfs/err.h"
#include "ckfs/folder.h"

/* Classes of a served entry, as a 3-bit set. */
#define CKFS_CLASS_OWNER 4u
#define CKFS_CLASS_GROUP 2u
#define CKFS_CLASS_OTHER 1u
#define CKFS_CLASS_ALL 7u

/* Permissions, as in one class's mode bits. */
#define CKFS_PERM_READ 4u
#define CKFS_PERM_SEARCH 1u

/* Who the served entries belong to, and which groups that user is in. */
struct ckfs_owner {
	uid_t uid;
	gid_t gid;
	bool groups_known;      /* groups lists every group of uid */
	size_t n_groups;
	gid_t *groups;          /* malloc'd */
};

/* Owner uid, group gid. The groups of uid are known when it is this
 * process's effective user (its effective and supplementary groups). */
enum ckfs_code ckfs_owner_init(struct ckfs_owner *o, uid_t uid, gid_t gid,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_owner_release(struct ckfs_owner *o);

/* The classes of an entry owned by o whose every user surely has perm on
 * the object a describes (its path is not used). */
unsigned ckfs_perm_classes(const struct ckfs_owner *o, const struct ckfs_file_access *a,
			   unsigned perm);
/* Mode bits granting perm to classes: (CKFS_CLASS_OWNER | CKFS_CLASS_OTHER,
 * CKFS_PERM_READ) is 0404. */
mode_t ckfs_perm_bits(unsigned classes, unsigned perm);

/*
 * Permission bits of every entry of f shown as owned by o: node_modes[i]
 * for f->nodes[i] (0444 at most), *root_mode for the folder (0555 at
 * most). A weight file is limited by the sources of its tensors (and of
 * their LoRA pairs when fused) and the layout's metadata files, the index
 * and adapter_config.json by those of their weight files, config.json by
 * the config it is rendered from, a side file by its source; the folder's
 * read bits (and a folder's inside it) by the checkpoint folder and the
 * side-file folder (both listed in it), its search bits by the checkpoint
 * folder.
 * Folders are stat-ed now; a folder that cannot be is an error.
 */
enum ckfs_code ckfs_folder_modes(const struct ckfs_folder *f, const struct ckfs_owner *o,
				 mode_t *node_modes, mode_t *root_mode,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
