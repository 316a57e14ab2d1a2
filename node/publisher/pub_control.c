/* The publisher's control socket: export commands and the trainer ranks' shared buffers. */
#include "node/publisher/pub_control.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/proto.h"

#define CTL_LINE_MAX 256 /* longest command, bytes */

struct node_pub_control;

/* One connection. It outlives its socket while exports it asked for are
 * still running, so that their answers have somewhere to go. */
struct ctl_client {
	struct node_pub_control *pc;
	struct bufferevent *bev; /* NULL once the peer went away */
	unsigned pending;
	bool closing; /* close once the output is flushed */
	int64_t rank; /* the trainer rank it holds; -1: none */
	bool handoff; /* its buffer goes out once the output is flushed */
	struct ctl_client *next;
};

/* One trainer step every rank asked to export: who to answer. */
struct ctl_round {
	struct node_pub_control *pc;
	uint64_t step;
	uint32_t n;
	struct ctl_client **who; /* per rank */
	struct ctl_round *next;
};

struct node_pub_control {
	struct event_base *base;
	struct node_pub *pub;
	struct node_pub_control_ops ops;
	char *path;
	bool bound;
	struct evconnlistener *lis;
	struct ctl_client *clients;
	/* Rounds queued or exporting: node_pub_free drops them unanswered. */
	struct ctl_round *rounds;
	/* Trainer ranks: who holds each, and the step being gathered. */
	uint32_t nranks;
	struct ctl_client **holder;
	bool *ready;
	uint32_t nready;
	uint64_t step;
};

static void client_free(struct ctl_client *c)
{
	struct node_pub_control *pc = c->pc;

	for (struct ctl_client **pp = &pc->clients; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->bev != NULL)
		bufferevent_free(c->bev);
	free(c);
}

/* The trainer rank c holds is free again; its pending export is withdrawn. */
static void rank_drop(struct ctl_client *c)
{
	struct node_pub_control *pc = c->pc;

	if (c->rank < 0)
		return;
	if (pc->ready[c->rank]) {
		pc->ready[c->rank] = false;
		pc->nready--;
	}
	pc->holder[c->rank] = NULL;
	LOG_INFO("control: trainer rank %lld left", (long long)c->rank);
	c->rank = -1;
}

/* The peer is gone (or we are done with it): drop the socket and the rank,
 * keep the struct while answers are owed. */
static void client_gone(struct ctl_client *c)
{
	rank_drop(c);
	if (c->bev != NULL) {
		bufferevent_free(c->bev);
		c->bev = NULL;
	}
	if (c->pending == 0)
		client_free(c);
}

