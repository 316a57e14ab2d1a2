/* node/agent/poke.c: a replica's ranks on one host wake each other. A
 * poke for the version a rank holds verified makes it ask the tracker; one
 * for another version, one that is not 8 bytes, or one while it is not
 * waiting does not; another replica's (or tracker's) ranks are not reached;
 * a second rank of the same name polls (no socket) until the first lets the
 * name go, then binds it and is woken. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/socket.h>
#include <sys/un.h>

#include "node/agent/internal.h"
#include "tests/testutil.h"

struct rank {
	struct node_agent a;
	struct agent_version v;
};

static void rank_init(struct rank *r, struct event_base *base, const char *url,
		      const char *replica, uint32_t rank)
{
	memset(r, 0, sizeof(*r));
	r->a.base = base;
	r->a.o.tracker_url = url;
	r->a.o.replica = replica;
	r->a.o.rank = rank;
	r->a.layout.nranks = 2;
	snprintf(r->a.node_id, sizeof(r->a.node_id), "%s/%u", replica, rank);
	r->v.version = 5;
	agent_poke_open(&r->a);
}

/* Runs the loop until nothing is ready (the datagrams are local: sent
 * before this, they are queued already). */
static void drain(struct event_base *base)
{
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_loop(base, EVLOOP_NONBLOCK);
}

static void test_poke(void **state)
{
	struct event_base *base = event_base_new();
	struct rank r0, r1, other, twin;

	assert_non_null(base);
	rank_init(&r0, base, "http://127.0.0.1:1", "A", 0);
	rank_init(&r1, base, "http://127.0.0.1:1", "A", 1);
	rank_init(&other, base, "http://127.0.0.1:2", "A", 1); /* another cluster's */
	rank_init(&twin, base, "http://127.0.0.1:1", "A", 1);  /* the name is taken */
	assert_non_null(r0.a.poke_ev);
	assert_non_null(r1.a.poke_ev);
	assert_non_null(other.a.poke_ev);
	assert_null(twin.a.poke_ev);

	/* Not waiting (no fetch, then not verified): nothing. */
	agent_poke_siblings(&r0.a, 5);
	drain(base);
	r1.a.ver = &r1.v;
	agent_poke_siblings(&r0.a, 5);
	drain(base);
	assert_int_equal(r1.a.poke_asks, 0);

	/* Verified v5 and waiting: a poke for v5 asks, one for v4 does not. */
	r1.v.stage = STAGE_VERIFIED;
	other.a.ver = &other.v;
	other.v.stage = STAGE_VERIFIED;
	agent_poke_siblings(&r0.a, 4);
	drain(base);
	assert_int_equal(r1.a.poke_asks, 0);
	agent_poke_siblings(&r0.a, 5);
	drain(base);
	assert_int_equal(r1.a.poke_asks, 1);
	assert_int_equal(other.a.poke_asks, 0);

	/* Bad datagrams from anyone on the host: ignored. */
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	assert_int_equal(getsockname(event_get_fd(r1.a.poke_ev), (struct sockaddr *)&sa, &len), 0);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	static const uint8_t bad[][12] = {{1, 2, 3}, {5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
	assert_int_equal(sendto(fd, bad[0], 3, 0, (struct sockaddr *)&sa, len), 3);
	assert_int_equal(sendto(fd, bad[1], 12, 0, (struct sockaddr *)&sa, len), 12);
	assert_int_equal(sendto(fd, bad[1], 0, 0, (struct sockaddr *)&sa, len), 0);
	close(fd);
	drain(base);
	assert_int_equal(r1.a.poke_asks, 1);

	/* A one-rank replica has no siblings: no socket, pokes do nothing. */
	struct rank solo;
	rank_init(&solo, base, "http://127.0.0.1:1", "C", 0);
	solo.a.layout.nranks = 1;
	agent_poke_close(&solo.a);
	agent_poke_open(&solo.a);
	assert_null(solo.a.poke_ev);
	agent_poke_siblings(&solo.a, 5);

	/* The rank that held the name goes away: its twin binds it on a
	 * later try (bounded wait) and is woken from then on. */
	assert_non_null(twin.a.poke_retry_ev);
	agent_poke_close(&r1.a);
	for (int i = 0; i < 3000 && twin.a.poke_ev == NULL; i++)
		event_base_loop(base, EVLOOP_ONCE);
	assert_non_null(twin.a.poke_ev);
	assert_true(twin.a.poke_tries >= 1);
	twin.a.ver = &twin.v;
	twin.v.stage = STAGE_VERIFIED;
	agent_poke_siblings(&r0.a, 5);
	drain(base);
	assert_int_equal(twin.a.poke_asks, 1);

	agent_poke_close(&r0.a);
	agent_poke_close(&other.a);
	agent_poke_close(&twin.a);
	agent_poke_close(&solo.a);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_poke),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
