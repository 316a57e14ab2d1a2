/* What a node is waiting for, said at the default log level when a wait
 * lasts: one line after TESSERA_WAIT_NOTICE_MS, then at most one per that
 * period while the same wait goes on. Event-loop thread only. */
#ifndef NODE_WAITNOTE_H
#define NODE_WAITNOTE_H

#include <stdint.h>

struct node_wait {
	char key[32];     /* which wait ("" when none) */
	uint64_t since_ms; /* when it began */
	uint64_t said_ms;  /* when it was last said (0: not yet) */
};

/*
 * Records that `who` still waits for `key` (a short fixed word naming the
 * wait: "tracker", "version", "replica"); a new key starts a new wait. When
 * it is due, logs "<who>: waiting <s> s for <what fmt...>": a warning, but
 * at note for "version" (nothing published yet is the trainer's pace).
 * Cannot fail.
 */
void node_wait_note(struct node_wait *w, uint64_t now_ms, const char *who, const char *key,
		    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The wait for key is over (key NULL: whatever it was). Cannot fail. */
void node_wait_over(struct node_wait *w, const char *key);

#endif
