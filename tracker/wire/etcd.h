/* A small client of etcd's v3 API through its HTTP/JSON gateway: keys and
 * values, atomic create-if-absent, leases. Calls block (a private event
 * loop, a deadline each) and move along the list of endpoints when one
 * does not answer. Not included outside tracker/. */
#ifndef TRACKER_WIRE_ETCD_H
#define TRACKER_WIRE_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

#define TRK_ETCD_ENDPOINTS_MAX 8

struct trk_etcd;

struct trk_etcd_opts {
	/* etcd://HOST:PORT[,HOST:PORT...][/NAME], or etcds:// for TLS; NAME
	 * (default "default") keeps several clusters apart in one etcd. */
	const char *url;
	const char *ca;   /* etcds://: the CA of etcd's certificates (else the system's) */
	const char *cert; /* etcds://: a client certificate, with key */
	const char *key;
	unsigned timeout_ms; /* per call and endpoint; 0: 2000 */
};

/* Parses o->url and makes the TLS context; nothing is sent. 0 or a
 * negative errno with err set (one line naming what to fix). */
int trk_etcd_new(const struct trk_etcd_opts *o, struct trk_etcd **out, struct proto_err *err);
void trk_etcd_free(struct trk_etcd *e);
/* The url without credentials, for logs: "etcd://h:p,h:p/NAME". */
const char *trk_etcd_url(const struct trk_etcd *e);

/*
 * Keys are relative to the store's prefix ("/tessera/NAME/"). Every call
 * returns 0, -ENOENT (get: no such key), -EEXIST (create: the key exists)
 * or another negative errno with err set (-EIO: no endpoint answered in
 * time; -EPROTO: an answer that is not etcd's).
 */
/* *val (malloc'ed, NUL past len) and *len; cap bounds the value. */
int trk_etcd_get(struct trk_etcd *e, const char *key, size_t cap, uint8_t **val, size_t *len,
		 struct proto_err *err);
/* The lease key is attached to (0: none); -ENOENT when key is absent. */
int trk_etcd_lease_of(struct trk_etcd *e, const char *key, int64_t *lease, struct proto_err *err);
/* Puts key = val, attached to lease (0: none). */
int trk_etcd_put(struct trk_etcd *e, const char *key, const void *val, size_t len,
		 int64_t lease, struct proto_err *err);
/* A put under conditions, in one transaction: */
struct trk_etcd_if {
	bool absent;            /* key does not exist yet (else -EEXIST) */
	const char *fence_key;  /* and fence_key is held under fence_lease (else */
	int64_t fence_lease;    /* -EPERM: another holds it; NULL: no fence) */
	uint8_t **cur;          /* -EEXIST: key's present value (malloc'ed) here */
	size_t *curlen;
};
int trk_etcd_put_if(struct trk_etcd *e, const char *key, const void *val, size_t len,
		    int64_t lease, const struct trk_etcd_if *cond, struct proto_err *err);
/* Deletes key (absent is fine). */
int trk_etcd_delete(struct trk_etcd *e, const char *key, struct proto_err *err);
/* Calls fn with every key (relative, NUL-terminated) under prefix, in
 * key order; a non-zero return from fn stops the walk and is returned. */
int trk_etcd_keys(struct trk_etcd *e, const char *prefix,
		  int (*fn)(const char *key, void *arg), void *arg, struct proto_err *err);
/* A lease of ttl_s seconds: *id. */
int trk_etcd_lease_grant(struct trk_etcd *e, unsigned ttl_s, int64_t *id,
			 struct proto_err *err);
/* Renews lease id: 0, or -ENOENT when it has expired. */
int trk_etcd_lease_keepalive(struct trk_etcd *e, int64_t id, struct proto_err *err);
int trk_etcd_lease_revoke(struct trk_etcd *e, int64_t id, struct proto_err *err);

#endif
