/* The publisher's trainer source: one shared buffer per trainer rank that the trainer fills. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int node__pub_trainer_model(struct node_pub *p, const char *path, struct proto_err *err)
{
	int rc = proto_model_load(path, &p->model, err);

	if (rc != 0)
		return rc;
	p->have_model = true;
	p->trainer = true;
	return 0;
}

/*
 * The buffer is a memfd sealed against shrinking and growing: a trainer
 * that holds it can write its bytes but cannot truncate it under the
 * snapshot's reads (which would kill the publisher with SIGBUS).
 */
static int buffer_open(struct node_pub *p, uint32_t r, struct proto_err *err)
{
	uint64_t n = p->tl.ranks[r].nbytes;
	char name[64];
	int fd;

	snprintf(name, sizeof(name), "tessera-trainer-rank%u", r);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return proto_errf(err, errno, "memfd_create: %s", strerror(errno));
	p->tr_fd[r] = fd;
	if (ftruncate(fd, (off_t)n) != 0)
		return proto_errf(err, errno, "trainer rank %u: cannot size its %llu-byte buffer: %s",
				  r, (unsigned long long)n, strerror(errno));
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
		return proto_errf(err, errno, "trainer rank %u: cannot seal its buffer: %s", r,
				  strerror(errno));
	if (n == 0)
		return 0;
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return proto_errf(err, errno, "trainer rank %u: cannot map its %llu-byte buffer: %s",
				  r, (unsigned long long)n, strerror(errno));
	p->tr_map[r] = m;
	return 0;
}

int node__pub_trainer_open(struct node_pub *p, struct proto_err *err)
{
	uint32_t nr = p->tl.nranks;
	int rc;

	p->tr_fd = malloc(nr * sizeof(*p->tr_fd));
	p->tr_map = calloc(nr, sizeof(*p->tr_map));
	if (p->tr_fd == NULL || p->tr_map == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t r = 0; r < nr; r++)
		p->tr_fd[r] = -1;
	for (uint32_t r = 0; r < nr; r++)
		if ((rc = buffer_open(p, r, err)) != 0)
			return rc;
	return 0;
}

void node__pub_trainer_free(struct node_pub *p)
{
	for (uint32_t r = 0; p->have_tl && r < p->tl.nranks; r++) {
		if (p->tr_map != NULL && p->tr_map[r] != NULL)
			munmap(p->tr_map[r], p->tl.ranks[r].nbytes);
		if (p->tr_fd != NULL && p->tr_fd[r] >= 0)
			close(p->tr_fd[r]);
	}
	free(p->tr_map);
	free(p->tr_fd);
	p->tr_map = NULL;
	p->tr_fd = NULL;
}

int node_pub_trainer_buffer(const struct node_pub *p, uint32_t rank, int *fd, uint64_t *bytes)
{
	if (!p->trainer || p->tr_fd == NULL)
		return -ENOENT;
	if (rank >= p->tl.nranks)
		return -ERANGE;
	*fd = p->tr_fd[rank];
	*bytes = p->tl.ranks[rank].nbytes;
	return 0;
}

bool node_pub_trainer_source(const struct node_pub *p)
{
	return p->trainer;
}

const struct proto_layout *node_pub_trainer_layout(const struct node_pub *p)
{
	return &p->tl;
}

const struct proto_model *node_pub_model(const struct node_pub *p)
{
	return &p->model;
}
