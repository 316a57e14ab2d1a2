/* `tessera cluster`: checks that what each replica serves is the version:
 * every rank's bytes through the memfd its node exposes, and the canary
 * score a probe reads through the attach socket as an engine would. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "node/cli/cluster.h"
#include "node/cli/probe.h"
#include "node/serve/expose.h"
#include "proto/proto.h"

bool node__cluster_check_rank(struct cluster *c, struct cluster_replica *r, uint32_t rank,
			      uint64_t v, const uint8_t *expect, size_t len)
{
	char path[4200];
	struct proto_err err;
	json_t *j;
	bool ok = false;

	node__cluster_expose_path(c, r, rank, path, sizeof(path));
	if (node_expose_read(path, &j, &err) != 0) {
		fprintf(stderr, "cluster: replica %s rank %u: %s\n", r->name, rank, err.msg);
		return false;
	}
	const char *memfd = json_string_value(json_object_get(j, "memfd_path"));
	uint64_t jv = (uint64_t)json_integer_value(json_object_get(j, "version"));
	uint64_t size = (uint64_t)json_integer_value(json_object_get(j, "size"));
	if (memfd == NULL || jv != v || size != len) {
		fprintf(stderr, "cluster: replica %s rank %u exposes v%" PRIu64 " (%" PRIu64
				" bytes), want v%" PRIu64 " (%zu bytes)\n",
			r->name, rank, jv, size, v, len);
		goto out;
	}
	int fd = open(memfd, O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "cluster: replica %s rank %u: %s: %s\n", r->name, rank, memfd,
			strerror(errno));
		goto out;
	}
	void *m = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (m == MAP_FAILED)
		goto out;
	ok = len == 0 || memcmp(m, expect, len) == 0;
	if (!ok)
		fprintf(stderr, "cluster: replica %s rank %u: bytes differ from v%" PRIu64 "\n", r->name,
			rank, v);
	if (len)
		munmap(m, len);
out:
	json_decref(j);
	return ok;
}

bool node__cluster_check_digests(struct cluster *c, uint64_t v)
{
	bool all = true;

	for (uint32_t i = 0; i < c->nreps; i++)
		c->reps[i].digest_ok = true;
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		bool seen = false;
		for (uint32_t j = 0; j < i && !seen; j++)
			seen = c->reps[j].started > 0 &&
			       memcmp(c->reps[j].layout.digest, r->layout.digest, PROTO_HASH_BYTES) == 0;
		if (seen || r->started == 0) /* a late replica not started yet */
			continue; /* checked with the first replica of its layout */
		for (uint32_t k = 0; k < r->layout.nranks; k++) {
			size_t len = r->layout.ranks[k].nbytes;
			uint8_t *expect = malloc(len + 1);
			struct proto_err err;
			bool have = expect != NULL &&
				    node__cluster_expected_block(c, &r->layout, k, v, expect, &err) == 0;
			if (!have)
				fprintf(stderr, "cluster: %s\n", expect ? err.msg : "out of memory");
			for (uint32_t j = i; j < c->nreps; j++) {
				struct cluster_replica *o = &c->reps[j];
				if (o->started == 0 ||
				    memcmp(o->layout.digest, r->layout.digest, PROTO_HASH_BYTES) != 0)
					continue;
				if (!have || !node__cluster_check_rank(c, o, k, v, expect, len))
					o->digest_ok = false;
			}
			free(expect);
		}
	}
	for (uint32_t i = 0; i < c->nreps; i++)
		all &= c->reps[i].digest_ok || c->reps[i].started == 0;
	return all;
}

/* The publisher posts its scores right after publishing v, long before a
 * replica activates; a verdict still missing is asked for again for a few
 * seconds. */
void node__cluster_probe_replica(struct cluster *c, struct cluster_replica *r, uint64_t v)
{
	struct proto_err err;
	char sock[4200];

	r->canary_ok = 1;
	for (uint32_t k = 0; k < r->layout.nranks && r->canary_ok != 0; k++) {
		struct node_probe pr;
		int rc = -1;
		node__cluster_attach_path(c, r, k, sock, sizeof(sock));
		for (int tries = 0; tries < 50 && !node__cluster_stop_signal; tries++) {
			rc = node_probe_read(sock, r->name, k, v, 10000, &pr, &err);
			if (rc == 0)
				rc = node_probe_report(c->trk, r->name, k, &pr, &err);
			if (rc != 0 || pr.ok >= 0)
				break;
			usleep(100000);
		}
		if (rc != 0) {
			fprintf(stderr, "cluster: canary of %s/%u: %s\n", r->name, k, err.msg);
			r->canary_ok = -1;
			continue;
		}
		if (pr.version != v)
			fprintf(stderr, "cluster: canary of %s/%u read v%" PRIu64 ", not v%" PRIu64 "\n",
				r->name, k, pr.version, v);
		if (pr.ok == 0 || pr.version != v)
			r->canary_ok = 0;
		else if (pr.ok < 0 && r->canary_ok == 1)
			r->canary_ok = -1;
	}
}
