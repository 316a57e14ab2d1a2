/* `tessera`: the command-line front door; dispatches to node/cli/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "proto/proto.h"

static const struct node_cmd cmds[] = {
	{"plan", "print the transfer plan between two layouts", node_cmd_plan},
	{"cluster", "run a local cluster on loopback and check every byte", node_cmd_cluster},
	{"keygen", "write an Ed25519 trainer key pair or a cluster key", node_cmd_keygen},
	{"publish", "publish policy versions from trainer ranks and serve them", node_cmd_publish},
	{"synth", "write synthetic policy versions (Adam steps, BF16)", node_cmd_synth},
	{"delta", "encode, apply or measure a delta between safetensors files", node_cmd_delta},
	{"config", "check a configuration file, or print the table of tunables", node_cmd_config},
	{"model", "write the model spec JSON a node's --model takes", node_cmd_model},
	{"probe", "score a rank's live weights (canary) and check them at the tracker", node_cmd_probe},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: tessera <command> [options]\n"
		   "       tessera help [<command>] | --help | --version\n\ncommands:\n");
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++)
		fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\n`tessera <command> --help` (or `tessera help <command>`) describes one\n"
		   "command. The other programs: tessera-tracker and tessera-node (--help).\n");
}

int main(int argc, char **argv)
{
	proto_cli_setup();
	proto_log_setup("tessera", -1);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "--version") == 0) {
		proto_cli_version("tessera");
		return 0;
	}
	if (strcmp(argv[1], "help") == 0 && argc == 3) {
		/* tessera help CMD = tessera CMD --help */
		for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++)
			if (strcmp(argv[2], cmds[i].name) == 0) {
				char *hargv[] = {argv[2], "--help", NULL};
				return cmds[i].run(2, hargv);
			}
		fprintf(stderr, "tessera: unknown command '%s' (see tessera help)\n", argv[2]);
		return 2;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    (strcmp(argv[1], "help") == 0 && argc == 2)) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].run(argc - 1, argv + 1);
	if (argv[1][0] == '-')
		fprintf(stderr, "tessera: unknown option '%s' (see tessera help)\n", argv[1]);
	else
		fprintf(stderr, "tessera: unknown command '%s' (see tessera help)\n", argv[1]);
	return 2;
}
