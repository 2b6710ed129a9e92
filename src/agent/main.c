/* main.c: gpurent-agent's entry point: picks the subcommand (serve, the
 * default, sim-fleet, sftp-server or sim-model-server). */
#include "agent.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: gpurent-agent [COMMAND] [OPTIONS]\n"
               "\n"
               "commands:\n"
               "  serve          run the node agent (the default)\n"
               "  sim-fleet      serve simulated nodes and register them with gpurentd\n"
               "  sftp-server    serve SFTP on stdin/stdout inside --root DIR\n"
               "  sim-model-server  an OpenAI-compatible echo server for sim app replicas\n"
               "\n"
               "Each command takes --help.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
            printf("gpurent-agent " AGENT_VERSION "\n");
            return 0;
        }
        return agent_cmd_serve(argc, argv);
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0)
        return agent_cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "sim-fleet") == 0)
        return agent_cmd_fleet(argc - 1, argv + 1);
    if (strcmp(cmd, "sim-model-server") == 0)
        return agent_cmd_model_server(argc - 1, argv + 1);
    if (strcmp(cmd, "sftp-server") == 0)
        return agent_cmd_sftp_server(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "gpurent-agent: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
