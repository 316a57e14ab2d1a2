/* Helpers for tests that run tessera's real programs: the model spec a node
 * takes, and a tracker started on a free loopback port. Test-only. */
#ifndef TESTS_TESTCLUSTER_H
#define TESTS_TESTCLUSTER_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/proc.h"
#include "proto/proto.h"
#include "tests/testutil.h"

/* Writes m as the model spec JSON that `tessera-node --model` reads. */
static inline void tu_write_model(const struct proto_model *m, const char *path)
{
	struct proto_err err;
	json_t *j = proto_model_to_json(m);
	char *txt = json_dumps(j, 0);

	assert_int_equal(proto_write_file_atomic(path, txt, strlen(txt), 0644, &err), 0);
	free(txt);
	json_decref(j);
}

/* The JSON document in path (a report, an activation record); NULL when it
 * cannot be read or parsed. The caller json_decref()s it. */
static inline json_t *tu_load_json(const char *path)
{
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	if (proto_read_file(path, 1 << 20, &buf, &len, &err) != 0)
		return NULL;
	json_t *j = json_loadb((char *)buf, len, 0, NULL);
	free(buf);
	return j;
}

/* Starts tessera-tracker on 127.0.0.1:0 with its state in state_dir and its
 * log in dir/tracker.log, pinning the trainer key pub (NULL: the first
 * signer is pinned), and writes its URL into url. */
static inline void tu_start_tracker(struct node_proc *p, const char *dir, const char *state_dir,
				    const char *pub, char *url, size_t url_len)
{
	char bin[512], log[512], line[256];
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(log, sizeof(log), "%s/tracker.log", dir);
	char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state", (char *)state_dir,
			pub ? "--trainer-pubkey" : NULL, (char *)pub, NULL};
	assert_int_equal(node_proc_spawn(p, "tracker", argv, log), 0);
	assert_int_equal(node_proc_wait_line(p, "listening on ", line, sizeof(line), 10000), 0);
	snprintf(url, url_len, "%s", line);
}

#endif