static void client_say(struct ctl_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void client_say(struct ctl_client *c, const char *fmt, ...)
{
	char line[600];
	va_list ap;
	int n;

	if (c->bev == NULL)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	n = PROTO_MIN(n, (int)sizeof(line) - 2);
	for (int i = 0; i < n; i++)
		if (line[i] == '\n' || line[i] == '\r')
			line[i] = ' ';
	line[n++] = '\n';
	bufferevent_write(c->bev, line, (size_t)n);
}

/* Answers r to c and lets c go if it left and owes nothing more. */
static void client_answer(struct ctl_client *c, const struct node_pub_result *r)
{
	c->pending--;
	if (r->status == 0)
		client_say(c, "published %llu %llu %s %llu %llu %llu", (unsigned long long)r->version,
			   (unsigned long long)r->created_ms, r->delta ? "delta" : "anchor",
			   (unsigned long long)r->wire_bytes, (unsigned long long)r->anchor_bytes,
			   (unsigned long long)(r->encode_ns / 1000));
	else
		client_say(c, "error version %llu: %s", (unsigned long long)r->version, r->error);
	if (c->bev == NULL && c->pending == 0)
		client_free(c);
}

static void on_export_done(void *arg, const struct node_pub_result *r)
{
	struct ctl_client *c = arg;

	if (c->pc->ops.on_result != NULL)
		c->pc->ops.on_result(c->pc->ops.arg, r);
	client_answer(c, r);
}

/* ---- trainer ranks ------------------------------------------------------------------ */

static void on_round_snap(void *arg, uint64_t version)
{
	struct ctl_round *rd = arg;

	for (uint32_t r = 0; r < rd->n; r++)
		client_say(rd->who[r], "snapshot %llu %llu", (unsigned long long)rd->step,
			   (unsigned long long)version);
}

static void on_round_done(void *arg, const struct node_pub_result *r)
{
	struct ctl_round *rd = arg;

	if (rd->pc->ops.on_result != NULL)
		rd->pc->ops.on_result(rd->pc->ops.arg, r);
	if (r->status == 0)
		LOG_INFO("control: trainer step %llu is version %llu", (unsigned long long)rd->step,
			 (unsigned long long)r->version);
	for (uint32_t i = 0; i < rd->n; i++)
		client_answer(rd->who[i], r);
	for (struct ctl_round **pp = &rd->pc->rounds; *pp; pp = &(*pp)->next)
		if (*pp == rd) {
			*pp = rd->next;
			break;
		}
	free(rd->who);
	free(rd);
}

/* Every rank is ready at pc->step: export it. */
static void round_start(struct node_pub_control *pc)
{
	struct ctl_round *rd = calloc(1, sizeof(*rd));
	struct ctl_client **who = calloc(pc->nranks, sizeof(*who));

	if (rd == NULL || who == NULL ||
	    node_pub_export_snap(pc->pub, on_round_done, on_round_snap, rd) != 0) {
		for (uint32_t r = 0; r < pc->nranks; r++)
			client_say(pc->holder[r], "error step %llu: cannot queue an export: out of memory",
				   (unsigned long long)pc->step);
		free(rd);
		free(who);
	} else {
		rd->pc = pc;
		rd->step = pc->step;
		rd->n = pc->nranks;
		rd->who = who;
		rd->next = pc->rounds;
		pc->rounds = rd;
		for (uint32_t r = 0; r < pc->nranks; r++) {
			who[r] = pc->holder[r];
			who[r]->pending++;
		}
	}
	for (uint32_t r = 0; r < pc->nranks; r++)
		pc->ready[r] = false;
	pc->nready = 0;
}

/* Sends line with fd riding on its first byte. The output must be empty
 * so that the line is not overtaken by what is queued. */
static int say_with_fd(struct ctl_client *c, const char *line, int fd)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	size_t n = strlen(line);
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec iov = {(void *)line, n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			    .msg_controllen = sizeof(cm.b)};
	ssize_t sent;

	if (evbuffer_get_length(out) != 0)
		return -EAGAIN;
	if (bufferevent_getfd(c->bev) < 0) {
		/* A connection with no socket (a bufferevent pair, as the fuzz
		 * target makes: node_pub__control_adopt) carries no descriptor. */
		bufferevent_write(c->bev, line, n);
		return 0;
	}
	memset(&cm, 0, sizeof(cm));
	cm.h.cmsg_level = SOL_SOCKET;
	cm.h.cmsg_type = SCM_RIGHTS;
	cm.h.cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(&cm.h), &fd, sizeof(int));
	do
		sent = sendmsg(bufferevent_getfd(c->bev), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (sent < 0 && errno == EINTR);
	if (sent < 0)
		return -errno;
	if ((size_t)sent < n)
		bufferevent_write(c->bev, line + sent, n - (size_t)sent);
	return 0;
}

/* "4096x512" (dims joined by x); "-" for none. */
static void dims_str(char *buf, size_t cap, uint32_t ndim, const uint64_t *d)
{
	size_t off = 0;

	buf[0] = 0;
	if (ndim == 0) {
		snprintf(buf, cap, "-");
		return;
	}
	for (uint32_t i = 0; i < ndim && off < cap; i++)
		off += (size_t)snprintf(buf + off, cap - off, "%s%llu", i ? "x" : "",
					(unsigned long long)d[i]);
}

