/* gpurentd.h: the map of the daemon, its layers from the bottom up. Each
 * folder of src/gpurentd is a layer and its header says what the layer
 * offers; a file may include its own layer's header and those below it,
 * never one above (make check-layers fails the build otherwise):
 *
 *   store/   SQLite, private to it (store_sql.h); everything else sees
 *            store.h, plain structs and store_* calls
 *   audit/   ledger verify: the auditor, reading raw rows through the store
 *            and sharing no arithmetic with the code it checks
 *   domain/  the rules: accounts, instances, placement, volumes, funds, the
 *            ledger, node facts, SSH public keys
 *   loops/   background threads (heartbeat, reconciler, billing,
 *            watchdog), the agent client, metrics counters
 *   http/    routes, what every request passes, a handler per resource
 *   cmd/     main's subcommands and the configuration loader
 *
 * Under all of them is the common library (include/gpurent), shared with
 * the agent. Only cmd/ includes this map. */
#ifndef GPURENT_GPURENTD_H
#define GPURENT_GPURENTD_H

#include "audit/audit.h"
#include "cmd/cmd.h"
#include "domain/domain.h"
#include "domain/ledger.h"
#include "http/api.h"
#include "loops/loops.h"
#include "store/store.h"

#endif
