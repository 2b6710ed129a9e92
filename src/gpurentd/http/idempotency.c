/* idempotency.c: Idempotency-Key on POSTs that create or move capacity or
 * money. The first successful answer to a key is stored in the same
 * transaction as the change it reports, so a retried request either replays
 * that answer or, if the first never committed, runs afresh: never twice.
 * Keys belong to their user; the same key with another request is refused.
 * Refusals (4xx) are not stored, so a retry after fixing the cause runs. */
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Method and path each with its NUL, so no two requests run together. */
static void request_hash(const struct http_request *req, char out[65])
{
    const void *parts[] = {req->method, req->path, req->body};
    size_t lens[] = {strlen(req->method) + 1, strlen(req->path) + 1, req->body_len};
    sha256_hex_parts(parts, lens, 3, out);
}

int idempotency_begin(struct http_request *req, struct idempotency *idem)
{
    memset(idem, 0, sizeof *idem);
    const char *key = http_header(req, "Idempotency-Key");
    if (!key)
        return 0;
    size_t n = strlen(key);
    int printable = n > 0 && n < sizeof idem->key;
    for (size_t i = 0; printable && i < n; i++)
        printable = key[i] > ' ' && key[i] < 0x7f;
    if (!printable) {
        http_error(req, ERR_INVALID_FIELD, "Idempotency-Key",
                   "Idempotency-Key must be 1 to 255 printable characters without spaces");
        return 1;
    }
    memcpy(idem->key, key, n + 1);
    request_hash(req, idem->hash);
    struct store *s = store_thread();
    char stored_hash[65];
    int status;
    char *response;
    int rc = s ? store_idempotency_get(s, req->user_id, idem->key, stored_hash, &status, idem->location, &response)
               : STORE_ERROR;
    if (rc == STORE_NOT_FOUND)
        return 0;
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return 1;
    }
    if (strcmp(stored_hash, idem->hash) != 0)
        http_error(req, ERR_IDEMPOTENCY_KEY_REUSED, "Idempotency-Key", NULL);
    else
        idempotency_replay(req, idem, status, response);
    free(response);
    return 1;
}

void idempotency_replay(struct http_request *req, const struct idempotency *idem, int status, const char *body)
{
    http_add_header(req, "Idempotent-Replayed", "true");
    if (idem->location[0])
        http_add_header(req, "Location", idem->location);
    http_reply_raw(req, (unsigned)status, "application/json", body, strlen(body));
}

int idempotency_twin(struct store *s, const struct http_request *req, struct idempotency *idem, int *status,
                     char **body)
{
    *body = NULL;
    if (!idem->key[0])
        return IDEM_NONE;
    char stored[65];
    int rc = store_idempotency_get(s, req->user_id, idem->key, stored, status, idem->location, body);
    if (rc == STORE_NOT_FOUND)
        return IDEM_NONE;
    if (rc != STORE_OK)
        return rc;
    if (strcmp(stored, idem->hash) == 0)
        return IDEM_REPLAY;
    free(*body);
    *body = NULL;
    return IDEM_REUSED;
}

int idempotency_record(struct store *s, const struct http_request *req, const struct idempotency *idem, int status,
                       const char *body)
{
    if (!idem->key[0])
        return STORE_OK;
    /* A concurrent twin with the same key commits first: STORE_CONFLICT
     * rolls this one back, and the client's retry replays the twin's answer. */
    return store_idempotency_put(s, req->user_id, idem->key, idem->hash, status, idem->location, body, clock_now());
}