/* Checks what the trainer says it holds against rank r's spec; "" if fine. */
static void trainer_check(const struct proto_rank *rk, uint32_t r, bool have_bytes, uint64_t bytes,
			  const char *dtype, char *why, size_t cap)
{
	why[0] = 0;
	if (have_bytes && bytes != rk->nbytes) {
		snprintf(why, cap, "rank %u holds %llu bytes (its shard of the trainer layout), not %llu",
			 r, (unsigned long long)rk->nbytes, (unsigned long long)bytes);
		return;
	}
	if (dtype == NULL)
		return;
	for (uint32_t i = 0; i < rk->nlocals; i++)
		if (strcmp(proto_dtype_name(rk->locals[i].dtype), dtype) != 0) {
			snprintf(why, cap, "rank %u's tensor %.255s is %s, not %.32s", r,
				 rk->locals[i].name, proto_dtype_name(rk->locals[i].dtype), dtype);
			return;
		}
}

/*
 * Sends c's rank its buffer and table. The buffer's line must not overtake
 * answers still queued, so while the output is not empty the handoff
 * waits for it to drain, and c's further commands wait behind it.
 */
static void handoff(struct ctl_client *c)
{
	struct node_pub_control *pc = c->pc;
	const struct proto_layout *tl = node_pub_trainer_layout(pc->pub);
	const struct proto_model *m = node_pub_model(pc->pub);
	uint32_t r = (uint32_t)c->rank;
	const struct proto_rank *rk = &tl->ranks[r];
	uint64_t bytes;
	char line[128];
	int fd, rc;

	if (evbuffer_get_length(bufferevent_get_output(c->bev)) != 0) {
		c->handoff = true;
		bufferevent_disable(c->bev, EV_READ);
		return;
	}
	c->handoff = false;
	if ((rc = node_pub_trainer_buffer(pc->pub, r, &fd, &bytes)) == 0) {
		snprintf(line, sizeof(line), "buffer %u %llu %u\n", r, (unsigned long long)bytes,
			 rk->nlocals);
		rc = say_with_fd(c, line, fd);
	}
	if (rc != 0) {
		client_say(c, "error rank %u: cannot pass its buffer: %s", r, strerror(-rc));
		rank_drop(c);
		return;
	}
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct proto_local *l = &rk->locals[i];
		const struct proto_piece *pi = l->npieces == 1 ? &l->pieces[0] : NULL;
		char shape[200], start[200] = "-";
		dims_str(shape, sizeof(shape), l->ndim, l->shape);
		if (pi != NULL && !pi->flat && strcmp(m->tensors[pi->tensor].name, l->name) == 0 &&
		    m->tensors[pi->tensor].ndim > 0)
			dims_str(start, sizeof(start), m->tensors[pi->tensor].ndim, pi->box.lo);
		client_say(c, "tensor %s %llu %llu %s %s %.255s", proto_dtype_name(l->dtype),
			   (unsigned long long)l->offset, (unsigned long long)l->nbytes, shape, start,
			   l->name);
	}
	LOG_INFO("control: trainer rank %u attached (%llu-byte buffer)", r, (unsigned long long)bytes);
}

