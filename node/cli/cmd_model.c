/* `tessera model`: writes the model spec JSON that tessera-node's --model
 * and tessera plan's --model take, for the weights a publisher serves. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "proto/checkpoint.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define PROG "tessera model"

static void model_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera model (--synthetic-mb N | --model-dir DIR | --tracker URL)\n"
		"                     [-o FILE]\n"
		"\n"
		"Writes the model spec (tensor names, dtypes, shapes) as JSON: what\n"
		"tessera-node --model and tessera plan --model take. It must be the model\n"
		"the publisher serves, so give the publisher's source:\n"
		"\n"
		"      --synthetic-mb N   the synthetic model of `tessera publish\n"
		"                         --synthetic-mb N` (same N)\n"
		"      --model-dir DIR    the model of `tessera publish --model-dir DIR`\n"
		"                         (its first version's checkpoint)\n"
		"      --tracker URL      the model a publisher registered at the tracker\n"
		"                         (http://HOST:PORT; fails while none did)\n"
		"      --tls-ca FILE      verify an https:// tracker against these PEM CA\n"
		"                         certificates (default: the system's)\n"
		"  -o, --out FILE         write FILE (atomically) instead of stdout\n"
		"  -h, --help             this text\n");
}

/* The model a live publisher registered: the `model` of GET /api/v1/layouts. */
static int model_from_tracker(const char *url, const char *ca, struct proto_model *m,
			      struct proto_err *err)
{
	struct trk_client *c = NULL;
	struct trk_reply r;
	int rc = trk_client_new(NULL, url, NULL, &c, err);

	if (rc == 0 && ca != NULL && (rc = trk_client_set_tls_ca(c, ca, err)) != 0)
		trk_client_free(c);
	if (rc != 0)
		return rc;
	rc = trk_client_call(c, "GET", TRK_API "/layouts", NULL, NULL, 0, &r);
	if (rc != 0)
		rc = proto_errf(err, -rc, "%s: %s", url, r.error);
	else if (r.status == 404)
		rc = proto_errf(err, EAGAIN, "%s: no publisher has registered a model yet", url);
	else if (r.status != 200 || r.json == NULL)
		rc = proto_errf(err, EIO, "%s: GET %s/layouts answered %d", url, TRK_API, r.status);
	else
		rc = proto_model_from_json(json_object_get(r.json, "model"), "the tracker's model", m,
					   err);
	trk_reply_fini(&r);
	trk_client_free(c);
	return rc;
}

/* The publisher's model for a model dir: its first version's, in order. */
static int model_from_dir(const char *dir, struct proto_model *m, struct proto_err *err)
{
	char **paths;
	size_t n;
	struct proto_ckpt ck;
	int rc = proto_ckpt_dir_list(dir, &paths, &n, err);

	if (rc != 0)
		return rc;
	rc = proto_ckpt_open(paths[0], &ck, err);
	if (rc == 0) {
		json_t *j = proto_model_to_json(&ck.model);
		rc = j ? proto_model_from_json(j, paths[0], m, err) : proto_errf(err, ENOMEM, "out of memory");
		json_decref(j);
		proto_ckpt_fini(&ck);
	}
	proto_ckpt_list_free(paths, n);
	return rc;
}

int node_cmd_model(int argc, char **argv)
{
	static const struct option opts[] = {
		{"synthetic-mb", required_argument, NULL, 'm'},
		{"model-dir", required_argument, NULL, 'd'},
		{"tracker", required_argument, NULL, 't'},
		{"tls-ca", required_argument, NULL, 'C'},
		{"out", required_argument, NULL, 'o'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *tracker = NULL, *dir = NULL, *out = NULL, *ca = NULL;
	uint64_t bytes = 0;
	struct proto_model m;
	struct proto_err err = {{0}};
	json_t *j = NULL;
	int c, rc;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (proto_cli_parse_mib(optarg, &bytes) != 0) {
				fprintf(stderr, PROG ": --synthetic-mb wants a positive size, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'd': dir = optarg; break;
		case 't': tracker = optarg; break;
		case 'C': ca = optarg; break;
		case 'o': out = optarg; break;
		case 'h': model_usage(stdout); return 0;
		default: return proto_cli_bad_option(PROG, c, argv);
		}
	}
	if (optind < argc)
		return proto_cli_extra(PROG, argv[optind]);
	if ((bytes > 0) + (dir != NULL) + (tracker != NULL) != 1) {
		fprintf(stderr, PROG ": give exactly one of --synthetic-mb N, --model-dir DIR and --tracker URL (see --help)\n");
		return 2;
	}
	proto_model_init(&m);
	if (bytes > 0)
		rc = proto_fixture_model(bytes, &m, &err);
	else if (dir != NULL)
		rc = model_from_dir(dir, &m, &err);
	else
		rc = model_from_tracker(tracker, ca, &m, &err);
	if (rc == 0 && (j = proto_model_to_json(&m)) == NULL)
		rc = proto_errf(&err, ENOMEM, "out of memory");
	if (rc == 0 && out != NULL)
		rc = proto_write_json_atomic(out, j, JSON_INDENT(1), &err);
	else if (rc == 0 && (json_dumpf(j, stdout, JSON_INDENT(1)) != 0 || putchar('\n') == EOF))
		rc = proto_errf(&err, EIO, "cannot write to stdout");
	if (rc != 0)
		fprintf(stderr, PROG ": %s\n", err.msg);
	else if (out != NULL)
		fprintf(stderr, PROG ": wrote %s (%u tensors, %.1f MiB)\n", out, m.ntensors,
			(double)proto_model_bytes(&m) / 1048576.0);
	json_decref(j);
	proto_model_fini(&m);
	return rc == 0 ? 0 : 1;
}
