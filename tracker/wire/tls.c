/* TLS for the tracker's HTTP API: the server's and the client's OpenSSL
 * contexts and the libevent OpenSSL bufferevents made from them. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/log.h"
#include "tracker/wire/tls.h"

/*
 * The server presents --tls-cert (a PEM chain) with --tls-key; clients
 * verify it against --tls-ca (or the system's trust store) and check that it
 * names the host of the tracker URL (a DNS name, or an IP address against
 * the certificate's IP entries). TLS 1.2 is the floor. A plain-HTTP request
 * that reaches a TLS listener is answered in plain HTTP, once, with a 400
 * that says to use https://, and closed (info_cb).
 */

/* The first OpenSSL error's reason, the cause of the ones after it (the
 * queue is emptied). */
static void ssl_error_line(char *buf, size_t cap)
{
	unsigned long e = ERR_peek_error();
	const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

	if (r != NULL)
		snprintf(buf, cap, "%s", r);
	else if (e != 0)
		ERR_error_string_n(e, buf, cap);
	else
		snprintf(buf, cap, "unknown OpenSSL error");
	ERR_clear_error();
}

static const char plain_refusal[] =
	"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
	"Cache-Control: no-store\r\nConnection: close\r\nContent-Length: 69\r\n\r\n"
	"{\"error\":\"this tracker speaks TLS only: use an https:// tracker URL\"}\n";

/* A handshake that failed because the peer spoke plain HTTP: answer it in
 * its own language (best effort, one small write) so that it sees why. */
static void info_cb(const SSL *ssl, int where, int ret)
{
	unsigned long e;
	int fd;

	if (!(where & SSL_CB_ACCEPT_EXIT) || ret > 0)
		return;
	e = ERR_peek_last_error();
	if (ERR_GET_LIB(e) != ERR_LIB_SSL || ERR_GET_REASON(e) != SSL_R_HTTP_REQUEST)
		return;
	fd = SSL_get_fd(ssl);
	if (fd < 0)
		return;
	(void)send(fd, plain_refusal, sizeof(plain_refusal) - 1,
		   MSG_NOSIGNAL | MSG_DONTWAIT);
	LOG_INFO("plain HTTP on the TLS listener: answered 400 and closed");
}

int trk__tls_server_ctx(const char *cert, const char *key, struct ssl_ctx_st **out,
			struct proto_err *err)
{
	char why[256];
	SSL_CTX *ctx;

	*out = NULL;
	if (cert == NULL || key == NULL)
		return proto_errf(err, EINVAL, "--tls-cert and --tls-key go together");
	ctx = SSL_CTX_new(TLS_server_method());
	if (ctx == NULL) {
		ssl_error_line(why, sizeof(why));
		return proto_errf(err, ENOMEM, "TLS: %s", why);
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		ssl_error_line(why, sizeof(why));
		SSL_CTX_free(ctx);
		return proto_errf(err, EINVAL, "--tls-cert %s: no PEM certificate: %s", cert,
				  why);
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
			ERR_clear_error();
			SSL_CTX_free(ctx);
			return proto_errf(err, EINVAL, "--tls-key %s does not match --tls-cert %s",
					  key, cert);
		}
		ssl_error_line(why, sizeof(why));
		SSL_CTX_free(ctx);
		return proto_errf(err, EINVAL, "--tls-key %s: no PEM private key: %s", key, why);
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		SSL_CTX_free(ctx);
		return proto_errf(err, EINVAL, "--tls-key %s does not match --tls-cert %s",
				  key, cert);
	}
	SSL_CTX_set_info_callback(ctx, info_cb);
	*out = ctx;
	return 0;
}

int trk__tls_client_ctx(const char *ca_file, struct ssl_ctx_st **out,
			struct proto_err *err)
{
	char why[256];
	SSL_CTX *ctx;
	int ok;

	*out = NULL;
	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL) {
		ssl_error_line(why, sizeof(why));
		return proto_errf(err, ENOMEM, "TLS: %s", why);
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	ok = ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
			     : SSL_CTX_set_default_verify_paths(ctx);
	if (ok != 1) {
		ssl_error_line(why, sizeof(why));
		SSL_CTX_free(ctx);
		if (ca_file != NULL)
			return proto_errf(err, EINVAL, "--tls-ca %s: no PEM CA certificate: %s",
					  ca_file, why);
		return proto_errf(err, EIO, "TLS: no system trust store: %s", why);
	}
	*out = ctx;
	return 0;
}

