/* Tests of key files: generation, modes, strict loading, and `tessera keygen`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <sodium.h>

#include "proto/manifest.h"
#include "tests/testutil.h"

struct ctx {
	char dir[4096];
};

static int setup(void **state)
{
	struct ctx *c = calloc(1, sizeof(*c));

	if (c == NULL || tu_mkdtemp(c->dir, sizeof(c->dir)) == NULL)
		return -1;
	umask(022);
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	struct ctx *c = *state;

	tu_rmtree(c->dir);
	free(c);
	return 0;
}

static const char *path_in(const struct ctx *c, char *buf, size_t len,
			   const char *name)
{
	snprintf(buf, len, "%s/%s", c->dir, name);
	return buf;
}

static mode_t mode_of(const char *path)
{
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	return st.st_mode & 07777;
}

/* Expects a loader failure whose one-line message names the file and
 * contains want; the key buffer must come back zeroed. */
static void expect_bad(int (*load)(const char *, uint8_t *, struct proto_err *),
		       size_t keylen, const char *path, const char *want)
{
	uint8_t key[PROTO_SK_BYTES];
	struct proto_err err = {{0}};
	int rc;

	memset(key, 0xee, sizeof(key));
	rc = load(path, key, &err);
	if (rc >= 0 || strstr(err.msg, path) == NULL || strstr(err.msg, want) == NULL ||
	    strchr(err.msg, '\n') != NULL) {
		fprintf(stderr, "%s: rc %d, message '%s', wanted '%s'\n", path, rc,
			err.msg, want);
		fail();
	}
	assert_true(sodium_is_zero(key, keylen));
}

static int load_sk(const char *p, uint8_t *k, struct proto_err *e)
{
	return proto_key_load_secret(p, k, e);
}

static int load_pk(const char *p, uint8_t *k, struct proto_err *e)
{
	return proto_key_load_public(p, k, e);
}

static int load_ck(const char *p, uint8_t *k, struct proto_err *e)
{
	return proto_key_load_cluster(p, k, e);
}

static void test_keygen_roundtrip(void **state)
{
	struct ctx *c = *state;
	char sp[4096], pp[4096];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES], pk2[PROTO_PK_BYTES];
	uint8_t sig[PROTO_SIG_BYTES], msg[] = "version 7";
	struct proto_err err = {{0}};

	path_in(c, sp, sizeof(sp), "t.key");
	path_in(c, pp, sizeof(pp), "t.pub");
	assert_int_equal(proto_keygen(sp, pp, &err), 0);
	assert_int_equal(mode_of(sp), 0600);
	assert_int_equal(mode_of(pp), 0644);
	assert_int_equal(proto_key_load_secret(sp, sk, &err), 0);
	assert_int_equal(proto_key_load_public(pp, pk, &err), 0);
	crypto_sign_ed25519_sk_to_pk(pk2, sk);
	assert_memory_equal(pk, pk2, PROTO_PK_BYTES);
	crypto_sign_detached(sig, NULL, msg, sizeof(msg), sk);
	assert_int_equal(crypto_sign_verify_detached(sig, msg, sizeof(msg), pk), 0);

	/* The file is exactly one line: prefix, space, hex, newline. */
	uint8_t *buf;
	size_t len;
	assert_int_equal(proto_read_file(pp, 4096, &buf, &len, &err), 0);
	assert_int_equal(len, strlen("tessera-ed25519-public ") + 64 + 1);
	assert_memory_equal(buf, "tessera-ed25519-public ", 23);
	assert_int_equal(buf[len - 1], '\n');
	free(buf);

	/* A second pair is different. */
	uint8_t pk3[PROTO_PK_BYTES];
	assert_int_equal(proto_keygen(sp, pp, &err), 0);
	assert_int_equal(proto_key_load_public(pp, pk3, &err), 0);
	assert_memory_not_equal(pk, pk3, PROTO_PK_BYTES);
	sodium_memzero(sk, sizeof(sk));
}

static void test_cluster_keygen(void **state)
{
	struct ctx *c = *state;
	char p[4096];
	uint8_t k[PROTO_CLUSTER_KEY_BYTES];
	struct proto_err err = {{0}};

	path_in(c, p, sizeof(p), "cluster.key");
	assert_int_equal(proto_cluster_keygen(p, &err), 0);
	assert_int_equal(mode_of(p), 0600);
	assert_int_equal(proto_key_load_cluster(p, k, &err), 0);
	assert_false(sodium_is_zero(k, sizeof(k)));
	/* Not interchangeable with the other kinds. */
	expect_bad(load_pk, PROTO_PK_BYTES, p, "not a tessera Ed25519 public key file");
	expect_bad(load_sk, PROTO_SK_BYTES, p, "not a tessera Ed25519 secret key file");
}

