/* Child processes for the local cluster launcher and the end-to-end tests:
 * spawn with output to a log file, read a line a child printed, stop. */
#ifndef NODE_PROC_H
#define NODE_PROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct node_proc {
	pid_t pid;     /* 0 when not running */
	char name[64];
	char log[4096]; /* stdout and stderr of the child */
	int status;    /* wait status once reaped */
};

/* Starts argv[0] (a path) with argv, stdin from /dev/null, stdout+stderr
 * appended to log. The child gets SIGTERM when the thread that started it
 * ends (PR_SET_PDEATHSIG): a launcher that dies without stopping its
 * children (SIGKILL, a crash) leaves none running. Returns 0 or a negative
 * errno (nothing started). */
int node_proc_spawn(struct node_proc *p, const char *name, char *const argv[],
		    const char *log);
/* True while the child runs (reaps it, without blocking, when it ended). */
bool node_proc_alive(struct node_proc *p);
/* SIGTERM, wait up to grace_ms, then SIGKILL; reaps. Safe when not running. */
void node_proc_stop(struct node_proc *p, int grace_ms);
/* SIGKILL and reap at once. */
void node_proc_kill(struct node_proc *p);
/* Waits until the child's log holds a line starting with prefix and copies
 * the rest of that line into out. -ETIMEDOUT, or -ECHILD when it exited. */
int node_proc_wait_line(struct node_proc *p, const char *prefix, char *out,
			size_t outlen, int timeout_ms);
/* The directory holding the running program (for its sibling binaries). */
int node_self_dir(char *buf, size_t len);

#endif
