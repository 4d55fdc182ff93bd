/* SPDX-License-Identifier: MIT */
/* JSON parsing that tells a failed allocation from bad text: cJSON reports
 * both as a parse error, which would name the wrong cause. */
#ifndef CKFS_JSON_H
#define CKFS_JSON_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

/* cJSON_ParseWithLengthOpts(text, len, end, false); on NULL, *oom says
 * whether an allocation failed (report CKFS_E_NOMEM "out of memory").
 * end may be NULL. */
struct cJSON *ckfs_json_parse(const char *text, size_t len, const char **end,
			      bool *oom);

#endif
