/* Spawning and stopping child processes with their output in log files. */
#include "node/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

int node_proc_spawn(struct node_proc *p, const char *name, char *const argv[], const char *log)
{
	posix_spawn_file_actions_t fa;
	int rc;

	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	snprintf(p->log, sizeof(p->log), "%s", log);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	rc = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0) {
		p->pid = 0;
		return -rc;
	}
	return 0;
}

bool node_proc_alive(struct node_proc *p)
{
	if (p->pid <= 0)
		return false;
	if (waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
		p->pid = 0;
		return false;
	}
	return true;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

void node_proc_stop(struct node_proc *p, int grace_ms)
{
	if (!node_proc_alive(p))
		return;
	kill(p->pid, SIGTERM);
	for (int waited = 0; waited < grace_ms; waited += 10) {
		if (!node_proc_alive(p))
			return;
		sleep_ms(10);
	}
	node_proc_kill(p);
}

void node_proc_kill(struct node_proc *p)
{
	if (p->pid <= 0)
		return;
	kill(p->pid, SIGKILL);
	waitpid(p->pid, &p->status, 0);
	p->pid = 0;
}

int node_proc_wait_line(struct node_proc *p, const char *prefix, char *out, size_t outlen,
			int timeout_ms)
{
	char line[4096];
	size_t plen = strlen(prefix);

	for (int waited = 0;; waited += 20) {
		FILE *f = fopen(p->log, "r");
		while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
			if (strncmp(line, prefix, plen) != 0)
				continue;
			line[strcspn(line, "\n")] = 0;
			snprintf(out, outlen, "%s", line + plen);
			fclose(f);
			return 0;
		}
		if (f != NULL)
			fclose(f);
		if (!node_proc_alive(p))
			return -ECHILD;
		if (waited >= timeout_ms)
			return -ETIMEDOUT;
		sleep_ms(20);
	}
}

int node_self_dir(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	if (n <= 0)
		return -errno;
	buf[n] = 0;
	char *slash = strrchr(buf, '/');
	if (slash != NULL)
		*slash = 0;
	return 0;
}