/* "trainer R [bytes N] [dtype D]" (args: what follows "trainer"). */
static void cmd_trainer(struct ctl_client *c, char *args)
{
	struct node_pub_control *pc = c->pc;
	const struct proto_layout *tl = node_pub_trainer_layout(pc->pub);
	char *save = NULL, *tok, *dtype = NULL, why[512];
	uint64_t r, bytes = 0;
	bool have_bytes = false;

	if (!node_pub_trainer_source(pc->pub)) {
		client_say(c, "error trainer ranks need the trainer source (tessera publish --trainer MODEL.json)");
		return;
	}
	tok = strtok_r(args, " \t", &save);
	if (tok == NULL || proto_parse_u64(tok, 0, UINT32_MAX, &r) != 0)
		goto usage;
	while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
		char *val = strtok_r(NULL, " \t", &save);
		if (val == NULL)
			goto usage;
		if (strcmp(tok, "bytes") == 0 && proto_parse_u64(val, 0, UINT64_MAX, &bytes) == 0)
			have_bytes = true;
		else if (strcmp(tok, "dtype") == 0)
			dtype = val;
		else
			goto usage;
	}
	if (r >= pc->nranks) {
		client_say(c, "error rank %llu is not a rank of the trainer layout (ranks 0..%u)",
			   (unsigned long long)r, pc->nranks - 1);
		return;
	}
	if (c->rank >= 0) {
		client_say(c, "error this connection is trainer rank %lld already", (long long)c->rank);
		return;
	}
	if (pc->holder[r] != NULL) {
		client_say(c, "error rank %llu is held by another trainer connection",
			   (unsigned long long)r);
		return;
	}
	trainer_check(&tl->ranks[r], (uint32_t)r, have_bytes, bytes, dtype, why, sizeof(why));
	if (why[0] != 0) {
		client_say(c, "error %s", why);
		return;
	}
	c->rank = (int64_t)r;
	pc->holder[r] = c;
	handoff(c);
	return;
usage:
	client_say(c, "error usage: trainer RANK [bytes N] [dtype D]");
}

/* "export STEP" from a trainer connection. */
static void cmd_trainer_export(struct ctl_client *c, const char *arg)
{
	struct node_pub_control *pc = c->pc;
	uint64_t step;

	if (proto_parse_u64(arg, 0, INT64_MAX, &step) != 0) {
		client_say(c, "error export wants a step number, not '%.64s'", arg);
		return;
	}
	if (c->rank < 0) {
		client_say(c, "error export STEP is for trainer ranks: send 'trainer RANK' first");
		return;
	}
	if (pc->ready[c->rank]) {
		client_say(c, "error rank %lld already exports step %llu", (long long)c->rank,
			   (unsigned long long)pc->step);
		return;
	}
	if (pc->nready > 0 && step != pc->step) {
		client_say(c, "error rank %lld exports step %llu while other ranks export step %llu",
			   (long long)c->rank, (unsigned long long)step, (unsigned long long)pc->step);
		return;
	}
	pc->step = step;
	pc->ready[c->rank] = true;
	if (++pc->nready == pc->nranks)
		round_start(pc);
}

/* ---- status: what a waiting connection waits for ------------------------------------ */

/* Appends to buf (cap bytes, NUL-terminated, *off used): cut short, never overrun. */
static void append(char *buf, size_t cap, size_t *off, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off + 1 >= cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, cap - *off, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off = PROTO_MIN(*off + (size_t)n, cap - 1);
}

/* Lists the ranks not ready, "1, 3, 4" (the first 8, then "and K more");
 * with unheld, only those no connection holds. */
static void rank_list(const struct node_pub_control *pc, bool unheld, char *buf, size_t cap,
		      size_t *off)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < pc->nranks; r++) {
		if (pc->ready[r] || (unheld && pc->holder[r] != NULL))
			continue;
		if (n < 8)
			append(buf, cap, off, "%s%u", n ? ", " : "", r);
		n++;
	}
	if (n > 8)
		append(buf, cap, off, " and %u more", n - 8);
}

/* Why the step being gathered waits: "rank 1 of 2 has not exported step 7
 * (no trainer connection holds rank 1)". */
static void gather_why(const struct node_pub_control *pc, char *buf, size_t cap)
{
	uint32_t missing = pc->nranks - pc->nready, unheld = 0;
	size_t off = 0;

	for (uint32_t r = 0; r < pc->nranks; r++)
		unheld += pc->holder[r] == NULL; /* a rank no one holds is not ready */
	buf[0] = 0;
	append(buf, cap, &off, "%s ", missing == 1 ? "rank" : "ranks");
	rank_list(pc, false, buf, cap, &off);
	append(buf, cap, &off, " of %u %s not exported step %llu", pc->nranks,
	       missing == 1 ? "has" : "have", (unsigned long long)pc->step);
	if (unheld == 0)
		return;
	append(buf, cap, &off, " (no trainer connection holds %s ", unheld == 1 ? "rank" : "ranks");
	rank_list(pc, true, buf, cap, &off);
	append(buf, cap, &off, ")");
}

