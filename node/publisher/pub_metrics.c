/* The publisher's series: Prometheus names with units and _total. */
#include "node/publisher/pub_metrics.h"

#include <errno.h>

#include <event2/event.h>

#include "proto/params.h"

static const double export_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100};

static void sample(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub_metrics *pm = arg;
	bool reg = node_pub_registered(pm->pub);
	const char *fix = node_pub_needs_fix(pm->pub);

	proto_metrics_set(pm->m, pm->registered, reg);
	proto_metrics_set(pm->m, pm->pending, node_pub_pending(pm->pub));
	/* what a person must fix wins: it says what to change */
	if (fix != NULL)
		proto_metrics_set_health(pm->m, false, fix);
	else
		proto_metrics_set_health(pm->m, reg, reg ? NULL : "not registered with the tracker");
}

int node_pub_metrics_init(struct node_pub_metrics *pm, struct proto_metrics *m,
			  struct event_base *base, const struct node_pub *pub)
{
	struct node_pub_metrics t = {.m = m, .pub = pub};
	struct timeval second = {1, 0};

	*pm = (struct node_pub_metrics){.exports_ok = -1, .exports_failed = -1, .latest_version = -1,
					.exported_bytes = -1, .export_seconds = -1,
					.registered = -1, .pending = -1, .upload_readers = -1};
	if (m == NULL)
		return 0;
	t.exports_ok = proto_metrics_counter(m, "tessera_publisher_exports_total", "result=\"ok\"",
					    "Exports finished, by result.");
	t.exports_failed = proto_metrics_counter(m, "tessera_publisher_exports_total",
						"result=\"error\"", "Exports finished, by result.");
	t.latest_version = proto_metrics_gauge(m, "tessera_publisher_latest_version", NULL,
					      "Newest version published or offered.");
	t.exported_bytes = proto_metrics_counter(m, "tessera_publisher_exported_bytes_total", NULL,
						"Bytes gathered and offered for serving layouts.");
	t.export_seconds = proto_metrics_histogram(
		m, "tessera_publisher_export_seconds", NULL,
		"From the export request to published and offered, seconds.", export_bounds,
		sizeof(export_bounds) / sizeof(export_bounds[0]));
	t.registered = proto_metrics_gauge(m, "tessera_publisher_registered", NULL,
					  "1 while the publisher holds a lease at the tracker.");
	t.pending = proto_metrics_gauge(m, "tessera_publisher_pending_exports", NULL,
				       "Exports queued or running.");
	/* Reads are one-sided: the publisher sees none of them. Its swarms'
	 * readers keep the cap (node/fetch/owners.c, super-seeding), and count
	 * what they took past it (tessera_node_trainer_unowned_bytes_total). */
	t.upload_readers = proto_metrics_gauge(m, "tessera_publisher_upload_readers", NULL,
					      "Members of a parcel's swarm assigned to read it from "
					      "this publisher at once (TESSERA_PUB_UPLOAD_READERS; 0: all).");
	const int hs[] = {t.exports_ok,     t.exports_failed, t.latest_version, t.exported_bytes,
			  t.export_seconds, t.registered,     t.pending,        t.upload_readers};
	for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
		if (hs[i] < 0)
			return hs[i];
	t.tick = event_new(base, -1, EV_PERSIST, sample, pm);
	if (t.tick == NULL || event_add(t.tick, &second) != 0) {
		if (t.tick != NULL)
			event_free(t.tick);
		return -ENOMEM;
	}
	*pm = t;
	proto_metrics_set(m, t.upload_readers, proto_param(PROTO_PARAM_PUB_UPLOAD_READERS));
	proto_metrics_set_health(m, false, "not registered with the tracker yet");
	return 0;
}

void node_pub_metrics_result(struct node_pub_metrics *pm, const struct node_pub_result *r)
{
	if (r->status != 0) {
		proto_metrics_add(pm->m, pm->exports_failed, 1);
		return;
	}
	proto_metrics_add(pm->m, pm->exports_ok, 1);
	if (r->version > proto_metrics_value(pm->m, pm->latest_version))
		proto_metrics_set(pm->m, pm->latest_version, r->version);
	proto_metrics_add(pm->m, pm->exported_bytes, r->wire_bytes);
	proto_metrics_observe(pm->m, pm->export_seconds, (double)r->total_ns / 1e9);
}

void node_pub_metrics_fini(struct node_pub_metrics *pm)
{
	if (pm->tick != NULL)
		event_free(pm->tick);
	pm->tick = NULL;
}
