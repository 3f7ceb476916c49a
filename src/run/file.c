/* A program's own files through the library's checked, atomic file code
 * (include/rfsdp_run.h: rf_run_file_read, rf_run_file_write). */
#include "run/run.h"

int rf_run_file_read(const char *path, char **out, size_t *bytes) {
  RF_REQUIRE_ARG("rf_run_file_read", path);
  RF_REQUIRE_ARG("rf_run_file_read", out);
  RF_REQUIRE_ARG("rf_run_file_read", bytes);
  return rf_file_read_all(path, out, bytes);
}

int rf_run_file_write(const char *path, const void *buf, size_t bytes) {
  RF_REQUIRE_ARG("rf_run_file_write", path);
  RF_REQUIRE_ARG("rf_run_file_write", buf);
  return rf_file_write_all(path, buf, bytes);
}