/* "status": the oldest answer c waits for, and why it has not come. */
static void cmd_status(struct ctl_client *c)
{
	struct node_pub_control *pc = c->pc;
	struct ctl_round *oldest = NULL;
	struct node_pub_why w = {.cause = NODE_PUB_WAIT_WORKING, .text = "the export is finishing"};
	const void *arg = c;
	char step[24] = "-", ver[24] = "-", why[400];

	/* Rounds are queued newest first: the last one c is in is its oldest. */
	for (struct ctl_round *rd = pc->rounds; rd != NULL; rd = rd->next)
		for (uint32_t i = 0; i < rd->n; i++)
			if (rd->who[i] == c)
				oldest = rd;
	if (oldest == NULL && c->rank >= 0 && pc->ready[c->rank]) {
		gather_why(pc, why, sizeof(why));
		client_say(c, "status %llu - ranks %s", (unsigned long long)pc->step, why);
		return;
	}
	if (oldest == NULL && c->pending == 0) {
		client_say(c, "status idle");
		return;
	}
	if (oldest != NULL) {
		snprintf(step, sizeof(step), "%llu", (unsigned long long)oldest->step);
		arg = oldest;
	}
	node_pub_export_why(pc->pub, arg, &w); /* -ENOENT: its answer is on its way */
	if (w.version != 0)
		snprintf(ver, sizeof(ver), "%llu", (unsigned long long)w.version);
	client_say(c, "status %s %s %s %s", step, ver, node_pub_wait_name(w.cause), w.text);
}

/* ---- commands ----------------------------------------------------------------------- */

static void ctl_command(struct ctl_client *c, char *line)
{
	struct node_pub_control *pc = c->pc;
	char *s = line, *e;
	int rc;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
		*--e = 0;
	if (*s == 0)
		return;
	if (strcmp(s, "export") == 0) {
		if (node_pub_trainer_source(pc->pub)) {
			client_say(c, "error the source is the trainer: each trainer rank sends 'trainer RANK', fills its buffer, then 'export STEP'");
			return;
		}
		rc = node_pub_export(pc->pub, on_export_done, c);
		if (rc != 0)
			client_say(c, "error cannot queue an export: %s", strerror(-rc));
		else
			c->pending++;
	} else if (strncmp(s, "export ", 7) == 0) {
		cmd_trainer_export(c, s + 7);
	} else if (strncmp(s, "trainer ", 8) == 0 || strcmp(s, "trainer") == 0) {
		cmd_trainer(c, s + 7);
	} else if (strcmp(s, "status") == 0) {
		cmd_status(c);
	} else if (strncmp(s, "status ", 7) == 0) {
		client_say(c, "error usage: status (no arguments)");
	} else if (strcmp(s, "quit") == 0) {
		LOG_INFO("control: quit");
		if (pc->ops.on_quit != NULL)
			pc->ops.on_quit(pc->ops.arg);
	} else {
		client_say(c, "error unknown command '%.64s' (want export, trainer, status or quit)", s);
	}
}

static void on_ctl_read(struct bufferevent *bev, void *arg);

static void on_ctl_write(struct bufferevent *bev, void *arg)
{
	struct ctl_client *c = arg;

	if (c->closing) {
		client_gone(c);
	} else if (c->handoff) {
		handoff(c);
		if (!c->handoff) {
			bufferevent_enable(bev, EV_READ);
			on_ctl_read(bev, c); /* what came meanwhile */
		}
	}
}

