/* SPDX-License-Identifier: MIT */
/*
 * JSON inputs (config.json, fsdp_config.json, safetensors headers and
 * indexes, ckpt_contents.json, metadata.json, lora_train_meta.json)
 * parsed the one way every reader of the same file would agree with. cJSON underneath; on top:
 *   - a failed allocation is reported as such, not as a syntax error
 *     (cJSON reports both as a parse failure);
 *   - duplicate keys in any object are refused: cJSON keeps the first,
 *     Python's json (verl, transformers) the last, so a file holding
 *     {"world_size": 1, "world_size": 2} means two things;
 *   - the whole length is read: a NUL anywhere, anything but JSON
 *     whitespace after the value, a raw control character (in a string,
 *     or between tokens, where cJSON skips any byte up to 32), bytes that
 *     are not UTF-8 and a byte order mark are refused with their offset,
 *     as Python's json and serde_json (safetensors) refuse them: a C
 *     reader stopping at a NUL would see another file than Python does;
 *   - messages name the file and, for syntax errors, line and column.
 */
#ifndef CKFS_JSON_H
#define CKFS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/err.h"

struct cJSON;

/* Parse len bytes of text (what names it in messages) into *out, which the
 * caller frees with cJSON_Delete. CKFS_E_FORMAT for bad JSON, a refused
 * byte (above) or a duplicate key, CKFS_E_NOMEM. */
enum ckfs_code ckfs_json_parse(const char *what, const char *text, size_t len,
			       struct cJSON **out, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The same, and the value must be an object. */
enum ckfs_code ckfs_json_parse_object(const char *what, const char *text, size_t len,
				      struct cJSON **out,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* cJSON_AddItemToArray, and item deleted when it could not be added (arr
 * NULL after a failed allocation): what cJSON does not take is ours. */
void ckfs_json_push(struct cJSON *arr, struct cJSON *item);

/* A JSON number that is a whole number from 0 to max: true with *out set
 * (64.5, -1, "8" and true are not). */
bool ckfs_json_whole(const struct cJSON *x, int64_t max, int64_t *out);

#endif
