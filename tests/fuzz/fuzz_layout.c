/* libFuzzer target: the layout parser (explicit and shorthand JSON, FP8
 * transforms too) against a small fixed model, then completeness and
 * planning on what it accepts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto/plan.h"
#include "proto/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char model_json[] =
	"{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]},"
	"{\"name\":\"q\",\"dtype\":\"bf16\",\"shape\":[8,6]},"
	"{\"name\":\"k\",\"dtype\":\"bf16\",\"shape\":[4,6]},"
	"{\"name\":\"e\",\"dtype\":\"fp32\",\"shape\":[8,4,6]},"
	"{\"name\":\"n\",\"dtype\":\"fp32\",\"shape\":[16]}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct proto_model m;
	static struct proto_layout whole;
	static int ready;
	struct proto_layout l;
	struct proto_plan p;
	struct proto_err err;

	if (!ready) {
		if (proto_model_parse(model_json, strlen(model_json), "model", &m, &err) != 0 ||
		    proto_layout_builtin(&m, "tp1", &whole, &err) != 0)
			abort();
		ready = 1;
	}
	if (size > 4096) /* bound the work: rank counts come from the input */
		return 0;
	if (proto_layout_parse(&m, (const char *)data, size, "fuzz", &l, &err) != 0)
		return 0;
	if (l.nranks <= 64) {
		if (proto_plan_build(&m, &l, &whole, &p, &err) == 0)
			proto_plan_fini(&p);
		/* An FP8 layout is planned from its quantized source; its
		 * explicit form (transform and quantize, scales left out)
		 * parses back to the same layout. */
		struct proto_layout src = {0}, back;
		if (proto_layout_transformed(&l)) {
			json_t *j = proto_layout_to_json(&m, &l);
			if (j == NULL || proto_layout_from_json(&m, j, "back", &back, &err) != 0 ||
			    memcmp(back.digest, l.digest, sizeof(l.digest)) != 0)
				abort();
			json_decref(j);
			proto_layout_fini(&back);
			if (proto_layout_fp8_source(&m, &l, &src, &err) != 0)
				abort();
		}
		if (proto_layout_check_complete(&m, &l, &err) == 0 &&
		    proto_plan_build(&m, src.nranks ? &src : &whole, &l, &p, &err) == 0) {
			/* Mapped delivery: a destination receives what it keeps. */
			if (p.mapped_bytes != p.retained_bytes)
				abort();
			proto_plan_fini(&p);
		}
		proto_layout_fini(&src);
	}
	proto_layout_fini(&l);
	return 0;
}
