/* rf-test: timeout=30
 * The README's "Source tree" (issue 39 item 5) against the tree: every folder of src/ is
 * listed there, and every folder it lists exists (src/X/, and the top-level ones it names:
 * include/, tools/, python/, tests/ ...). A folder added without its line fails, naming it;
 * so does a line left behind by a folder removed or renamed. Run from the repository's root. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rf_test.h"

#define MAX_LISTED 64

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(void) {
  FILE *f = fopen("README.md", "r");
  RF_CHECK(f != NULL, "README.md: cannot open (run from the repository's root)");
  if (!f) return rf_test_finish("test_readme_tree");
  char line[1024], listed[MAX_LISTED][128];
  int n = 0, in_section = 0, in_block = 0, lineno = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    if (strncmp(line, "## ", 3) == 0) in_section = strncmp(line, "## Source tree", 14) == 0;
    if (!in_section) continue;
    if (strncmp(line, "```", 3) == 0) {
      in_block = !in_block;
      continue;
    }
    if (!in_block) continue;
    /* each word of the line's first column that ends with '/' is a folder (several on one line:
     * "tests/ bench/ docs/") */
    char *save = NULL;
    for (char *w = strtok_r(line, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
      size_t len = strlen(w);
      if (len < 2 || w[len - 1] != '/') break; /* the description begins */
      RF_CHECK(n < MAX_LISTED, "README.md:%d: more than %d folders listed", lineno, MAX_LISTED);
      if (n >= MAX_LISTED) break;
      snprintf(listed[n], sizeof listed[n], "%.*s", (int)(len - 1), w);
      RF_CHECK(is_dir(listed[n]), "README.md:%d: the source tree lists %s/, which does not exist", lineno,
               listed[n]);
      n++;
    }
  }
  fclose(f);
  RF_CHECK(n > 10, "README.md: the section '## Source tree' lists %d folders", n);
  DIR *d = opendir("src");
  RF_CHECK(d != NULL, "src/: cannot open");
  int folders = 0;
  const struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char path[600];
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "src/%s", e->d_name);
    if (!is_dir(path)) continue;
    folders++;
    int found = 0;
    for (int i = 0; i < n && !found; i++) found = strcmp(listed[i], path) == 0;
    RF_CHECK(found, "README.md: the source tree has no line for %s/", path);
  }
  if (d) closedir(d);
  printf("README.md lists %d folders; src/ has %d\n", n, folders);
  return rf_test_finish("test_readme_tree");
}
