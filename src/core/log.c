/* Rank-prefixed logging to stderr. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static int rf_log_rank = -1;
static int rf_log_level_set = -1;

void rf_log_set_rank(int rank) { rf_log_rank = rank; }

int rf_log_get_rank(void) { return rf_log_rank; }

void rf_log_set_level(enum rf_log_level level) { rf_log_level_set = (int)level; }

static int rf_log_current_level(void) {
  if (rf_log_level_set >= 0) return rf_log_level_set;
  const char *env = getenv("RF_LOG");
  rf_log_level_set = RF_LOG_LEVEL_INFO;
  if (env) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
      if (strcmp(env, names[i]) == 0) rf_log_level_set = i;
  }
  return rf_log_level_set;
}

void rf_log(enum rf_log_level level, const char *fmt, ...) {
  if ((int)level > rf_log_current_level()) return;
  static const char *tags[] = {"error: ", "warning: ", "", "debug: "};
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (rf_log_rank >= 0)
    fprintf(stderr, "[rank %d] %s%s\n", rf_log_rank, tags[level], text);
  else
    fprintf(stderr, "%s%s\n", tags[level], text);
}