int trk__tls_client_cert(struct ssl_ctx_st *ctx, const char *cert, const char *key,
			 struct proto_err *err)
{
	char why[256];

	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		ssl_error_line(why, sizeof(why));
		return proto_errf(err, EINVAL, "%s: no PEM certificate: %s", cert, why);
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		ssl_error_line(why, sizeof(why));
		return proto_errf(err, EINVAL, "%s: not the private key of %s: %s", key, cert,
				  why);
	}
	return 0;
}

void trk__tls_ctx_free(struct ssl_ctx_st *ctx)
{
	SSL_CTX_free(ctx);
}

/* Both ends close without close_notify (Connection: close, shutdown());
 * the HTTP framing, not TLS, says where an answer ends. */
static struct bufferevent *ssl_bev(SSL_CTX *ctx, struct event_base *base,
				   enum bufferevent_ssl_state state, SSL **ssl_out)
{
	struct bufferevent *bev;
	SSL *ssl = SSL_new(ctx);

	if (ssl == NULL) {
		ERR_clear_error();
		return NULL;
	}
	bev = bufferevent_openssl_socket_new(base, -1, ssl, state,
					     BEV_OPT_CLOSE_ON_FREE |
						     BEV_OPT_DEFER_CALLBACKS);
	if (bev == NULL) {
		SSL_free(ssl);
		return NULL;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	*ssl_out = ssl;
	return bev;
}

struct bufferevent *trk__tls_server_bev(struct ssl_ctx_st *ctx, struct event_base *base)
{
	SSL *ssl;

	return ssl_bev(ctx, base, BUFFEREVENT_SSL_ACCEPTING, &ssl);
}

struct bufferevent *trk__tls_client_bev(struct ssl_ctx_st *ctx, struct event_base *base,
					const char *host)
{
	struct in6_addr a6;
	struct in_addr a4;
	SSL *ssl = NULL;
	struct bufferevent *bev = ssl_bev(ctx, base, BUFFEREVENT_SSL_CONNECTING, &ssl);
	int ok;

	if (bev == NULL)
		return NULL;
	if (inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1) {
		ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
	} else {
		ok = SSL_set1_host(ssl, host) == 1 &&
		     SSL_set_tlsext_host_name(ssl, host) == 1;
	}
	if (!ok) {
		ERR_clear_error();
		bufferevent_free(bev);
		return NULL;
	}
	return bev;
}

bool trk__tls_failure(struct bufferevent *bev, char *msg, size_t cap)
{
	SSL *ssl = bev != NULL ? bufferevent_openssl_get_ssl(bev) : NULL;
	unsigned long e;
	long vr;

	if (ssl == NULL)
		return false;
	vr = SSL_get_verify_result(ssl);
	if (vr != X509_V_OK) {
		snprintf(msg, cap, "TLS: server certificate not verified: %s",
			 X509_verify_cert_error_string(vr));
		while (bufferevent_get_openssl_error(bev) != 0)
			;
		return true;
	}
	/* libevent queues a socket's errno as library 0: not TLS's doing. */
	while ((e = bufferevent_get_openssl_error(bev)) != 0 && ERR_GET_LIB(e) == 0)
		;
	if (e == 0)
		return false;
	const char *r = ERR_reason_error_string(e);
	if (r != NULL)
		snprintf(msg, cap, "TLS handshake failed: %s", r);
	else
		ERR_error_string_n(e, msg, cap);
	while (bufferevent_get_openssl_error(bev) != 0)
		;
	return true;
}

int trk__tls_write_now(struct bufferevent *bev, const void *buf, size_t len)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	int n;

	if (ssl == NULL)
		return -ENOTSUP;
	if (len == 0 || len > INT32_MAX)
		return -EINVAL;
	n = SSL_write(ssl, buf, (int)len);
	ERR_clear_error();
	return n > 0 ? 0 : -EIO;
}

bool trk__tls_handshaking(struct bufferevent *bev)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	return ssl != NULL && !SSL_is_init_finished(ssl);
}
