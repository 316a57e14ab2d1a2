/*
 * The mode and group of the attach socket (node/serve/perm.c, and its use in
 * node_attach_new): the options' values are parsed or refused in one line,
 * the socket is made with the mode and group asked, and (as root) an engine
 * of another user connects through the group while one outside it is
 * refused, as under the systemd unit and the DaemonSet of deploy/.
 */
#include <errno.h>
#include <event2/event.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "node/serve/attach.h"
#include "node/serve/perm.h"
#include "proto/proto.h"
#include "tests/testutil.h"

static void test_parse_good(void **state)
{
	struct node_perm p;
	struct proto_err err;

	assert_int_equal(node_perm_parse("0660", "0", "--m", "--g", &p, &err), 0);
	assert_true(p.has_mode && p.has_group);
	assert_int_equal(p.mode, 0660);
	assert_int_equal(p.gid, 0);
	assert_int_equal(node_perm_parse("770", "4242", "--m", "--g", &p, &err), 0);
	assert_int_equal(p.mode, 0770);
	assert_int_equal(p.gid, 4242);
	/* A name: the group of gid 0 by its name. */
	struct group *g = getgrgid(0);
	if (g != NULL) {
		assert_int_equal(node_perm_parse(NULL, g->gr_name, "--m", "--g", &p, &err), 0);
		assert_false(p.has_mode);
		assert_true(p.has_group);
		assert_int_equal(p.gid, 0);
	}
	assert_int_equal(node_perm_parse(NULL, NULL, "--m", "--g", &p, &err), 0);
	assert_false(p.has_mode || p.has_group);
}

/* Each bad value gets one line naming the option and the value, and *out
 * stays as it was. */
static void test_parse_bad(void **state)
{
	static const struct {
		const char *mode, *group, *msg;
	} bad[] = {
		{"999", NULL, "--attach-mode 999: want octal permission bits, 0000 to 0777 (0660)"},
		{"1777", NULL, "--attach-mode 1777: want octal permission bits, 0000 to 0777 (0660)"},
		{"", NULL, "--attach-mode : want octal permission bits, 0000 to 0777 (0660)"},
		{"rw-rw----", NULL,
		 "--attach-mode rw-rw----: want octal permission bits, 0000 to 0777 (0660)"},
		{" 0660", NULL, "--attach-mode  0660: want octal permission bits, 0000 to 0777 (0660)"},
		{"-0660", NULL, "--attach-mode -0660: want octal permission bits, 0000 to 0777 (0660)"},
		{"0660x", NULL, "--attach-mode 0660x: want octal permission bits, 0000 to 0777 (0660)"},
		{"99999999999999999999999", NULL,
		 "--attach-mode 99999999999999999999999: want octal permission bits, 0000 to 0777 (0660)"},
		{"0660", "tessera-no-such-group-x", "--attach-group tessera-no-such-group-x: no such group"},
		{NULL, "", "--attach-group: want a group name or a numeric gid"},
		{NULL, "-1", "--attach-group -1: no such group"},
		{NULL, "4294967295", "--attach-group 4294967295: no such group"},
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		struct node_perm p = {.has_mode = true, .mode = 0123, .gid = 77};
		struct proto_err err;
		assert_true(node_perm_parse(bad[i].mode, bad[i].group, "--attach-mode",
					    "--attach-group", &p, &err) < 0);
		assert_string_equal(err.msg, bad[i].msg);
		assert_true(p.has_mode && !p.has_group && p.mode == 0123 && p.gid == 77);
	}
}

/* A group the test may give a file: any as root, else one of its own,
 * a supplementary one where it has one (so that the group changes). */
static gid_t other_group(void)
{
	gid_t groups[64];
	int n;

	if (geteuid() == 0)
		return 4242;
	n = getgroups((int)PROTO_ARRAY_LEN(groups), groups);
	for (int i = 0; i < n; i++)
		if (groups[i] != getegid())
			return groups[i];
	return getegid();
}

