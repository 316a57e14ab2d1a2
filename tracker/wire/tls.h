/* TLS for the tracker's HTTP API, both ends: OpenSSL contexts and the
 * libevent OpenSSL bufferevents made from them (not included outside
 * tracker/). */
#ifndef TRACKER_WIRE_TLS_H
#define TRACKER_WIRE_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/util.h"

struct ssl_ctx_st; /* OpenSSL's SSL_CTX */
struct bufferevent;
struct event_base;

/* The server's context from a PEM certificate chain and its key; 0 or a
 * negative errno with err set (*out NULL). Freed with trk__tls_ctx_free. */
int trk__tls_server_ctx(const char *cert, const char *key, struct ssl_ctx_st **out,
			struct proto_err *err);
/* A client's context: verifies the server against ca_file (PEM), or the
 * system's trust store when NULL. 0 or a negative errno with err set. */
int trk__tls_client_ctx(const char *ca_file, struct ssl_ctx_st **out,
			struct proto_err *err);
/* Presents cert (a PEM chain) with its PEM key from a client context (a
 * store that asks for client certificates). 0 or a negative errno with err
 * set naming the file. */
int trk__tls_client_cert(struct ssl_ctx_st *ctx, const char *cert, const char *key,
			 struct proto_err *err);
/* NULL is fine. */
void trk__tls_ctx_free(struct ssl_ctx_st *ctx);
/* Bufferevents without a socket yet (evhttp sets it), closing it when
 * freed; NULL on failure. The client's checks that the certificate names
 * host. */
struct bufferevent *trk__tls_server_bev(struct ssl_ctx_st *ctx, struct event_base *base);
struct bufferevent *trk__tls_client_bev(struct ssl_ctx_st *ctx, struct event_base *base,
					const char *host);
/* After a failed request on bev: true with one line in msg when TLS is why
 * (an unverified certificate, a failed handshake); false for a plain bev or
 * no TLS error. */
bool trk__tls_failure(struct bufferevent *bev, char *msg, size_t cap);
/* Writes buf to a TLS bev's peer now, past its output buffer (a refusal the
 * connection guard answers itself). -ENOTSUP for a plain bev, -EIO when the
 * write fails. */
int trk__tls_write_now(struct bufferevent *bev, const void *buf, size_t len);
/* True while a TLS bev's handshake is unfinished; false for a plain bev. */
bool trk__tls_handshaking(struct bufferevent *bev);

#endif
