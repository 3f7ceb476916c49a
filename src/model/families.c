/* The list of model families: one line each (family.h says what a family is).
 * Their order is the order of the names in messages and --help. A new family is a
 * file defining `const struct rf_model_family rf_model_family_NAME` and one line
 * X(NAME) here. */
#include <string.h>

#include "core/core.h"
#include "model/family.h"

#define RF_MODEL_FAMILIES(X) \
  X(llama)                   \
  X(qwen2)                   \
  X(gpt_oss)                 \
  X(deepseek_v3)             \
  X(mixtral)                 \
  X(qwen3_moe)

#define RF_MODEL_FAMILY_EXTERN(name) extern const struct rf_model_family rf_model_family_##name;
RF_MODEL_FAMILIES(RF_MODEL_FAMILY_EXTERN)

#define RF_MODEL_FAMILY_ENTRY(name) &rf_model_family_##name,
static const struct rf_model_family *const rf_model_families[] = {RF_MODEL_FAMILIES(RF_MODEL_FAMILY_ENTRY)};

int rf_model_family_count(void) { return (int)(sizeof rf_model_families / sizeof rf_model_families[0]); }

const struct rf_model_family *rf_model_family_at(int i) {
  RF_ASSERT(i >= 0 && i < rf_model_family_count());
  return rf_model_families[i];
}

const struct rf_model_family *rf_model_family_find(const char *model_type) {
  for (int i = 0; i < rf_model_family_count(); i++)
    if (strcmp(rf_model_families[i]->name, model_type) == 0) return rf_model_families[i];
  return NULL;
}

const struct rf_model_family *rf_model_config_family(const struct rf_model_config *cfg) {
  return cfg->family ? cfg->family : &rf_model_family_llama;
}

const char *rf_model_family_name(const struct rf_model_family *family) {
  RF_ASSERT(family);
  return family->name;
}

int rf_model_family_trainable(const struct rf_model_family *family) { return family && family->trainable; }
