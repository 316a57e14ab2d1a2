/* libFuzzer target: the index of a sharded Hugging Face checkpoint
 * (model.safetensors.index.json, proto/checkpoint.c), opened with
 * proto_ckpt_open in a directory beside two fixed shards: one holds a and
 * b, the other c. What opens has every tensor of the shards the index
 * names, once, each in its shard, and reads back. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/checkpoint.h"
#include "proto/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fzk_dir[512];

static void fzk_path(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", fzk_dir, name);
}

static void fzk_cleanup(void)
{
	static const char *const names[] = {PROTO_CKPT_INDEX, "model-00001-of-00002.safetensors",
					    "model-00002-of-00002.safetensors"};
	char p[1024];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		fzk_path(p, sizeof(p), names[i]);
		unlink(p);
	}
	rmdir(fzk_dir);
}

/* One shard of BF16 tensors named names[0..n), shapes [4] each. */
static void fzk_shard(const char *file, const char *const *names, uint32_t n)
{
	static const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	const void *data[4] = {bytes, bytes, bytes, bytes};
	struct proto_model m;
	uint64_t shape[1] = {4};
	char p[1024];

	proto_model_init(&m);
	for (uint32_t i = 0; i < n; i++)
		if (proto_model_add(&m, names[i], PROTO_DT_BF16, 1, shape, NULL) != 0)
			abort();
	fzk_path(p, sizeof(p), file);
	if (proto_model_finish(&m, NULL) != 0 || proto_st_write(p, &m, NULL, data, NULL) != 0)
		abort();
	proto_model_fini(&m);
}

static void fzk_setup(void)
{
	static const char *const one[] = {"a", "b"}, *const two[] = {"c"};
	const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";

	snprintf(fzk_dir, sizeof(fzk_dir), "%s/tessera-fuzz-ckpt-XXXXXX", tmp);
	if (mkdtemp(fzk_dir) == NULL)
		abort();
	atexit(fzk_cleanup);
	proto_log_setup("fuzz", PROTO_LOG_ERR);
	fzk_shard("model-00001-of-00002.safetensors", one, 2);
	fzk_shard("model-00002-of-00002.safetensors", two, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_ckpt ck;
	struct proto_err err;
	char p[1024];
	FILE *f;

	if (fzk_dir[0] == 0)
		fzk_setup();
	if (size > (64u << 10))
		return 0; /* the cap itself is TESSERA_SPEC_MAX, tested by the corpus */
	fzk_path(p, sizeof(p), PROTO_CKPT_INDEX);
	f = fopen(p, "w");
	if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		abort();
	if (proto_ckpt_open(fzk_dir, &ck, &err) != 0) {
		if (err.msg[0] == 0 || strchr(err.msg, '\n') != NULL)
			abort(); /* a refusal says why in one line */
		if (ck.nshards != 0 || ck.shards != NULL || ck.model.ntensors != 0)
			abort(); /* and leaves nothing behind */
		return 0;
	}
	/* The shards the index names (one or both), every tensor of each. */
	if (ck.nshards < 1 || ck.nshards > 2 ||
	    ck.model.ntensors != (ck.nshards == 2 ? 3u : ck.shards[0].model.ntensors))
		abort();
	for (uint32_t t = 0; t < ck.model.ntensors; t++) {
		uint8_t b[8];
		if (ck.shard_of[t] >= ck.nshards ||
		    proto_model_find(&ck.shards[ck.shard_of[t]].model, ck.model.tensors[t].name) < 0 ||
		    proto_ckpt_read(&ck, t, 0, sizeof(b), b, &err) != 0 || b[7] != 8)
			abort();
	}
	proto_ckpt_fini(&ck);
	return 0;
}