static void test_keygen_unwritable(void **state)
{
	struct proto_err err = {{0}};

	assert_true(proto_keygen("/nonexistent-dir/x.key", "/nonexistent-dir/x.pub",
				 &err) < 0);
	assert_non_null(strstr(err.msg, "/nonexistent-dir/x.key"));
	assert_true(proto_cluster_keygen("/nonexistent-dir/c", &err) < 0);
}

static void test_bad_key_files(void **state)
{
	struct ctx *c = *state;
	char sp[4096], pp[4096], p[4096], line[512];
	struct proto_err err = {{0}};
	uint8_t *buf;
	size_t len;
	char sline[256], pline[128];

	path_in(c, sp, sizeof(sp), "good.key");
	path_in(c, pp, sizeof(pp), "good.pub");
	assert_int_equal(proto_keygen(sp, pp, &err), 0);
	assert_int_equal(proto_read_file(sp, 4096, &buf, &len, &err), 0);
	assert_true(len < sizeof(sline));
	memcpy(sline, buf, len + 1);
	free(buf);
	assert_int_equal(proto_read_file(pp, 4096, &buf, &len, &err), 0);
	memcpy(pline, buf, len + 1);
	free(buf);
	const char *shex = sline + 23, *phex = pline + 23;

	path_in(c, p, sizeof(p), "bad");
	/* Missing and empty files. */
	expect_bad(load_pk, PROTO_PK_BYTES, p, "No such file");
	assert_int_equal(tu_write(p, ""), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "not a tessera Ed25519 public key file");
	/* Wrong prefix: a public key where a secret one is wanted. */
	expect_bad(load_sk, PROTO_SK_BYTES, pp, "not a tessera Ed25519 secret key file");
	expect_bad(load_ck, PROTO_CLUSTER_KEY_BYTES, pp, "not a tessera cluster key file");
	snprintf(line, sizeof(line), "tessera-ed25519-publik %.64s\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "expected one line \"tessera-ed25519-public <hex>\"");
	snprintf(line, sizeof(line), "tessera-ed25519-public\t%.64s\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "not a tessera");
	/* Truncated, too long, odd whitespace. */
	snprintf(line, sizeof(line), "tessera-ed25519-public %.62s\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "62 characters, expected 64 hex digits");
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s00\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "66 characters");
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s \n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "65 characters");
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s\r\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "65 characters");
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s\n\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "extra content after the key line");
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s\n# comment\n", phex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "extra content");
	/* Bad hex digit, reported by column. */
	snprintf(line, sizeof(line), "tessera-ed25519-public %.10sg%.53s\n", phex, phex + 11);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "bad hex digit at column 34");
	/* No trailing newline is fine. */
	snprintf(line, sizeof(line), "tessera-ed25519-public %.64s", phex);
	assert_int_equal(tu_write(p, line), 0);
	uint8_t pk[PROTO_PK_BYTES];
	assert_int_equal(proto_key_load_public(p, pk, &err), 0);

	/* Secret key whose public half was altered. */
	snprintf(line, sizeof(line), "tessera-ed25519-secret %.64s%064d\n", shex, 0);
	assert_int_equal(tu_write(p, line), 0);
	chmod(p, 0600);
	expect_bad(load_sk, PROTO_SK_BYTES, p, "does not match its seed");
	/* A secret key with another pair's public half. */
	uint8_t opk[PROTO_PK_BYTES], osk[PROTO_SK_BYTES];
	char ohex[2 * PROTO_PK_BYTES + 1];
	crypto_sign_keypair(opk, osk);
	sodium_bin2hex(ohex, sizeof(ohex), opk, sizeof(opk));
	snprintf(line, sizeof(line), "tessera-ed25519-secret %.64s%s\n", shex, ohex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_sk, PROTO_SK_BYTES, p, "does not match its seed");
	/* Truncated secret. */
	snprintf(line, sizeof(line), "tessera-ed25519-secret %.100s\n", shex);
	assert_int_equal(tu_write(p, line), 0);
	expect_bad(load_sk, PROTO_SK_BYTES, p, "expected 128 hex digits");
	/* A huge file is refused before it is read. */
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	for (int i = 0; i < 1000; i++)
		fputs("tessera-ed25519-public ", f);
	fclose(f);
	expect_bad(load_pk, PROTO_PK_BYTES, p, "allowed");
	sodium_memzero(sline, sizeof(sline));
	sodium_memzero(line, sizeof(line));
}

/* ---- the CLI ---------------------------------------------------------------- */

