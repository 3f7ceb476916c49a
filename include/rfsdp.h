/* rfsdp: RaggedShard fully sharded data parallel training in C.
 * The public API. Internal headers live under src/ and are not installed. */
#ifndef RFSDP_H
#define RFSDP_H

#define RFSDP_VERSION "0.1.0"

#endif
