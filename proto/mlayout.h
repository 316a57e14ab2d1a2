/* One serving layout's block of a manifest (its digests and parcels with
 * their chunk lists), encoded and decoded on its own: what a manifest
 * addendum (proto/addendum.h) carries. Implemented in proto/manifest.c, so
 * that both use one encoding and one set of rules. For proto/ only. */
#ifndef PROTO_MLAYOUT_H
#define PROTO_MLAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/manifest.h"

/* Bytes l takes encoded. Cannot fail. */
uint64_t proto__mlayout_size(const struct proto_mlayout *l);
/* Encodes l at p (proto__mlayout_size bytes); returns the end. */
uint8_t *proto__mlayout_put(uint8_t *p, const struct proto_mlayout *l);
/* Decodes one layout block from hostile bytes (counts capped by what
 * remains before anything is allocated); *used gets the bytes read. On
 * failure (-EBADMSG truncated, -ENOMEM) *out is empty and err says why. */
int proto__mlayout_get(const uint8_t *buf, size_t len, size_t *used,
		       struct proto_mlayout *out, struct proto_err *err);
/* The manifest's rules for one layout (sorted parcels, encodings allowed by
 * kind, chunk lists that match wire_bytes at chunk_size). 0 or -EBADMSG. */
int proto__mlayout_check(const struct proto_mlayout *l, uint8_t kind,
			 uint32_t chunk_size, struct proto_err *err);
/* Frees l's parcels and zeroes it; cannot fail. */
void proto__mlayout_fini(struct proto_mlayout *l);

#endif
