/*
 * The RL loop as users run it (deploy/rl-loop.py): a torch trainer exports
 * every step through a trainer-fed publisher; a tp2 replica of two node
 * agents, whose rank 1 hears of every version 300 ms late, serves a
 * tensor-parallel engine of two torch.distributed workers that switch
 * together (tessera.engine); the engine's sharded logits equal the
 * trainer's unsharded ones for every version, on double-buffered and on
 * in-place nodes. Skips without python3-torch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/testutil.h"

#define STEPS 4

static void rl_loop(const char *install)
{
	const char *py = tu_python();
	char dir[256], bin[512], script[512];

	if (py == NULL) {
		print_message("skipped: needs TESSERA_PYTHON, the python where pip installed "
			      "tessera (make test makes it)\n");
		skip();
	}
	if (tu_sh("%s -c 'import torch, numpy' 2>/dev/null", py) != 0) {
		print_message("skipped: torch is not installed for %s (Debian: python3-torch)\n", py);
		skip();
	}
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	tu_bin(bin, sizeof(bin), "");
	/* The library is a plain build: keep ASan's runtime out of python. */
	tu_src(script, sizeof(script), "deploy/rl-loop.py");
	int rc = tu_sh("env -u LD_PRELOAD timeout 600 %s '%s' --bin '%s' "
		       "--steps %d --every-ms 800 --rank-lag-ms 300 --install %s --keep '%s/run' "
		       ">'%s/out' 2>'%s/err'",
		       py, script, bin, STEPS, install, dir, dir, dir);
	tu_sh("cat '%s/out'", dir);
	if (rc != 0) {
		tu_sh("tail -n 30 '%s/err' >&2; tail -n 5 '%s'/run/*.log >&2", dir, dir);
		fail_msg("deploy/rl-loop.py failed (status %d)", rc);
	}
	/* Every version the engine switched to (all of them, with holds) had
	 * the trainer's logits. */
	assert_int_equal(tu_sh("grep -q '^rl-loop: \\([0-9]*\\) versions, logits equal in \\1;' '%s/out'",
			       dir),
			 0);
	if (strcmp(install, "double") == 0)
		assert_int_equal(tu_sh("grep -q '^rl-loop: %d versions' '%s/out'", STEPS, dir), 0);
	tu_rmtree(dir);
}

/* Double-buffered nodes: the workers hold what their ranks announce and
 * switch together to a version both hold. */
static void test_rl_loop_holds(void **state)
{
	rl_loop("double");
}

/* In-place nodes hold nothing: the workers pin what their nodes serve and
 * agree that the pins name one version, else retry. */
static void test_rl_loop_in_place(void **state)
{
	rl_loop("in-place");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rl_loop_holds),
		cmocka_unit_test(test_rl_loop_in_place),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
