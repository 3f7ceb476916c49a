/* The subcommands of the rfsdp command, one file each under tools/. Each takes
 * argc/argv starting at its own name and returns the process exit code. */
#ifndef RF_TOOLS_COMMANDS_H
#define RF_TOOLS_COMMANDS_H

struct rf_command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
};

int rf_cmd_prepare(int argc, char **argv);
int rf_cmd_ckpt(int argc, char **argv);
int rf_cmd_train(int argc, char **argv);

#endif
