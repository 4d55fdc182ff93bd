/* SPDX-License-Identifier: MIT */
/* Sizes and shapes as people read and write them. */
#ifndef CKFS_UNITS_H
#define CKFS_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* "5GB", "200MB", "1.5GiB", "1000" -> bytes, as huggingface_hub parses
 * sizes (KB/MB/GB decimal, KiB/MiB/GiB binary); 0 on error. */
uint64_t ckfs_parse_size(const char *text);
/* "1.5 GiB", "512 B" into buf. */
void ckfs_format_bytes(double bytes, char *buf, size_t size);
/* "[8, 4]" (open "[", close "]"; or "(", ")" for a mesh) into buf, cut to
 * fit; returns buf. */
const char *ckfs_format_dims(int n, const int64_t *v, const char *open, const char *close,
			     char *buf, size_t size);

#endif
