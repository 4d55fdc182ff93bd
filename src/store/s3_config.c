/* SPDX-License-Identifier: MIT */
/*
 * Where S3 requests go and how they are signed, read the way the AWS CLI
 * reads them (include/ckfs/s3.h): the environment first, then the shared
 * credentials and config files' profile.
 */
#include "ckfs/s3.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static enum ckfs_code copy(char *dst, size_t size, const char *src, const char *what,
			   struct ckfs_error *err)
{
	if (strlen(src) >= size)
		return ckfs_fail(err, CKFS_E_LIMIT, "S3 %s too long", what);
	memcpy(dst, src, strlen(src) + 1);
	return CKFS_OK;
}

static char *trim(char *s)
{
	char *e = s + strlen(s);

	while (isspace((unsigned char)*s))
		s++;
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* key's value in section [want] of an INI file (the credentials file's
 * "[name]", the config file's "[profile name]" or "[default]") into out:
 * true when found. A missing file is no value. */
static bool ini_value(const char *path, const char *want, const char *key, char *out,
		      size_t size)
{
	FILE *f = path ? fopen(path, "re") : NULL;
	char line[4096];
	bool in_section = false, found = false;

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		char *l = trim(line), *eq;
		if (*l == '#' || *l == ';' || !*l)
			continue;
		if (*l == '[') {
			char *close = strchr(l, ']');
			if (close) {
				*close = '\0';
				in_section = strcmp(trim(l + 1), want) == 0;
			}
		} else if (in_section && (eq = strchr(l, '='))) {
			*eq = '\0';
			if (strcmp(trim(l), key) == 0 && strlen(trim(eq + 1)) < size) {
				strcpy(out, trim(eq + 1));
				found = true;
			}
		}
	}
	fclose(f);
	return found;
}

/* ~/.aws/<name>, or the file the variable names. */
static const char *aws_file(const char *var, const char *name, char *buf, size_t size)
{
	const char *home = env("HOME");

	if (env(var))
		return env(var);
	if (!home)
		return NULL;
	snprintf(buf, size, "%s/.aws/%s", home, name);
	return buf;
}

static enum ckfs_code load_region(struct ckfs_s3_config *c, const char *profile,
				  struct ckfs_error *err)
{
	char path[4096], section[300];
	const char *r = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");

	if (r)
		return copy(c->region, sizeof(c->region), r, "region", err);
	snprintf(section, sizeof(section), strcmp(profile, "default") == 0 ? "%s" : "profile %s",
		 profile);
	if (!ini_value(aws_file("AWS_CONFIG_FILE", "config", path, sizeof(path)), section,
		       "region", c->region, sizeof(c->region)))
		strcpy(c->region, "us-east-1");
	return CKFS_OK;
}

static enum ckfs_code load_credentials(struct ckfs_s3_config *c, const char *profile,
				       struct ckfs_error *err)
{
	char path[4096];
	const char *file;

	if (env("AWS_ACCESS_KEY_ID") || env("AWS_SECRET_ACCESS_KEY")) {
		if (!env("AWS_ACCESS_KEY_ID") || !env("AWS_SECRET_ACCESS_KEY"))
			return ckfs_fail(err, CKFS_E_INVALID, "S3: AWS_ACCESS_KEY_ID and "
				"AWS_SECRET_ACCESS_KEY are set together or not at all");
		CKFS_TRY(copy(c->access_key, sizeof(c->access_key), env("AWS_ACCESS_KEY_ID"),
			      "access key", err));
		CKFS_TRY(copy(c->secret_key, sizeof(c->secret_key),
			      env("AWS_SECRET_ACCESS_KEY"), "secret key", err));
		if (env("AWS_SESSION_TOKEN"))
			CKFS_TRY(copy(c->session_token, sizeof(c->session_token),
				      env("AWS_SESSION_TOKEN"), "session token", err));
		return CKFS_OK;
	}
	file = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", path, sizeof(path));
	if (!ini_value(file, profile, "aws_access_key_id", c->access_key, sizeof(c->access_key))) {
		if (env("AWS_PROFILE"))
			return ckfs_fail(err, CKFS_E_NOTFOUND, "S3: profile '%s' has no "
					 "aws_access_key_id in '%s'", profile, file ? file : "~/.aws/credentials");
		c->anonymous = true;
		return CKFS_OK;
	}
	if (!ini_value(file, profile, "aws_secret_access_key", c->secret_key, sizeof(c->secret_key)))
		return ckfs_fail(err, CKFS_E_INVALID, "S3: profile '%s' in '%s' has no "
				 "aws_secret_access_key", profile, file);
	ini_value(file, profile, "aws_session_token", c->session_token, sizeof(c->session_token));
	return CKFS_OK;
}

