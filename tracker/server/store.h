/* Where the tracker's durable state lives: a state directory (the default)
 * or an etcd cluster shared by several trackers. Both hold the same keys;
 * the version log and the addenda are written and read through this. */
#ifndef TRACKER_SERVER_STORE_H
#define TRACKER_SERVER_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

struct trk_store;
struct trk_etcd;

/*
 * Keys are relative paths of at most two parts ("cluster.id",
 * "versions/<20 digits>.manifest"): files under the state directory, or
 * etcd keys under the store's prefix. Every write is durable when it
 * returns 0 (temp-fsync-rename and the directory fsynced; a quorum of etcd
 * has it).
 */
/* dir is created if missing. */
int trk__store_open_dir(const char *dir, struct trk_store **out, struct proto_err *err);
/* Takes e, whatever the result. */
int trk__store_open_etcd(struct trk_etcd *e, struct trk_store **out, struct proto_err *err);
void trk__store_free(struct trk_store *st);
/* "state directory DIR" or "etcd://...", for messages. */
const char *trk__store_name(const struct trk_store *st);
/* The etcd client of a shared store, NULL for a directory. */
struct trk_etcd *trk__store_etcd(struct trk_store *st);

/* *buf (malloc'ed, NUL past *len) of at most cap bytes; -ENOENT when
 * absent, another negative errno with err naming the key. */
int trk__store_get(struct trk_store *st, const char *key, size_t cap, uint8_t **buf,
		   size_t *len, struct proto_err *err);
int trk__store_put(struct trk_store *st, const char *key, const void *buf, size_t len,
		   struct proto_err *err);
/* Writes key only if it does not exist: -EEXIST otherwise (in etcd, one
 * transaction: of two trackers writing the same version, one wins). */
int trk__store_create(struct trk_store *st, const char *key, const void *buf, size_t len,
		      struct proto_err *err);
/* From now on every write to an etcd store is fenced: it is made only
 * while key (the leader key) is held under lease, else refused -EPERM
 * (this tracker was succeeded). No effect on a directory. */
void trk__store_fence(struct trk_store *st, const char *key, int64_t lease);
/* Removes key (a write undone); absent is fine. */
int trk__store_remove(struct trk_store *st, const char *key, struct proto_err *err);
/* Calls fn with the name (after "dir/") of every key under dir/, in name
 * order; stray temporary files of an interrupted write are removed. */
int trk__store_list(struct trk_store *st, const char *dir,
		    int (*fn)(const char *name, void *arg), void *arg, struct proto_err *err);
/* Can the store take a write now? 0, or why not. */
int trk__store_probe(struct trk_store *st, struct proto_err *err);

#endif
