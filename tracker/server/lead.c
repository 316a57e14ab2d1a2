/* Several trackers on one etcd store: one leads, the others stand by and
 * take over when its lease ends. */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"
#include "tracker/wire/etcd.h"

/*
 * Each tracker holds an etcd lease of ttl seconds, renewed every ttl/3.
 * The one that creates the key "leader" (its URL, attached to its lease)
 * leads: it takes every request and runs the sweeps. The others answer
 * every request but /metrics with 503 and X-Tessera-Standby: <leader URL>
 * (clients with a list of trackers move on to the next), and /healthz
 * with 503 "standby" (not ready, so a Service or load balancer sends
 * nothing there). A standby reads the key every ttl/10: when the leader's
 * lease ends (it died, or lost etcd), the key goes with it and the first
 * standby to create it leads, within about a lease of the leader's death
 * (on_tick). It loads the chain from the store again before it answers
 * anything; soft state (node leases, offers, who holds what) starts empty
 * and fills from the heartbeats and offers that come.
 *
 * A leader that finds its lease gone, the key gone or another's, or cannot
 * renew for 2/3 of a ttl, may have been succeeded: it stops (exit status
 * 3) rather than answer beside the new leader; its supervisor starts it
 * again, as a standby. Writes
 * are fenced besides: every write of the leader is an etcd transaction
 * that holds only while the key "leader" is held under its lease, so a
 * leader that was frozen past its lease and wakes up has every write
 * refused (503) until it notices and stops; and a version is created,
 * never overwritten.
 */

struct trk_lead {
	struct trk_server *s;
	struct trk_etcd *e; /* the store's */
	struct event *tick;
	unsigned ttl_s;
	int64_t lease;
	uint64_t renewed_ns;     /* when the last renewal etcd answered was sent */
	uint64_t renew_tried_ns; /* the last renewal tried */
	int64_t seen_lease;      /* the leader key's lease when a standby last looked */
	bool said_no_lease;      /* a leader key without a lease, said once */
};

/* Loads the chain again from the store (taking over: the leader that was
 * may have added versions since this tracker started). */
static int reload(struct trk_server *s, struct proto_err *err)
{
	struct trk_versions *vs = NULL;
	struct trk_addenda *ad = NULL, *old_ad = s->ad;
	struct trk_versions *old_vs = s->vs;
	int rc;

	if ((rc = trk__versions_open(s->st, s->trainer_pk_set ? s->trainer_pk : NULL, &vs,
				     err)) != 0)
		return rc;
	s->vs = vs;
	if ((rc = trk__addenda_open(s, &ad, err)) != 0) {
		s->vs = old_vs;
		trk__versions_free(vs);
		return rc;
	}
	if (strcmp(trk__versions_cluster(vs), trk__versions_cluster(old_vs)) != 0) {
		s->vs = old_vs;
		trk__versions_free(vs);
		trk__addenda_free(ad);
		return proto_errf(err, EINVAL, "the store's cluster id changed to %s",
				  trk__versions_cluster(vs));
	}
	s->ad = ad;
	trk__versions_free(old_vs);
	trk__addenda_free(old_ad);
	return 0;
}

void trk__lead_stop(struct trk_server *s, const char *why)
{
	LOG_ERR("%s: stopping (restart me: I come back as a standby)", why);
	s->exit_code = 3;
	event_base_loopbreak(s->base);
}

static void stop(struct trk_lead *l, const char *why)
{
	trk__lead_stop(l->s, why);
}

/* A standby's try: create the key, or learn who leads. */
static int campaign(struct trk_lead *l, struct proto_err *err)
{
	uint8_t *cur = NULL;
	size_t len = 0;
	int rc;

	struct trk_etcd_if only_new = {.absent = true, .cur = &cur, .curlen = &len};
	rc = trk_etcd_put_if(l->e, "leader", l->s->url, strlen(l->s->url), l->lease, &only_new,
			     err);
	if (rc == -EEXIST) {
		int64_t held = 0;
		l->s->standby = true;
		if (!l->said_no_lease && trk_etcd_lease_of(l->e, "leader", &held, NULL) == 0 &&
		    held == 0) {
			l->said_no_lease = true;
			LOG_WARN("the leader key of %s has no lease (put by hand?): no tracker can "
				 "take the lead until it is deleted", trk_etcd_url(l->e));
		}
		if (cur != NULL && strcmp((char *)cur, l->s->leader) != 0) {
			snprintf(l->s->leader, sizeof(l->s->leader), "%s", (char *)cur);
			LOG_NOTE("standing by: %s leads (on %s)", l->s->leader, trk_etcd_url(l->e));
		}
		free(cur);
		return 0;
	}
	if (rc != 0)
		return rc;
	if (l->s->standby) {
		uint64_t t0 = proto_now_ns();
		if ((rc = reload(l->s, err)) != 0) {
			trk_etcd_delete(l->e, "leader", NULL);
			return rc;
		}
		l->s->standby = false;
		l->s->lead_since_ms = proto_wall_ms();
		trk__store_fence(l->s->st, "leader", l->lease);
		LOG_NOTE("leading now (after %s): %zu versions, the latest %llu, loaded in %.0f ms",
			 l->s->leader[0] ? l->s->leader : "no leader", trk__versions_count(l->s->vs),
			 (unsigned long long)trk__versions_latest(l->s->vs),
			 (double)(proto_now_ns() - t0) / 1e6);
	}
	snprintf(l->s->leader, sizeof(l->s->leader), "%s", l->s->url);
	return 0;
}