enum ckfs_code ckfs_s3_config_load(struct ckfs_s3_config *c, const char *endpoint,
				   enum ckfs_s3_addressing addressing, struct ckfs_error *err)
{
	const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
	const char *ep = endpoint ? endpoint
				  : env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3")
							       : env("AWS_ENDPOINT_URL");

	memset(c, 0, sizeof(*c));
	c->max_attempts = 5;
	c->backoff_ms = 100;
	CKFS_TRY(load_region(c, profile, err));
	CKFS_TRY(load_credentials(c, profile, err));
	if (ep) {
		char shown[600];
		ckfs_url_redact(ep, shown, sizeof(shown));
		if (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0)
			return ckfs_fail(err, CKFS_E_INVALID, "S3 endpoint '%s': not an http:// "
					 "or https:// URL", shown);
		if (strcmp(shown, ep) != 0)
			return ckfs_fail(err, CKFS_E_INVALID, "S3 endpoint '%s': credentials in the "
					 "URL are not used (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY "
					 "or a profile)", shown);
		CKFS_TRY(copy(c->endpoint, sizeof(c->endpoint), ep, "endpoint", err));
		size_t n = strlen(c->endpoint);
		while (n > 0 && c->endpoint[n - 1] == '/')
			c->endpoint[--n] = '\0';
	} else {
		snprintf(c->endpoint, sizeof(c->endpoint), "https://s3.%s.amazonaws.com", c->region);
	}
	/* Custom endpoints (MinIO, SeaweedFS, Ceph) mostly lack per-bucket
	 * host names; AWS prefers them. */
	c->addressing = addressing != CKFS_S3_AUTO ? addressing
			: ep ? CKFS_S3_PATH : CKFS_S3_VIRTUAL;
	return CKFS_OK;
}

const char *ckfs_url_redact(const char *url, char *out, size_t size)
{
	static const char *const secret_params[] = { "X-Amz-Credential=", "X-Amz-Signature=",
						     "X-Amz-Security-Token=" };
	const char *host = strstr(url, "://");
	size_t n = 0;

	if (!size)
		return out;
	host = host ? host + 3 : url;
	/* userinfo: up to the last '@' before the path */
	size_t auth_end = strcspn(host, "/?#");
	const char *at = NULL;
	for (const char *p = host; p < host + auth_end; p++)
		if (*p == '@')
			at = p;
	for (const char *p = url; *p && n + 1 < size;) {
		if (at && p == host) {
			n += (size_t)snprintf(out + n, size - n, "***");
			p = at;
			continue;
		}
		size_t k = 0;
		for (size_t i = 0; i < sizeof(secret_params) / sizeof(secret_params[0]); i++)
			if ((p == url || p[-1] == '?' || p[-1] == '&') &&
			    strncasecmp(p, secret_params[i], strlen(secret_params[i])) == 0)
				k = strlen(secret_params[i]);
		if (k) {
			n += (size_t)snprintf(out + n, size - n, "%.*s***", (int)k, p);
			p += k + strcspn(p + k, "&#");
			continue;
		}
		out[n++] = *p++;
	}
	out[n < size ? n : size - 1] = '\0';
	return out;
}

/* Bucket names as S3 allows them: 3-63 of [a-z0-9.-], a letter or digit
 * at each end. */
static bool bucket_ok(const char *b, size_t n)
{
	if (n < 3 || n > 63 || !isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) ||
		      b[i] == '.' || b[i] == '-'))
			return false;
	return true;
}

bool ckfs_s3_is_url(const char *path)
{
	return strncmp(path, "s3://", 5) == 0;
}

int ckfs_s3_parse_url(const char *url, char *bucket, size_t bucket_size, const char **key)
{
	const char *b, *slash;
	size_t n;

	if (!ckfs_s3_is_url(url))
		return -1;
	b = url + 5;
	slash = strchr(b, '/');
	n = slash ? (size_t)(slash - b) : strlen(b);
	if (!bucket_ok(b, n) || n >= bucket_size)
		return -1;
	memcpy(bucket, b, n);
	bucket[n] = '\0';
	*key = slash ? slash + 1 : b + n;
	while (**key == '/')
		(*key)++;
	return 0;
}
