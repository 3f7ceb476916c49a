/* rf-test: timeout=60
 * The README's numbers that are not measurements but outputs of the code, checked against the code
 * (the measured ones are marked figures: tests/test_docs_figures.c):
 *   - the `rfsdp plan` example: the README's output block equals what `rfsdp plan` prints for the
 *     command written above it, token for token, except the rfsdp row's plan time (its last column,
 *     a timing of the machine that ran it);
 *   - "the N.NM-parameter default model (`configs/demo.json`)": the config's parameter count
 *     (rf_model_n_params) in millions, to the written digit;
 *   - "N experts, top-K (`configs/demo-moe.json`": the config's experts and top-k.
 * Errors name README.md and the line. Run from the repository's root (as scripts/run-tests does). */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_cli.h"
#include "rf_test.h"

#define README "README.md"

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  RF_ASSERT(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = rf_xmalloc((size_t)n + 1);
  RF_ASSERT(fread(s, 1, (size_t)n, f) == (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

static int line_of(const char *text, const char *at) {
  int line = 1;
  for (const char *p = text; p < at; p++) line += *p == '\n';
  return line;
}

/* The whitespace-separated tokens of one line (at most cap), each a copy into buf. */
static int tokens(const char *line, size_t len, char tok[][64], int cap) {
  int n = 0;
  size_t i = 0;
  while (i < len && n < cap) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t j = i;
    while (j < len && line[j] != ' ' && line[j] != '\t') j++;
    if (j > i) {
      size_t k = j - i < 63 ? j - i : 63;
      memcpy(tok[n], line + i, k);
      tok[n++][k] = 0;
    }
    i = j;
  }
  return n;
}

/* The line of `out` whose first token is `first` (NULL: none); *len its length. */
static const char *find_row(const char *out, const char *first, size_t *len) {
  for (const char *p = out; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char tok[2][64];
    if (tokens(p, n, tok, 2) >= 1 && strcmp(tok[0], first) == 0) {
      *len = n;
      return p;
    }
    if (!e) break;
    p = e + 1;
  }
  return NULL;
}

static void test_plan_example(const char *readme) {
  const char *cmd = strstr(readme, "build/rfsdp plan --model configs/gpt-oss-120b.json");
  RF_CHECK(cmd != NULL, "%s: the `rfsdp plan` example is gone (update this test)", README);
  if (!cmd) return;
  const char *cmd_end = strchr(cmd, '\n');
  const char *block = strstr(cmd_end, "```\n```\n");
  RF_ASSERT(block);
  block += 8;
  const char *block_end = strstr(block, "```");
  RF_ASSERT(block_end);
  char args[256];
  size_t an = (size_t)(cmd_end - cmd) - strlen("build/rfsdp ");
  RF_ASSERT(an < sizeof args);
  memcpy(args, cmd + strlen("build/rfsdp "), an);
  args[an] = 0;
  static char out[1 << 16];
  int rc = rf_cli_run(out, sizeof out, "%s", args);
  RF_CHECK(rc == 0, "rfsdp %s: rc %d\n%s", args, rc, out);
  int rows = 0;
  for (const char *p = block; p < block_end;) {
    const char *e = strchr(p, '\n');
    size_t n = (size_t)(e - p);
    char want[16][64], got[16][64];
    int nw = tokens(p, n, want, 16);
    if (nw > 0) {
      size_t gl = 0;
      const char *table = strstr(out, "\nworld "); /* after the banner line, which starts with "rfsdp" too */
      const char *g = find_row(table ? table + 1 : out, want[0], &gl);
      RF_CHECK(g != NULL, "%s:%d: no row '%s' in rfsdp plan's output", README, line_of(readme, p), want[0]);
      if (g) {
        int ng = tokens(g, gl, got, 16);
        /* the rfsdp row's last column is its plan time in ms: a timing, not an output of the layout */
        int timed = strcmp(want[0], "rfsdp") == 0;
        RF_CHECK(ng == nw, "%s:%d: '%s' row has %d columns, rfsdp plan prints %d", README, line_of(readme, p),
                 want[0], nw, ng);
        for (int i = 0; i < nw && i < ng; i++)
          if (!(timed && i == nw - 1))
            RF_CHECK(strcmp(want[i], got[i]) == 0, "%s:%d: '%s' row, column %d: README %s, rfsdp plan %s",
                     README, line_of(readme, p), want[0], i + 1, want[i], got[i]);
        rows++;
      }
    }
    p = e + 1;
  }
  printf("the rfsdp plan example: %d lines equal to the command's output (the plan time aside)\n", rows);
  RF_CHECK(rows >= 7, "%s: the plan example has %d lines (expected the world line, the header, 5 layouts)",
           README, rows);
}

static void test_model_sizes(const char *readme) {
  const char *at = strstr(readme, "M-parameter default model (`configs/demo.json`)");
  RF_CHECK(at != NULL, "%s: the demo model's parameter count is gone (update this test)", README);
  if (at) {
    const char *num = at;
    while (num > readme && (num[-1] == '.' || (num[-1] >= '0' && num[-1] <= '9'))) num--;
    double written = strtod(num, NULL);
    struct rf_model_config cfg;
    RF_ASSERT(rf_model_config_load(&cfg, "configs/demo.json") == 0);
    double m = (double)rf_model_n_params(&cfg) / 1e6;
    RF_CHECK(written == (double)(long)(m * 10 + 0.5) / 10,
             "%s:%d: %.1fM parameters written, configs/demo.json has %.4fM", README, line_of(readme, at),
             written, m);
    printf("demo model: %.1fM parameters written, %.4fM in configs/demo.json\n", written, m);
  }
  at = strstr(readme, " experts, top-");
  RF_CHECK(at != NULL && strstr(at, "(`configs/demo-moe.json`") == strstr(at, "("),
           "%s: the demo MoE model's experts and top-k are gone (update this test)", README);
  if (at) {
    const char *num = at;
    while (num > readme && num[-1] >= '0' && num[-1] <= '9') num--;
    int experts = atoi(num), topk = atoi(at + strlen(" experts, top-"));
    struct rf_model_config cfg;
    RF_ASSERT(rf_model_config_load(&cfg, "configs/demo-moe.json") == 0);
    RF_CHECK(experts == cfg.moe.num_local_experts && topk == cfg.moe.num_experts_per_tok,
             "%s:%d: %d experts, top-%d written; configs/demo-moe.json has %d, top-%d", README,
             line_of(readme, at), experts, topk, cfg.moe.num_local_experts, cfg.moe.num_experts_per_tok);
    printf("demo MoE model: %d experts, top-%d\n", experts, topk);
  }
}

int main(void) {
  char *readme = read_all(README);
  test_plan_example(readme);
  test_model_sizes(readme);
  free(readme);
  return rf_test_finish("test_readme_examples");
}