static void on_ctl_read(struct bufferevent *bev, void *arg)
{
	struct ctl_client *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	char *line;
	size_t n;

	while (!c->closing && !c->handoff &&
	       (line = evbuffer_readln(in, &n, EVBUFFER_EOL_LF)) != NULL) {
		if (n > CTL_LINE_MAX)
			client_say(c, "error line too long (at most %d bytes)", CTL_LINE_MAX);
		else
			ctl_command(c, line);
		free(line);
	}
	if (!c->closing && !c->handoff && evbuffer_get_length(in) > CTL_LINE_MAX) {
		client_say(c, "error line too long (at most %d bytes)", CTL_LINE_MAX);
		c->closing = true;
		bufferevent_disable(bev, EV_READ);
	}
}

static void on_ctl_event(struct bufferevent *bev, short what, void *arg)
{
	struct ctl_client *c = arg;

	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		client_gone(c);
}

int node_pub__control_adopt(struct node_pub_control *pc, struct bufferevent *bev)
{
	struct ctl_client *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return -ENOMEM;
	c->pc = pc;
	c->bev = bev;
	c->rank = -1;
	c->next = pc->clients;
	pc->clients = c;
	bufferevent_setcb(c->bev, on_ctl_read, on_ctl_write, on_ctl_event, c);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	return 0;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct node_pub_control *pc = arg;
	struct bufferevent *bev = bufferevent_socket_new(pc->base, fd, BEV_OPT_CLOSE_ON_FREE);

	if (bev == NULL || node_pub__control_adopt(pc, bev) != 0) {
		LOG_WARN("control: out of memory; connection refused");
		if (bev != NULL)
			bufferevent_free(bev);
		else
			evutil_closesocket(fd);
	}
}

int node_pub_control_new(struct event_base *base, const char *path, struct node_pub *pub,
			 const struct node_pub_control_ops *ops, struct node_pub_control **out,
			 struct proto_err *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct node_pub_control *pc;
	struct stat st;
	evutil_socket_t fd = -1;
	int rc;

	*out = NULL;
	if (strlen(path) >= sizeof(sa.sun_path))
		return proto_errf(err, ENAMETOOLONG, "--control %s: path too long (at most %zu bytes)",
				  path, sizeof(sa.sun_path) - 1);
	if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
		return proto_errf(err, EEXIST, "--control %s: exists and is not a socket", path);
	pc = calloc(1, sizeof(*pc));
	if (pc == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	pc->base = base;
	pc->pub = pub;
	if (ops != NULL)
		pc->ops = *ops;
	pc->nranks = node_pub_trainer_layout(pub)->nranks;
	pc->path = strdup(path);
	pc->holder = calloc(pc->nranks ? pc->nranks : 1, sizeof(*pc->holder));
	pc->ready = calloc(pc->nranks ? pc->nranks : 1, sizeof(*pc->ready));
	if (pc->path == NULL || pc->holder == NULL || pc->ready == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	unlink(path); /* a stale socket of an earlier run */
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = proto_errf(err, errno, "--control %s: %s", path, strerror(errno));
		goto fail;
	}
	pc->bound = true;
	chmod(path, 0600); /* whoever can connect can export and stop us */
	evutil_make_socket_nonblocking(fd);
	pc->lis = evconnlistener_new(base, on_accept, pc, LEV_OPT_CLOSE_ON_FREE, 16, fd);
	if (pc->lis == NULL) {
		rc = proto_errf(err, EIO, "--control %s: cannot listen", path);
		goto fail;
	}
	*out = pc;
	return 0;
fail:
	if (fd >= 0 && pc->lis == NULL)
		close(fd);
	node_pub_control_free(pc);
	return rc;
}

void node_pub_control_free(struct node_pub_control *pc)
{
	if (pc == NULL)
		return;
	if (pc->lis != NULL)
		evconnlistener_free(pc->lis);
	if (pc->bound)
		unlink(pc->path);
	while (pc->clients != NULL)
		client_free(pc->clients);
	while (pc->rounds != NULL) {
		struct ctl_round *rd = pc->rounds;
		pc->rounds = rd->next;
		free(rd->who);
		free(rd);
	}
	free(pc->holder);
	free(pc->ready);
	free(pc->path);
	free(pc);
}