struct env {
	char dir[256], sock[300];
	struct event_base *base;
	struct node_store store;
	struct proto_local local;
	struct proto_rank rank;
	uint8_t digest[32];
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	/* Others may reach the socket's directory: the socket's mode decides. */
	assert_int_equal(chmod(e->dir, 0755), 0);
	snprintf(e->sock, sizeof(e->sock), "%s/A-0.sock", e->dir);
	e->local = (struct proto_local){.name = "w", .dtype = PROTO_DT_BF16, .ndim = 1,
					.shape = {64}, .nelem = 64, .nbytes = 128};
	e->rank = (struct proto_rank){.nlocals = 1, .locals = &e->local, .nbytes = 128};
	assert_int_equal(node_store_open("host", &e->store, NULL), 0);
	e->base = event_base_new();
	assert_non_null(e->base);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	event_base_free(e->base);
	tu_rmtree(e->dir);
	free(e);
	return 0;
}

static struct node_attach *attach_new(struct env *e, const struct node_perm *perm,
				      struct proto_err *err)
{
	struct node_attach_info ai = {
		.replica = "A", .spec = &e->rank, .layout_digest = e->digest, .store = &e->store,
		.perm = perm};
	struct node_attach *at = NULL;
	int rc = node_attach_new(e->base, e->sock, &ai, &at, err);
	assert_true((rc == 0) == (at != NULL));
	return at;
}

/* connect(2) to sock as uid:gid with only the supplementary group sup (0:
 * none) in a child; 0 or the errno it got. */
static int connect_as(const char *sock, uid_t uid, gid_t gid, gid_t sup)
{
	pid_t pid = fork();
	int status;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
		if (setgroups(sup != 0, &sup) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
			_exit(100);
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (fd < 0)
			_exit(101);
		_exit(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : errno);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_true(WEXITSTATUS(status) < 100);
	return WEXITSTATUS(status);
}

static void test_socket_mode_and_group(void **state)
{
	struct env *e = *state;
	struct node_perm p = {.has_mode = true, .mode = 0660, .has_group = true,
			      .gid = other_group()};
	struct proto_err err;
	struct stat st;

	struct node_attach *at = attach_new(e, &p, &err);
	if (at == NULL)
		fail_msg("node_attach_new: %s", err.msg);
	assert_int_equal(lstat(e->sock, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_gid, p.gid);
	if (geteuid() == 0) {
		/* An engine's user in the group connects; one outside it is
		 * refused by the mode (as the unit's UMask=0022 made it before). */
		assert_int_equal(connect_as(e->sock, 60002, 60002, p.gid), 0);
		assert_int_equal(connect_as(e->sock, 60003, 60003, 0), EACCES);
	}
	node_attach_free(at);
	assert_int_equal(lstat(e->sock, &st), -1);

	/* Mode only: the group stays the process's. */
	p = (struct node_perm){.has_mode = true, .mode = 0600};
	at = attach_new(e, &p, &err);
	assert_non_null(at);
	assert_int_equal(lstat(e->sock, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(st.st_gid, getegid());
	if (geteuid() == 0)
		assert_int_equal(connect_as(e->sock, 60002, 60002, getegid()), EACCES);
	node_attach_free(at);
}

/* A group the node may not give: the server is not made and leaves no
 * socket behind (as non-root; root may give any group). A missing path is
 * named in one line. */
static void test_apply_fails(void **state)
{
	struct env *e = *state;
	struct node_perm p = {.has_group = true, .gid = 4243};
	struct proto_err err;
	struct stat st;
	char missing[320];

	snprintf(missing, sizeof(missing), "%s/none", e->dir);
	assert_int_equal(node_perm_apply(missing, &p, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "/none: cannot give it group 4243: No such file"));
	assert_int_equal(node_perm_apply(missing, NULL, &err), 0);
	if (geteuid() == 0) {
		skip();
		return;
	}
	gid_t groups[64];
	int n = getgroups((int)PROTO_ARRAY_LEN(groups), groups);
	for (int i = 0; i < n; i++)
		if (groups[i] == p.gid)
			skip();
	assert_null(attach_new(e, &p, &err));
	assert_non_null(strstr(err.msg, "(the node must be a member of that group)"));
	assert_int_equal(lstat(e->sock, &st), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_good),
		cmocka_unit_test(test_parse_bad),
		cmocka_unit_test_setup_teardown(test_socket_mode_and_group, setup, teardown),
		cmocka_unit_test_setup_teardown(test_apply_fails, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
