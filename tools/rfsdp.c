/* The rfsdp command: dispatches to its subcommands. */
#include <stdio.h>
#include <string.h>

#include "rfsdp.h"

static void rf_usage(FILE *out) {
  fprintf(out,
          "usage: rfsdp COMMAND [OPTIONS]\n"
          "\n"
          "commands:\n"
          "  version   print the version\n"
          "\n"
          "Run 'rfsdp COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    rf_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("rfsdp %s\n", RFSDP_VERSION);
    return 0;
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    rf_usage(stdout);
    return 0;
  }
  fprintf(stderr, "rfsdp: unknown command '%s'\n", cmd);
  rf_usage(stderr);
  return 2;
}
