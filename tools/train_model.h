/* rfsdp's agreements and exit status around the model's binding (src/model/train.h,
 * the library's): a failure seen by one rank reaches every rank before anyone
 * branches, and one rank prints it. */
#ifndef RF_TOOLS_TRAIN_MODEL_H
#define RF_TOOLS_TRAIN_MODEL_H

#include "comm/comm.h"
#include "model/train.h"

/* Every rank's status combined (src/comm's checked rf_comm_agree): 0 only when
 * every rank passed 0. Collective: the tools call it before any branch a failure
 * could take. */
int rf_train_agree(const struct rf_comm *comm, int status);
/* The exit status of a command after every rank's result rc (collective, the
 * command's last): 0 when every rank passed, else 1, and one rank prints its
 * message once, prefixed by `command`: the lowest rank that saw a problem itself. */
int rf_train_exit_status(const struct rf_comm *comm, int rc, const char *command);

/* Every rank fills its pieces of the weights from a safetensors file, then the
 * ranks agree: 0 on every rank, or -1 on every rank (the message names the file). */
int rf_train_model_import(struct rf_train_model *m, const struct rf_comm *comm, const char *path);

#endif
