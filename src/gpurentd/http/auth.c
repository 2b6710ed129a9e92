/* auth.c: bearer API keys. Finds the key by the id inside the token, then
 * compares the secret's hash in constant time, so neither a wrong secret nor
 * an unknown key tells an attacker anything by timing the database. */
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

int auth_authenticate(struct http_request *req, enum http_auth level)
{
    const char *h = http_header(req, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
        http_error(req, ERR_UNAUTHORIZED, NULL, NULL);
        return -1;
    }
    const char *token = h + 7;
    while (*token == ' ')
        token++;
    /* A header value ends without blanks (RFC 9110), but libmicrohttpd
     * leaves trailing ones in place; they are not part of the token. */
    size_t n = strlen(token);
    while (n > 0 && (token[n - 1] == ' ' || token[n - 1] == '\t'))
        n--;
    char trimmed[API_TOKEN_LEN + 2]; /* a spare byte keeps a longer token too long */
    snprintf(trimmed, sizeof trimmed, "%.*s", (int)n, token);
    char key_id[ID_MAX];
    unsigned char presented[API_SECRET_HASH_LEN];
    if (api_key_parse(trimmed, key_id, presented) < 0) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is malformed");
        return -1;
    }
    struct store *s = store_thread();
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the database is not available");
        return -1;
    }
    struct api_key key;
    struct user user;
    int rc = store_api_key_get(s, key_id, &key);
    if (rc == STORE_NOT_FOUND ||
        (rc == STORE_OK && (!api_key_hash_equal(presented, key.secret_hash) || key.revoked_at))) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is unknown or revoked");
        return -1;
    }
    if (rc != STORE_OK || store_user_get(s, key.user_id, &user) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    if (!user.active) {
        http_error(req, ERR_ACCOUNT_DISABLED, NULL, NULL);
        return -1;
    }
    memcpy(req->user_id, user.id, sizeof req->user_id);
    memcpy(req->key_id, key.id, sizeof req->key_id);
    req->is_admin = user.role == ROLE_ADMIN;
    if (level == AUTH_ADMIN && !req->is_admin) {
        http_error(req, ERR_FORBIDDEN, NULL, "this route needs an admin API key");
        return -1;
    }
    return 0;
}
