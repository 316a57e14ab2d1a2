/* What `tessera publish` measures, as series of proto/metrics.h: exports by
 * result, the newest version, bytes and seconds per export, the lease. */
#ifndef NODE_PUB_METRICS_H
#define NODE_PUB_METRICS_H

#include "proto/metrics.h"
#include "node/publisher/publisher.h"

struct event_base;

struct node_pub_metrics {
	struct proto_metrics *m; /* NULL: nothing is measured */
	const struct node_pub *pub;
	struct event *tick;
	int exports_ok, exports_failed, latest_version, exported_bytes, export_seconds;
	int registered, pending, upload_readers;
};

/* Registers the series in m and samples the publisher's lease and queue
 * every second on base (and /healthz: healthy while registered). m NULL:
 * nothing. Returns 0 or a negative errno (then nothing is measured). */
int node_pub_metrics_init(struct node_pub_metrics *pm, struct proto_metrics *m,
			  struct event_base *base, const struct node_pub *pub);
/* Counts one export's result. */
void node_pub_metrics_result(struct node_pub_metrics *pm, const struct node_pub_result *r);
/* Stops the sampling timer. Safe on a zeroed or failed struct. */
void node_pub_metrics_fini(struct node_pub_metrics *pm);

#endif
