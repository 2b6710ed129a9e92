/* audit.h: the audit layer (src/gpurentd/audit): `gpurentd ledger verify`,
 * the auditor of the money. It reads the ledger's raw rows through the
 * store and recomputes what each settled interval owes itself, sharing no
 * arithmetic shortcut with the billing code it checks (only the common
 * library's tariff, which is the definition of a price). */
#ifndef GPURENT_AUDIT_H
#define GPURENT_AUDIT_H

struct store;

/* ledger_verify.c: checks every invariant of the ledger and prints each
 * breach to stream. Returns the number of breaches (0: all good), or -1 if
 * the check itself failed. */
int ledger_verify(struct store *s, void *stream);

#endif
