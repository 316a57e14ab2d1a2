/* A fabric request a test waits for (test-only). */
#ifndef TESTS_FABTEST_H
#define TESTS_FABTEST_H

#include "fabric/fab.h"
#include "proto/util.h"

/* Its op, how many times it completed and with what status last. */
struct tu_fab_req {
	struct fab_op op;
	int done, status;
};

static inline void tu_fab_req_cb(struct fab_op *op, int status)
{
	struct tu_fab_req *r = proto_container_of(op, struct tu_fab_req, op);

	r->done++;
	r->status = status;
}

#endif
