/* rf-test: timeout=30
 * The rfsdp command's dispatcher and option errors, run as a user would. */
#include <string.h>

#include "rf_cli.h"
#include "rf_test.h"

int main(void) {
  char out[8192];
  int rc = rf_cli_run(out, sizeof out, "version");
  RF_CHECK(rc == 0 && strstr(out, "rfsdp "), "version: rc %d, output '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "no-such-command");
  RF_CHECK(rc == 2 && strstr(out, "unknown command 'no-such-command'"), "unknown command: rc %d '%s'", rc,
           out);
  rc = rf_cli_run(out, sizeof out, "help");
  RF_CHECK(rc == 0 && strstr(out, "commands:"), "help: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "%s", "");
  RF_CHECK(rc == 2 && strstr(out, "usage:"), "no command: rc %d '%s'", rc, out);
  return rf_test_finish("test_cli");
}
