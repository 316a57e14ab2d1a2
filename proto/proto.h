/* proto: the face other directories include. Specs, plans, manifests,
 * codecs and shared helpers; knows nothing of fabric, node or tracker. */
#ifndef PROTO_PROTO_H
#define PROTO_PROTO_H

#include "proto/cli.h"
#include "proto/have.h"
#include "proto/log.h"
#include "proto/addendum.h"
#include "proto/manifest.h"
#include "proto/optval.h"
#include "proto/params.h"
#include "proto/plan.h"
#include "proto/spec.h"
#include "proto/util.h"
#include "proto/xmap.h"

#endif
