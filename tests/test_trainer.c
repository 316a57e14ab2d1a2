/* The trainer's side: a publisher fed by trainer ranks through shared buffers (--trainer). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define WAIT_MS 120000

struct env {
	char dir[256], url[256], ctl[512], sock[512], expose[512], model[512], key[512], pub[512];
	struct node_proc tracker, node, publisher;
	struct proto_model m;
	struct proto_layout fsdp2;
};

/* One line into buf (no newline); the fd riding on it into *fd (or -1).
 * Returns false when the socket closed first. */
static bool ctl_line_fd(int fd, char *buf, size_t cap, int *rfd)
{
	size_t n = 0;

	if (rfd != NULL)
		*rfd = -1;
	while (n + 1 < cap) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cm;
		struct iovec iov = {buf + n, 1};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				    .msg_controllen = sizeof(cm.b)};
		if (poll(&p, 1, WAIT_MS) <= 0)
			fail_msg("no answer on the control socket (have '%.*s')", (int)n, buf);
		if (recvmsg(fd, &mh, MSG_CMSG_CLOEXEC) != 1)
			return false;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h))
			if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
				int got;
				memcpy(&got, CMSG_DATA(h), sizeof(got));
				if (rfd != NULL && *rfd < 0)
					*rfd = got;
				else
					close(got);
			}
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = 0;
	return true;
}