/* Whether the key "leader" is still held by our lease (deleted by hand, or
 * taken after a lapse we did not see): 1 yes, 0 no, <0 unknown (etcd). */
static int still_mine(struct trk_lead *l, struct proto_err *err)
{
	int64_t held = 0;
	int rc = trk_etcd_lease_of(l->e, "leader", &held, err);

	if (rc == -ENOENT)
		return 0;
	return rc < 0 ? rc : held == l->lease;
}

/* Renews the lease (every ttl/3): false when the tracker stops, or etcd
 * did not answer. */
static bool renew(struct trk_lead *l)
{
	struct proto_err err = {{0}};
	/* The lease runs from when etcd got the renewal: from before it was
	 * sent, as far as this tracker can tell. */
	uint64_t sent = proto_now_ns();
	int rc = trk_etcd_lease_keepalive(l->e, l->lease, &err);

	if (rc == 0) {
		l->renewed_ns = sent;
		if (!l->s->standby && still_mine(l, &err) == 0) {
			stop(l, "the leader key is no longer mine (deleted, or taken)");
			return false;
		}
	} else if (rc == -ENOENT) {
		if (!l->s->standby) {
			stop(l, "my leader lease has ended");
			return false;
		}
		/* A standby's lease ended (etcd was away): a new one. */
		if (trk_etcd_lease_grant(l->e, l->ttl_s, &l->lease, &err) != 0) {
			LOG_WARN("standby: no new lease: %s", err.msg);
			return false;
		}
		l->renewed_ns = proto_now_ns();
	} else if (proto_now_ns() - l->renewed_ns > (uint64_t)l->ttl_s * 2000000000u / 3) {
		/* A leader steps down before its lease can have ended (the next
		 * tick would come past it): no moment with two leaders. */
		if (!l->s->standby) {
			stop(l, "cannot renew my leader lease: stopping before it can end");
			return false;
		}
		LOG_WARN("standby: %s", err.msg);
		return false;
	} else {
		LOG_WARN("%s: renewing the lease: %s", l->s->standby ? "standby" : "leader",
			 err.msg);
		return false;
	}
	return true;
}

/* Every ttl/10: the lease renewed when a third of it has gone by; a
 * standby reads the leader key (a linearizable read, no raft entry) and
 * tries for it when it is gone or another's lease holds it now. The lease
 * ends in etcd at most ttl after the leader's last renewal, so a standby
 * leads within about ttl + ttl/10 (plus etcd's own expiry sweep, 0.5 s)
 * of the kill. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct trk_lead *l = arg;
	struct proto_err err = {{0}};
	uint64_t now = proto_now_ns();
	int64_t held = 0;
	int rc;

	if (now - l->renew_tried_ns >= (uint64_t)l->ttl_s * 1000000000u / 3) {
		l->renew_tried_ns = now;
		if (!renew(l))
			return;
	}
	if (!l->s->standby)
		return;
	rc = trk_etcd_lease_of(l->e, "leader", &held, &err);
	if ((rc == 0 && held == l->seen_lease) || (rc != 0 && rc != -ENOENT))
		return; /* the same leader; or etcd away (the renewal says so) */
	l->seen_lease = rc == 0 ? held : 0;
	if (campaign(l, &err) != 0)
		LOG_WARN("standby: cannot take the lead: %s", err.msg);
}

int trk__lead_new(struct trk_server *s, unsigned ttl_s, struct trk_lead **out,
		  struct proto_err *err)
{
	struct trk_lead *l = calloc(1, sizeof(*l));
	uint64_t every_ms = PROTO_MAX(ttl_s * 1000u / 10, 100);
	struct timeval tv = {(time_t)(every_ms / 1000), (suseconds_t)(every_ms % 1000) * 1000};
	int rc;

	*out = NULL;
	if (l == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	l->s = s;
	l->e = trk__store_etcd(s->st);
	l->ttl_s = ttl_s;
	if ((rc = trk_etcd_lease_grant(l->e, ttl_s, &l->lease, err)) != 0)
		goto fail;
	l->renewed_ns = l->renew_tried_ns = proto_now_ns();
	if ((rc = campaign(l, err)) != 0)
		goto fail;
	if (!s->standby)
		trk__store_fence(s->st, "leader", l->lease);
	if (!s->standby)
		LOG_NOTE("leading the trackers of %s", trk_etcd_url(l->e));
	l->tick = event_new(s->base, -1, EV_PERSIST, on_tick, l);
	if (l->tick == NULL || event_add(l->tick, &tv) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	*out = l;
	return 0;
fail:
	trk__lead_free(l);
	return rc;
}

void trk__lead_free(struct trk_lead *l)
{
	if (l == NULL)
		return;
	if (l->tick != NULL)
		event_free(l->tick);
	/* Stepping down at a clean stop: a standby takes over at once, not a
	 * lease later. */
	if (l->lease != 0)
		trk_etcd_lease_revoke(l->e, l->lease, NULL);
	free(l);
}
