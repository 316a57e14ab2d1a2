/* Test helper: writes Hugging Face style checkpoints (sharded or not) of a
 * model whose tensor bytes the caller gives. Header-only; include after
 * proto/proto.h, proto/safetensors.h and cmocka. */
#ifndef TESTS_CKPT_UTIL_H
#define TESTS_CKPT_UTIL_H

#include <jansson.h>
#include <stdio.h>
#include <sys/stat.h>

/*
 * Writes dir/model-0000K-of-0000N.safetensors (N = nshards, tensors split in
 * model order into N runs of about equal count, the longer first) and
 * dir/model.safetensors.index.json; with nshards 0, one dir/model.safetensors
 * and no index. data[t] holds tensor t's bytes. dir is created if missing.
 */
static inline void tu_write_hf_checkpoint(const char *dir, const struct proto_model *m,
					  uint32_t nshards, const void *const *data)
{
	struct proto_err err = {{0}};
	char path[1024], name[64];
	json_t *map = json_object();
	uint64_t total = 0;

	mkdir(dir, 0755);
	if (nshards == 0) {
		snprintf(path, sizeof(path), "%s/model.safetensors", dir);
		if (proto_st_write(path, m, NULL, data, &err) != 0)
			fail_msg("%s", err.msg);
		json_decref(map);
		return;
	}
	for (uint32_t k = 0; k < nshards; k++) {
		uint32_t lo = (uint32_t)(((uint64_t)m->ntensors * k + nshards - 1) / nshards);
		uint32_t hi = (uint32_t)(((uint64_t)m->ntensors * (k + 1) + nshards - 1) / nshards);
		struct proto_model sm;
		proto_model_init(&sm);
		snprintf(name, sizeof(name), "model-%05u-of-%05u.safetensors", k + 1, nshards);
		for (uint32_t t = lo; t < hi; t++) {
			const struct proto_tensor *x = &m->tensors[t];
			assert_int_equal(proto_model_add(&sm, x->name, x->dtype, x->ndim, x->shape, &err), 0);
			json_object_set_new(map, x->name, json_string(name));
			total += x->nbytes;
		}
		assert_int_equal(proto_model_finish(&sm, &err), 0);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if (proto_st_write(path, &sm, NULL, data + lo, &err) != 0)
			fail_msg("%s", err.msg);
		proto_model_fini(&sm);
	}
	json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total,
				"weight_map", map);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	assert_int_equal(json_dump_file(idx, path, JSON_INDENT(2)), 0);
	json_decref(idx);
}

#endif
