/* The interface a fabric endpoint binds (node/base/fabiface.c): the route to
 * the tracker, or --fabric-iface; a name that is not an interface here is
 * refused with one line, by the library and by tessera-node. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/base/fabiface.h"
#include "tests/testutil.h"

/* A tracker on loopback: the endpoint binds loopback, not the machine's
 * external interface (the provider's first choice). */
static void test_route_to_loopback_tracker(void **state)
{
	struct node_fabiface fi;
	struct proto_err err;

	(void)state;
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, "http://127.0.0.1:7400", &fi, &err), 0);
	assert_string_equal(fi.addr, "127.0.0.1");
	assert_string_equal(fi.name, "lo");
	assert_string_equal(fi.why, "the route to the tracker");
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, "http://localhost:7400/", &fi, &err), 0);
	assert_true(strcmp(fi.addr, "127.0.0.1") == 0 || strcmp(fi.addr, "::1") == 0);
}

/* A tracker at another interface's address: that interface (skipped when
 * the machine has only loopback). */
static void test_route_to_other_interface(void **state)
{
	struct ifaddrs *all = NULL;
	char addr[INET_ADDRSTRLEN] = "", name[64] = "", url[128];
	struct node_fabiface fi;
	struct proto_err err;

	(void)state;
	assert_int_equal(getifaddrs(&all), 0);
	for (struct ifaddrs *i = all; i != NULL && addr[0] == '\0'; i = i->ifa_next)
		if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
		    strcmp(i->ifa_name, "lo") != 0) {
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr,
				  sizeof(addr));
			snprintf(name, sizeof(name), "%s", i->ifa_name);
		}
	freeifaddrs(all);
	if (addr[0] == '\0')
		skip();
	snprintf(url, sizeof(url), "http://%s:7400", addr);
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, url, &fi, &err), 0);
	assert_string_equal(fi.addr, addr);
	assert_string_equal(fi.name, name);
	/* --fabric-iface names it; loopback by name too. */
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", name, "http://127.0.0.1:7400", &fi, &err), 0);
	assert_string_equal(fi.addr, addr);
	assert_string_equal(fi.why, "--fabric-iface");
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", "lo", url, &fi, &err), 0);
	assert_string_equal(fi.addr, "127.0.0.1");
	/* libfabric's FI_TCP_IFACE outranks the route (a tracker on a
	 * management network), --fabric-iface outranks it. */
	setenv("FI_TCP_IFACE", "lo", 1);
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, url, &fi, &err), 0);
	assert_string_equal(fi.addr, "127.0.0.1");
	assert_string_equal(fi.why, "FI_TCP_IFACE");
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", name, url, &fi, &err), 0);
	assert_string_equal(fi.addr, addr);
	unsetenv("FI_TCP_IFACE");
}

/* Bad input: one clear line, a non-zero status, nothing chosen. */
static void test_bad_names(void **state)
{
	struct node_fabiface fi;
	struct proto_err err;

	(void)state;
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", "nosuch0", "http://127.0.0.1:7400", &fi, &err),
			 -ENODEV);
	fprintf(stderr, "# %s\n", err.msg);
	assert_non_null(strstr(err.msg, "--fabric-iface nosuch0: no such network interface"));
	assert_null(strchr(err.msg, '\n'));
	assert_string_equal(fi.addr, "");
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", "", "http://127.0.0.1:7400", &fi, &err),
			 -ENODEV);
	/* A provider without IP addresses takes no interface name... */
	assert_int_equal(node_fabiface_pick("shm", "lo", "http://127.0.0.1:7400", &fi, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "binds no IP interface"));
	/* ...and, without one, chooses itself. */
	assert_int_equal(node_fabiface_pick("shm", NULL, "http://127.0.0.1:7400", &fi, &err), 0);
	assert_string_equal(fi.addr, "");
	/* verbs binds its RDMA interface: by name only. */
	assert_int_equal(node_fabiface_pick("verbs;ofi_rxm", NULL, "http://127.0.0.1:7400", &fi, &err),
			 0);
	assert_string_equal(fi.addr, "");
	/* A tracker not resolvable (yet), or no URL at all: the provider's
	 * choice, with a warning; the tracker client reports the host. */
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, "http://no-such-host.invalid:7400",
					    &fi, &err), 0);
	assert_string_equal(fi.addr, "");
	assert_int_equal(node_fabiface_pick("tcp;ofi_rxm", NULL, "::::", &fi, &err), 0);
	assert_string_equal(fi.addr, "");
}

/* tessera-node refuses the name before it does anything else. */
static void test_node_refuses_unknown_interface(void **state)
{
	char dir[256], bin[512];
	int rc, lines;

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	tu_bin(bin, sizeof(bin), "tessera-node");
	rc = tu_sh("%s --tracker http://127.0.0.1:9 --replica A --rank 0 --layout tp1 --model "
		   "%s/m.json --trainer-pubkey %s/t.pub --metrics off --fabric-iface nosuch0 "
		   "</dev/null >%s/out 2>%s/err",
		   bin, dir, dir, dir, dir);
	lines = tu_sh("exit $(wc -l <%s/err)", dir);
	assert_int_equal(tu_sh("cat %s/err >&2; grep -q -- '--fabric-iface nosuch0: no such network "
			       "interface' %s/err", dir, dir), 0);
	assert_int_not_equal(rc, 0);
	assert_int_equal(lines, 1);
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_route_to_loopback_tracker),
		cmocka_unit_test(test_route_to_other_interface),
		cmocka_unit_test(test_bad_names),
		cmocka_unit_test(test_node_refuses_unknown_interface),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
