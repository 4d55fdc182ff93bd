/* SPDX-License-Identifier: MIT */
/*
 * The one place a ckfs error code becomes an errno value (src/fuse/fs.h).
 * Coarse on purpose: a reader can act on "the bytes are unavailable" (EIO),
 * "out of memory" and "no such file", not on which structure was malformed;
 * the daemon logs the precise cause next to the file name.
 */
#include <errno.h>

#include "fuse/fs.h"

int ckfs_err_to_errno(const struct ckfs_error *err)
{
	switch (err->code) {
	case CKFS_OK:
		return 0;
	case CKFS_E_NOMEM:
		return ENOMEM;
	case CKFS_E_NOTFOUND:
		return ENOENT;
	case CKFS_E_IO:
		/* Keep what a failing disk or network filesystem said when it
		 * means something to a reader; anything else is EIO. */
		switch (err->sys_errno) {
		case ENOMEM:
		case ETIMEDOUT:
		case ESTALE:
			return err->sys_errno;
		default:
			return EIO;
		}
	case CKFS_E_CHANGED:   /* a source changed under the mount */
	case CKFS_E_FORMAT:
	case CKFS_E_TRUNCATED:
	case CKFS_E_LIMIT:
	case CKFS_E_UNSUPPORTED:
	case CKFS_E_INVALID:
	case CKFS_E_EXISTS:
	case CKFS_E_MISMATCH:
	default:
		return EIO;
	}
}
