/* SPDX-License-Identifier: MIT */
/* JSON parsing with out-of-memory detection (include/ckfs/json.h): cJSON's
 * allocation hook notes a failure in a per-thread flag. */
#include "ckfs/json.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>

static _Thread_local bool alloc_failed;

static void *noting_malloc(size_t n)
{
	void *p = malloc(n);
	alloc_failed |= !p;
	return p;
}

static void install_hooks(void)
{
	cJSON_Hooks h = { noting_malloc, free };
	cJSON_InitHooks(&h);
}

struct cJSON *ckfs_json_parse(const char *text, size_t len, const char **end,
			      bool *oom)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const char *e = NULL;

	pthread_once(&once, install_hooks);
	alloc_failed = false;
	cJSON *j = cJSON_ParseWithLengthOpts(text, len, end ? end : &e, 0);
	*oom = !j && alloc_failed;
	return j;
}
