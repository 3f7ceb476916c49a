/* Running the rfsdp command from a test: the binary next to the test build
 * (BUILD/rfsdp for BUILD/tests/test_x), its exit code and its output. */
#ifndef RF_CLI_H
#define RF_CLI_H

/* Runs `rfsdp ARGS` through the shell (stderr merged into stdout). Returns the
 * exit code; up to out_size-1 bytes of output go to `out`. */
int rf_cli_run(char *out, int out_size, const char *args_fmt, ...) __attribute__((format(printf, 3, 4)));

/* The path of the rfsdp binary (static storage). */
const char *rf_cli_binary(void);

#endif