static int lines_in(const char *path)
{
	uint8_t *buf;
	size_t len;
	int n = 0;

	if (proto_read_file(path, 1 << 16, &buf, &len, NULL) != 0)
		return -1;
	for (size_t i = 0; i < len; i++)
		n += buf[i] == '\n';
	free(buf);
	return n;
}

static void test_cli(void **state)
{
	struct ctx *c = *state;
	char bin[4096], pre[4096], p[4096], err[4096], out[4096];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
	struct proto_err e = {{0}};

	tu_bin(bin, sizeof(bin), "tessera");
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "%s not built; skipping the CLI tests\n", bin);
		skip();
	}
	path_in(c, pre, sizeof(pre), "trainer");
	path_in(c, err, sizeof(err), "stderr");
	path_in(c, out, sizeof(out), "stdout");

	assert_int_equal(tu_sh("'%s' keygen --help >'%s' 2>'%s'", bin, out, err), 0);
	assert_int_equal(tu_sh("grep -q 'usage: tessera keygen' '%s'", out), 0);

	assert_int_equal(tu_sh("'%s' keygen -o '%s' >'%s' 2>'%s'", bin, pre, out, err), 0);
	assert_int_equal(proto_key_load_secret(path_in(c, p, sizeof(p), "trainer.key"), sk, &e), 0);
	assert_int_equal(mode_of(p), 0600);
	assert_int_equal(proto_key_load_public(path_in(c, p, sizeof(p), "trainer.pub"), pk, &e), 0);
	assert_int_equal(mode_of(p), 0644);
	char hex[2 * PROTO_PK_BYTES + 1];
	sodium_bin2hex(hex, sizeof(hex), pk, sizeof(pk));
	/* The public key alone on stdout (machine output), the message on
	 * stderr, one line. */
	assert_int_equal(tu_sh("test \"$(cat '%s')\" = '%s'", out, hex), 0);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q '^tessera keygen: wrote .*trainer.key and .*trainer.pub$' '%s'",
			       err), 0);

	/* Existing files are kept unless --force. */
	assert_int_equal(tu_sh("'%s' keygen -o '%s' >'%s' 2>'%s'", bin, pre, out, err), 1);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q 'exists; use --force' '%s'", err), 0);
	uint8_t pk2[PROTO_PK_BYTES];
	assert_int_equal(proto_key_load_public(p, pk2, &e), 0);
	assert_memory_equal(pk, pk2, PROTO_PK_BYTES);
	assert_int_equal(tu_sh("'%s' keygen --force -o '%s' >'%s' 2>'%s'", bin, pre, out, err), 0);
	assert_int_equal(proto_key_load_public(p, pk2, &e), 0);
	assert_memory_not_equal(pk, pk2, PROTO_PK_BYTES);

	/* Cluster key. */
	path_in(c, p, sizeof(p), "cluster");
	assert_int_equal(tu_sh("'%s' keygen --cluster -o '%s' >'%s' 2>'%s'", bin, p, out, err), 0);
	assert_int_equal(mode_of(p), 0600);
	assert_int_equal(tu_sh("test ! -s '%s'", out), 0);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q '^tessera keygen: wrote cluster key ' '%s'", err), 0);
	uint8_t ck[PROTO_CLUSTER_KEY_BYTES];
	assert_int_equal(proto_key_load_cluster(p, ck, &e), 0);
	assert_int_equal(tu_sh("'%s' keygen --cluster -o '%s' >'%s' 2>'%s'", bin, p, out, err), 1);
	assert_int_equal(lines_in(err), 1);

	/* Usage errors: one line, non-zero. */
	assert_int_equal(tu_sh("'%s' keygen >'%s' 2>'%s'", bin, out, err), 2);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q -- '-o PATH is required' '%s'", err), 0);
	assert_int_equal(tu_sh("'%s' keygen -o x extra >'%s' 2>'%s'", bin, out, err), 2);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("'%s' keygen --bogus >'%s' 2>'%s'", bin, out, err), 2);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q -- \"unknown option '--bogus'\" '%s'", err), 0);
	assert_int_equal(tu_sh("'%s' keygen -o >'%s' 2>'%s'", bin, out, err), 2);
	assert_int_equal(lines_in(err), 1);
	/* Unwritable destination. */
	assert_int_equal(tu_sh("'%s' keygen -o /nonexistent-dir/k >'%s' 2>'%s'", bin, out, err), 1);
	assert_int_equal(lines_in(err), 1);
	assert_int_equal(tu_sh("grep -q '/nonexistent-dir/k.key' '%s'", err), 0);
	sodium_memzero(sk, sizeof(sk));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_keygen_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cluster_keygen, setup, teardown),
		cmocka_unit_test(test_keygen_unwritable),
		cmocka_unit_test_setup_teardown(test_bad_key_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cli, setup, teardown),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
