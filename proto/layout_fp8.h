/* FP8 serving layouts, between proto/layout.c and proto/layout_fp8.c only
 * (the face is in proto/spec.h). */
#ifndef PROTO_LAYOUT_FP8_H
#define PROTO_LAYOUT_FP8_H

#include <jansson.h>

#include "proto/spec.h"

/* Sets l->nbase; when root asks for a transform, makes l->model (the
 * cluster's model m with the quantized tensors as FP8 and their scale
 * tensors appended). 0, or -EINVAL / -ENOMEM naming what in err. */
int proto__layout_fp8_model(const struct proto_model *m, json_t *root, const char *what,
			    struct proto_layout *l, struct proto_err *err);
/* Once the ranks' locals are placed (not finished): refuses splits that cut
 * a block and places each quantized local's scale local after it. */
int proto__layout_fp8_scales(struct proto_layout *l, const char *what, struct proto_err *err);
/* The names of the quantized tensors, in model order (new reference). */
json_t *proto__layout_fp8_json(const struct proto_layout *l);

#endif
