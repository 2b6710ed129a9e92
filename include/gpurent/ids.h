/* ids.h: random identifiers and secrets. Ids are a kind prefix and 20
 * characters of lowercase base32 (100 random bits): "usr_8f3k…", "ins_…". */
#ifndef GPURENT_IDS_H
#define GPURENT_IDS_H

#include <stddef.h>

#define ID_RANDOM_CHARS 20
#define ID_MAX 32 /* enough for any prefix we use, the '_', the random part and NUL */

/* Writes prefix "_" random into out (ID_MAX bytes). Returns 0, or -1 if the
 * system has no randomness to give, which callers treat as fatal. */
int id_new(const char *prefix, char out[ID_MAX]);
/* Like id_new, but the first ID_TIME_CHARS characters of the 20 are the
 * wall clock's milliseconds, most significant first, and only the other 11
 * are random (55 bits: a collision within one millisecond is as likely as
 * guessing a 2^55 secret). Such ids sort by when they were made, so rows
 * made together sit together in every index keyed by them: an index leaf
 * holds the rows of a burst of creates instead of each landing on a random
 * page that the commit must write (issue 15). For rows made in bursts and
 * looked up by id: instances and their workloads. Ids are names, not
 * secrets: every look-up checks its owner. */
#define ID_TIME_CHARS 9 /* 45 bits of milliseconds: until the year 3084 */
int id_new_ordered(const char *prefix, char out[ID_MAX]);
/* Whether s is a well-formed id of this kind (prefix, '_', 20 base32 chars). */
int id_valid(const char *prefix, const char *s);
/* Fills buf with n cryptographically random bytes; 0 or -1. */
int random_bytes(void *buf, size_t n);
/* Lowercase hex of n bytes into out (2n+1 bytes). */
void hex_encode(const void *bytes, size_t n, char *out);

#endif
