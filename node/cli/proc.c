/* Spawning and stopping child processes with their output in log files. */
#include "node/cli/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* In the child between fork and exec: only async-signal-safe calls. The
 * child asks for SIGTERM when the process that started it dies, so a
 * launcher killed without a chance to stop its children (SIGKILL, a crash)
 * leaves no orphan behind. An exec failure is written to err_fd. */
static void spawn_child(pid_t parent, char *const argv[], const char *log, int err_fd)
{
	int e, fd;

	if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
		_exit(127); /* the parent died already */
	if ((fd = open("/dev/null", O_RDONLY)) < 0 || dup2(fd, 0) < 0)
		goto fail;
	if (fd != 0)
		close(fd);
	if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0 || dup2(fd, 1) < 0 ||
	    dup2(fd, 2) < 0)
		goto fail;
	if (fd > 2)
		close(fd);
	execve(argv[0], argv, environ);
fail:
	e = errno;
	if (write(err_fd, &e, sizeof(e)) < 0)
		_exit(127);
	_exit(127);
}

int node_proc_spawn(struct node_proc *p, const char *name, char *const argv[], const char *log)
{
	int pipefd[2], e = 0;
	pid_t parent = getpid();
	ssize_t n;

	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	snprintf(p->log, sizeof(p->log), "%s", log);
	if (pipe2(pipefd, O_CLOEXEC) != 0)
		return -errno;
	p->pid = fork();
	if (p->pid == 0)
		spawn_child(parent, argv, log, pipefd[1]);
	if (p->pid < 0) {
		e = errno;
		p->pid = 0;
		close(pipefd[0]);
		close(pipefd[1]);
		return -e;
	}
	close(pipefd[1]);
	/* The write end closes at exec: nothing read means it started. */
	do
		n = read(pipefd[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(pipefd[0]);
	if (n == (ssize_t)sizeof(e)) {
		waitpid(p->pid, &p->status, 0);
		p->pid = 0;
		return -(e ? e : ECHILD);
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