static void ctl_send(int fd, const char *s)
{
	assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* Sends cmd and reads its answer into line. */
static void ask(int fd, const char *cmd, char *line, size_t cap)
{
	ctl_send(fd, cmd);
	if (!ctl_line_fd(fd, line, cap, NULL))
		fail_msg("'%s': the publisher closed the socket", cmd);
}

/* Sends cmd and wants an answer starting with want. */
static void expect(int fd, const char *cmd, const char *want)
{
	char line[700];

	ask(fd, cmd, line, sizeof(line));
	if (strncmp(line, want, strlen(want)) != 0)
		fail_msg("'%s': publisher said '%s', want '%s...'", cmd, line, want);
}

/* Sends cmd and wants exactly the answer want. */
static void expect_is(int fd, const char *cmd, const char *want)
{
	char line[700];

	ask(fd, cmd, line, sizeof(line));
	if (strcmp(line, want) != 0)
		fail_msg("'%s': publisher said '%s', want '%s'", cmd, line, want);
}

/* A tracker, a trainer-fed publisher and (node_layout not NULL) one node
 * serving replica A as one rank of node_layout ("fsdp1", "tp1"). */
static void start_cluster(struct env *e, const char *node_layout)
{
	char bin[512], log[600], state_dir[600];
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->sock, sizeof(e->sock), "%s/A-0.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model(8 << 20, &e->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "fsdp2", &e->fsdp2, &err), 0);
	tu_write_model(&e->m, e->model);

	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	if (node_layout != NULL)
		tu_start_node(&e->node, e->dir, e->url, "A", "0", node_layout, e->model, e->pub,
			      e->expose, e->sock, "node");
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--trainer", e->model,
			 "--layout", "fsdp2", "--control", e->ctl, "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
}

static int teardown(void **state)
{
	struct env *e = *state;

	if (e == NULL)
		return 0;
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->tracker, 5000);
	proto_layout_fini(&e->fsdp2);
	proto_model_fini(&e->m);
	if (getenv("TESSERA_TEST_KEEP") != NULL)
		print_message("kept %s\n", e->dir);
	else if (e->dir[0] != 0)
		tu_rmtree(e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	free(e);
	return 0;
}

/*
 * Bad input on the control socket of a trainer-fed publisher: every refused
 * command gets one "error" line naming the reason and changes nothing (the
 * rank stays free, the publisher stays up); the buffer handed out is the
 * rank's block and cannot be resized by the trainer.
 */
static void test_control_refusals(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	char line[700], longline[400];
	int fd, bfd;

	assert_non_null(e);
	*state = e;
	start_cluster(e, "fsdp1");
	fd = tu_control_connect(e->ctl);
	expect(fd, "export\n", "error the source is the trainer");
	expect(fd, "export 7\n", "error export STEP is for trainer ranks");
	expect(fd, "export x7\n", "error export wants a step number");
	expect(fd, "export -1\n", "error export wants a step number");
	expect(fd, "trainer\n", "error usage: trainer RANK");
	expect(fd, "trainer x\n", "error usage: trainer RANK");
	expect(fd, "trainer 0 bytes\n", "error usage: trainer RANK");
	expect(fd, "trainer 0 bytes -5\n", "error usage: trainer RANK");
	expect(fd, "trainer 0 colour red\n", "error usage: trainer RANK");
	expect(fd, "trainer 2\n", "error rank 2 is not a rank of the trainer layout (ranks 0..1)");
	expect(fd, "trainer 99999999999\n", "error usage: trainer RANK");
	snprintf(line, sizeof(line), "trainer 1 bytes %llu\n",
		 (unsigned long long)e->fsdp2.ranks[1].nbytes + 1);
	snprintf(longline, sizeof(longline), "error rank 1 holds %llu bytes",
		 (unsigned long long)e->fsdp2.ranks[1].nbytes);
	expect(fd, line, longline);
	expect(fd, "trainer 1 dtype fp8_e4m3\n", "error rank 1's tensor ");
	expect(fd, "flip\n", "error unknown command 'flip'");
	expect(fd, "status now\n", "error usage: status");
	expect(fd, "status 3\n", "error usage: status");
	expect_is(fd, "status\n", "status idle");

	/* Now a good claim: the buffer comes with its size and table. */
	snprintf(line, sizeof(line), "trainer 1 bytes %llu dtype bf16\n",
		 (unsigned long long)e->fsdp2.ranks[1].nbytes);
	ctl_send(fd, line);
	assert_true(ctl_line_fd(fd, line, sizeof(line), &bfd));
	snprintf(longline, sizeof(longline), "buffer 1 %llu %u",
		 (unsigned long long)e->fsdp2.ranks[1].nbytes, e->fsdp2.ranks[1].nlocals);
	assert_string_equal(line, longline);
	assert_true(bfd >= 0);
	struct stat st;
	assert_int_equal(fstat(bfd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, e->fsdp2.ranks[1].nbytes);
	/* Sealed: the trainer cannot shrink it under the snapshot. */
	assert_int_equal(ftruncate(bfd, 4096), -1);
	assert_int_equal(errno, EPERM);
	for (uint32_t i = 0; i < e->fsdp2.ranks[1].nlocals; i++) {
		const struct proto_local *l = &e->fsdp2.ranks[1].locals[i];
		assert_true(ctl_line_fd(fd, line, sizeof(line), NULL));
		char want[400];
		snprintf(want, sizeof(want), "tensor %s %llu %llu ", proto_dtype_name(l->dtype),
			 (unsigned long long)l->offset, (unsigned long long)l->nbytes);
		if (strncmp(line, want, strlen(want)) != 0 ||
		    strcmp(line + strlen(line) - strlen(l->name), l->name) != 0)
			fail_msg("table line '%s', want '%s... %s'", line, want, l->name);
	}
	close(bfd);
	expect(fd, "trainer 0\n", "error this connection is trainer rank 1 already");
	int other = tu_control_connect(e->ctl);
	expect(other, "trainer 1\n", "error rank 1 is held by another trainer connection");
	/* The step gathers: rank 1 waits; a different step from rank 0 is refused. */
	ctl_send(fd, "export 3\n");
	/* What rank 1 waits for: rank 0, which no connection holds yet. */
	expect_is(fd, "status\n",
		  "status 3 - ranks rank 0 of 2 has not exported step 3 "
		  "(no trainer connection holds rank 0)");
	ctl_send(other, "trainer 0\n");
	assert_true(ctl_line_fd(other, line, sizeof(line), &bfd));
	assert_true(bfd >= 0);
	close(bfd);
	for (uint32_t i = 0; i < e->fsdp2.ranks[0].nlocals; i++)
		assert_true(ctl_line_fd(other, line, sizeof(line), NULL));
	expect_is(fd, "status\n", "status 3 - ranks rank 0 of 2 has not exported step 3");
	expect(fd, "trainer 1\n", "error this connection is trainer rank 1 already");
	expect(other, "export 4\n", "error rank 0 exports step 4 while other ranks export step 3");
	expect(fd, "export 3\n", "error rank 1 already exports step 3");
	/* A line over the cap: refused; without its end the connection is closed. */
	memset(longline, 'x', sizeof(longline) - 2);
	longline[sizeof(longline) - 2] = '\n';
	longline[sizeof(longline) - 1] = 0;
	expect(other, longline, "error line too long");
	longline[sizeof(longline) - 2] = 0;
	expect(other, longline, "error line too long");
	assert_false(ctl_line_fd(other, line, sizeof(line), NULL));
	close(other);
	/* Rank 0 left: a new connection holds it at once. */
	other = tu_control_connect(e->ctl);
	ctl_send(other, "trainer 0\n");
	assert_true(ctl_line_fd(other, line, sizeof(line), &bfd));
	assert_true(strncmp(line, "buffer 0 ", 9) == 0);
	close(bfd);
	close(other);
	close(fd);
	assert_true(node_proc_alive(&e->publisher));
}

/* Claims trainer rank r on fd: reads its buffer line and table. */
static void claim(int fd, const struct proto_layout *tl, uint32_t r)
{
	char line[700], want[64];
	int bfd;

	snprintf(line, sizeof(line), "trainer %u\n", r);
	ctl_send(fd, line);
	assert_true(ctl_line_fd(fd, line, sizeof(line), &bfd));
	snprintf(want, sizeof(want), "buffer %u ", r);
	if (strncmp(line, want, strlen(want)) != 0 || bfd < 0)
		fail_msg("'trainer %u': publisher said '%s'", r, line);
	close(bfd);
	for (uint32_t i = 0; i < tl->ranks[r].nlocals; i++)
		assert_true(ctl_line_fd(fd, line, sizeof(line), NULL));
}

/* Reads "snapshot STEP V" on fd; returns V. */
static uint64_t snapshot_of(int fd, uint64_t step)
{
	char line[700], want[64];

	assert_true(ctl_line_fd(fd, line, sizeof(line), NULL));
	snprintf(want, sizeof(want), "snapshot %llu ", (unsigned long long)step);
	if (strncmp(line, want, strlen(want)) != 0)
		fail_msg("publisher said '%s', want '%s V'", line, want);
	return strtoull(line + strlen(want), NULL, 10);
}

/* Two connections, holding trainer ranks 0 and 1. */
static void hold_ranks(struct env *e, int *r0, int *r1)
{
	*r0 = tu_control_connect(e->ctl);
	*r1 = tu_control_connect(e->ctl);
	claim(*r0, &e->fsdp2, 0);
	claim(*r1, &e->fsdp2, 1);
}

/* Rank 0 (on r0) exports step alone; its status says rank 1 has not. Each
 * status is asked on the connection whose export it must follow: the
 * publisher reads two connections in no set order. */
static void export_alone(int r0, uint64_t step)
{
	char cmd[64], want[128];

	snprintf(cmd, sizeof(cmd), "export %llu\n", (unsigned long long)step);
	ctl_send(r0, cmd);
	snprintf(want, sizeof(want), "status %llu - ranks rank 1 of 2 has not exported step %llu",
		 (unsigned long long)step, (unsigned long long)step);
	expect_is(r0, "status\n", want);
}

/*
 * "status" names what a trainer's export waits for, with no node
 * registered: the rank that has not exported; once both did (the
 * snapshot is taken all the same), the serving layout no node registered;
 * the next step, queued behind that export, the busy publisher. None of
 * these states ends by itself, so each answer is exact however slow the
 * machine; only the first layouts answer from the tracker is waited for.
 */
static void test_status_no_node(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	char line[700], want[300], passing[64];
	uint64_t v;
	int r0, r1;

	assert_non_null(e);
	*state = e;
	start_cluster(e, NULL);
	hold_ranks(e, &r0, &r1);
	export_alone(r0, 1);
	ctl_send(r1, "export 1\n");
	v = snapshot_of(r0, 1);
	assert_int_equal(snapshot_of(r1, 1), v);
	snprintf(want, sizeof(want), "status 1 %llu layouts no node has registered a serving layout "
		 "yet (version %llu waits for one, ", (unsigned long long)v, (unsigned long long)v);
	snprintf(passing, sizeof(passing), "status 1 %llu tracker ", (unsigned long long)v);
	for (int i = 0;; i++) {
		ask(r1, "status\n", line, sizeof(line));
		if (strncmp(line, want, strlen(want)) == 0)
			break;
		/* Until the tracker's first answer: registering, asking for layouts. */
		if (strncmp(line, passing, strlen(passing)) != 0 || i >= WAIT_MS / 50)
			fail_msg("publisher said '%s', want '%s...'", line, want);
		usleep(50000);
	}
	/* The ranks come back on new connections: step 2 waits behind version v. */
	close(r0);
	close(r1);
	hold_ranks(e, &r0, &r1);
	export_alone(r0, 2);
	ctl_send(r1, "export 2\n");
	snprintf(want, sizeof(want), "status 2 - busy the publisher is busy exporting version %llu: "
		 "no node has registered a serving layout yet", (unsigned long long)v);
	expect(r1, "status\n", want);
	expect(r0, "status\n", want);
	close(r0);
	close(r1);
	assert_true(node_proc_alive(&e->publisher));
}

/* Whether the python where pip installed tessera, numpy and (with_torch)
 * torch are there; else says which is missing (the test then skips). */
static bool python_ready(bool with_torch)
{
	const char *py = tu_python();

	if (py == NULL) {
		print_message("skipped: needs TESSERA_PYTHON, the python where pip installed "
			      "tessera (make test makes it)\n");
		return false;
	}
	if (tu_sh("%s -c 'import numpy' 2>/dev/null", py) != 0) {
		print_message("skipped: numpy is not installed for %s\n", py);
		return false;
	}
	if (with_torch && tu_sh("%s -c 'import torch' 2>/dev/null", py) != 0) {
		print_message("skipped: torch is not installed for %s (Debian: python3-torch)\n",
			      py);
		return false;
	}
	return true;
}

/* Runs tests/py/<script> <args> (quoted by the caller) with its output in
 * dir; fails the test, showing its stderr and the tail of log (when not
 * NULL), unless it exits 0 having printed "ok". */
static void run_python(const char *dir, const char *script, const char *args, const char *log)
{
	char out[600], errf[600], path[512], rel[128];
	int rc;

	snprintf(out, sizeof(out), "%s/%s.out", dir, script);
	snprintf(errf, sizeof(errf), "%s/%s.err", dir, script);
	snprintf(rel, sizeof(rel), "tests/py/%s", script);
	tu_src(path, sizeof(path), rel);
	/* The library is a plain build: keep ASan's runtime out of python. */
	rc = tu_sh("env -u LD_PRELOAD timeout 600 %s '%s' %s >'%s' 2>'%s'", tu_python(), path, args,
		   out, errf);
	if (rc != 0 || tu_sh("grep -qx ok '%s'", out) != 0) {
		tu_sh("cat '%s' >&2", errf);
		if (log != NULL)
			tu_sh("tail -n 20 '%s' >&2", log);
		fail_msg("%s %s failed (status %d)", script, args, rc);
	}
}

/* Starts the cluster, its node serving node_layout (NULL: no node, and the
 * script's NODE-SOCK is "-"), and runs tests/py/script with the arguments
 * [mode] CTL NODE-SOCK A 2 MODEL.json (replica A, two trainer ranks); skips
 * without python (or torch, when with_torch). */
static struct env *python_cluster(void **state, bool with_torch, const char *node_layout,
				  const char *script, const char *mode)
{
	char args[2048], log[600];
	struct env *e;

	if (!python_ready(with_torch))
		skip();
	e = calloc(1, sizeof(*e));
	assert_non_null(e);
	*state = e;
	start_cluster(e, node_layout);
	snprintf(args, sizeof(args), "%s '%s' '%s' A 2 '%s'", mode ? mode : "", e->ctl,
		 node_layout != NULL ? e->sock : "-", e->model);
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	run_python(e->dir, script, args, log);
	assert_true(node_proc_alive(&e->publisher));
	assert_true(node_layout == NULL || node_proc_alive(&e->node));
	return e;
}

/*
 * The done-when of the trainer's side: a Python trainer (two ranks, fsdp2)
 * fills shared buffers and exports three steps (one rank's export timing
 * out first, naming the other; then every rank from one thread; then a
 * thread each); a Python serving client of a TP1 node reads each as numpy
 * arrays equal to the expected bytes.
 */
static void test_python_trainer(void **state)
{
	struct env *e = python_cluster(state, false, "fsdp1", "trainer_export.py", NULL);

	assert_int_equal(tu_sh("grep -q 'trainer step 300 is version' '%s/publisher.log'", e->dir), 0);
}

/*
 * A Python trainer's timeouts with no node registered name their cause: a
 * rank no connection holds, no serving layout, the busy publisher; and the
 * client's side of "status" against a fake publisher (bad answers, an old
 * publisher, silence, a closed socket).
 */
static void test_python_trainer_waits(void **state)
{
	python_cluster(state, false, NULL, "trainer_export.py", NULL);
}

/* tessera.torch's piece arithmetic on hand-built tables (no node). */
static void test_python_torch_pieces(void **state)
{
	char dir[256];

	if (!python_ready(true))
		skip();
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	run_python(dir, "torch_roundtrip.py", "pieces", NULL);
	tu_rmtree(dir);
}

/*
 * torch in and out: two trainer ranks (fsdp2) fill their buffers from torch
 * bf16 tensors; a tp1 node (fused qkv_proj, gate_up_proj) hands them back
 * through tessera.torch as views of its memory, bit for bit, under checkpoint
 * and fused names, and load_into copies them into a module.
 */
static void test_python_torch(void **state)
{
	python_cluster(state, true, "tp1", "torch_roundtrip.py", "cluster");
}

/* --trainer wants a control socket and no other trigger: one clear line. */
static void test_cli_trainer_needs_control(void **state)
{
	char bin[512], dir[256], errf[300];

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(errf, sizeof(errf), "%s/err", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	const char *bad[] = {"--trainer model.json", "--trainer model.json --control c.sock --every 5",
			     "--trainer model.json --synthetic-mb 1 --control c.sock"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = tu_sh("cd %s && %s publish --tracker http://127.0.0.1:1 --key k %s >/dev/null 2>%s",
			       dir, bin, bad[i], errf);
		assert_int_not_equal(rc, 0);
		if (tu_sh("test $(wc -l < %s) -eq 1 && grep -q -- '--trainer' %s", errf, errf) != 0) {
			tu_sh("cat %s >&2", errf);
			fail_msg("'%s': want one line naming --trainer", bad[i]);
		}
	}
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cli_trainer_needs_control),
		cmocka_unit_test_teardown(test_control_refusals, teardown),
		cmocka_unit_test_teardown(test_status_no_node, teardown),
		cmocka_unit_test_teardown(test_python_trainer, teardown),
		cmocka_unit_test_teardown(test_python_trainer_waits, teardown),
		cmocka_unit_test(test_python_torch_pieces),
		cmocka_unit_test_teardown(test_python_torch, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
