/* Subcommands of the `tessera` program; each lives in node/cli/cmd_<name>.c and
 * returns the process exit status. */
#ifndef NODE_CMD_H
#define NODE_CMD_H

#include "proto/config.h"

struct node_cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
};

int node_cmd_plan(int argc, char **argv);
int node_cmd_keygen(int argc, char **argv);
int node_cmd_publish(int argc, char **argv);
/* The checks of [publish]'s values, the parsers `tessera publish` uses. */
extern const struct proto_config_value node_publish_config_values[];
int node_cmd_cluster(int argc, char **argv);
int node_cmd_synth(int argc, char **argv);
int node_cmd_delta(int argc, char **argv);
int node_cmd_config(int argc, char **argv);
int node_cmd_model(int argc, char **argv);
int node_cmd_probe(int argc, char **argv);

#endif
