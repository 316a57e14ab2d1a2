/* Key files: the trainer's Ed25519 key pair and the cluster's shared key. */
#include "proto/manifest.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/log.h"

#define KEY_SECRET_PREFIX "tessera-ed25519-secret"
#define KEY_PUBLIC_PREFIX "tessera-ed25519-public"
#define KEY_CLUSTER_PREFIX "tessera-cluster-key"
#define KEY_FILE_MAX 1024 /* a key file is one short line */

/* "<prefix> <hex>\n" for n bytes: prefix, space, 2n digits, newline. */
static int key_write(const char *path, const char *prefix, const uint8_t *key,
		     size_t n, mode_t mode, struct proto_err *err)
{
	char line[KEY_FILE_MAX];
	size_t pl = strlen(prefix);
	int rc;

	if (pl + 2 * n + 3 > sizeof(line))
		return proto_errf(err, EINVAL, "%s: key too long", path);
	memcpy(line, prefix, pl);
	line[pl] = ' ';
	sodium_bin2hex(line + pl + 1, 2 * n + 1, key, n);
	line[pl + 1 + 2 * n] = '\n';
	rc = proto_write_file_atomic(path, line, pl + 2 + 2 * n, mode, err);
	sodium_memzero(line, sizeof(line));
	return rc;
}

int proto_keygen(const char *secret_path, const char *public_path,
		 struct proto_err *err)
{
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	int rc;

	if (sodium_init() < 0)
		return proto_errf(err, EIO, "keygen: libsodium failed to initialise");
	crypto_sign_keypair(pk, sk);
	rc = key_write(secret_path, KEY_SECRET_PREFIX, sk, sizeof(sk), 0600, err);
	sodium_memzero(sk, sizeof(sk));
	if (rc != 0)
		return rc;
	rc = key_write(public_path, KEY_PUBLIC_PREFIX, pk, sizeof(pk), 0644, err);
	if (rc != 0)
		unlink(secret_path); /* a secret without its public half is useless */
	return rc;
}

int proto_cluster_keygen(const char *path, struct proto_err *err)
{
	uint8_t key[PROTO_CLUSTER_KEY_BYTES];
	int rc;

	if (sodium_init() < 0)
		return proto_errf(err, EIO, "keygen: libsodium failed to initialise");
	crypto_auth_keygen(key);
	rc = key_write(path, KEY_CLUSTER_PREFIX, key, sizeof(key), 0600, err);
	sodium_memzero(key, sizeof(key));
	return rc;
}

/*
 * Parses exactly "<prefix> <2n hex digits>" with at most one trailing
 * newline from buf (named name in errors) into key. On failure key is
 * zeroed.
 */
static int key_parse(const uint8_t *buf, size_t len, const char *name, const char *prefix,
		     const char *what, uint8_t *key, size_t n, struct proto_err *err)
{
	size_t pl = strlen(prefix), hexlen, got = 0;
	const char *hex, *end = NULL;
	int rc;

	memset(key, 0, n);
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	if (len < pl + 1 || memcmp(buf, prefix, pl) != 0 || buf[pl] != ' ') {
		rc = proto_errf(err, EINVAL,
				"%s: not a %s file (expected one line \"%s <hex>\")",
				name, what, prefix);
		goto out;
	}
	hex = (const char *)buf + pl + 1;
	hexlen = len - pl - 1;
	if (memchr(hex, '\n', hexlen) != NULL) {
		rc = proto_errf(err, EINVAL, "%s: extra content after the key line",
				name);
		goto out;
	}
	if (hexlen != 2 * n) {
		rc = proto_errf(err, EINVAL,
				"%s: key has %zu characters, expected %zu hex digits",
				name, hexlen, 2 * n);
		goto out;
	}
	if (sodium_hex2bin(key, n, hex, hexlen, NULL, &got, &end) != 0 ||
	    got != n || end != hex + hexlen) {
		rc = proto_errf(err, EINVAL, "%s: bad hex digit at column %zu", name,
				(size_t)((end != NULL ? end : hex) - (const char *)buf) + 1);
		goto out;
	}
	rc = 0;
out:
	if (rc != 0)
		sodium_memzero(key, n);
	return rc;
}

/* Reads path and parses it (key_parse); err names the file. */
static int key_read(const char *path, const char *prefix, const char *what,
		    uint8_t *key, size_t n, struct proto_err *err)
{
	uint8_t *buf = NULL;
	size_t len;
	int rc;

	memset(key, 0, n);
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "%s: libsodium failed to initialise", path);
	rc = proto_read_file(path, KEY_FILE_MAX, &buf, &len, err);
	if (rc != 0)
		return rc;
	rc = key_parse(buf, len, path, prefix, what, key, n, err);
	sodium_memzero(buf, len);
	free(buf);
	return rc;
}

/* A secret key file that others can read is reported, not refused: the
 * operator may have reasons (a tmpfs owned by the job), but should know. */
static void warn_if_readable(const char *path)
{
	struct stat st;

	if (stat(path, &st) == 0 && (st.st_mode & 077) != 0)
		LOG_WARN("%s: secret key file is accessible by others (mode %03o)",
			 path, (unsigned)(st.st_mode & 0777));
}

int proto_key_load_secret(const char *path, uint8_t sk[PROTO_SK_BYTES],
			  struct proto_err *err)
{
	uint8_t seed[crypto_sign_SEEDBYTES], pk[PROTO_PK_BYTES];
	uint8_t sk2[PROTO_SK_BYTES], half[PROTO_PK_BYTES];
	int rc;

	rc = key_read(path, KEY_SECRET_PREFIX, "tessera Ed25519 secret key", sk,
		      PROTO_SK_BYTES, err);
	if (rc != 0)
		return rc;
	/* libsodium's secret key is seed || public key: rederive the public
	 * key from the seed and check the stored half matches it. */
	crypto_sign_ed25519_sk_to_seed(seed, sk);
	crypto_sign_seed_keypair(pk, sk2, seed);
	crypto_sign_ed25519_sk_to_pk(half, sk);
	if (sodium_memcmp(pk, half, PROTO_PK_BYTES) != 0)
		rc = proto_errf(err, EINVAL,
				"%s: the public half of the secret key does not match its seed",
				path);
	sodium_memzero(seed, sizeof(seed));
	sodium_memzero(sk2, sizeof(sk2));
	if (rc != 0) {
		sodium_memzero(sk, PROTO_SK_BYTES);
		return rc;
	}
	warn_if_readable(path);
	return 0;
}

int proto_key_load_public(const char *path, uint8_t pk[PROTO_PK_BYTES],
			  struct proto_err *err)
{
	return key_read(path, KEY_PUBLIC_PREFIX, "tessera Ed25519 public key", pk,
			PROTO_PK_BYTES, err);
}

int proto_key_parse_public(const uint8_t *buf, size_t len, const char *name,
			   uint8_t pk[PROTO_PK_BYTES], struct proto_err *err)
{
	return key_parse(buf, len, name, KEY_PUBLIC_PREFIX, "tessera Ed25519 public key", pk,
			 PROTO_PK_BYTES, err);
}

int proto_key_load_cluster(const char *path,
			   uint8_t key[PROTO_CLUSTER_KEY_BYTES],
			   struct proto_err *err)
{
	int rc = key_read(path, KEY_CLUSTER_PREFIX, "tessera cluster key", key,
			  PROTO_CLUSTER_KEY_BYTES, err);
	if (rc == 0)
		warn_if_readable(path);
	return rc;
}
