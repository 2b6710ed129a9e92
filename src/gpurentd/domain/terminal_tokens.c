/* terminal_tokens.c: the short-lived, single-use tokens that authorise a
 * browser's web terminal WebSocket (a browser cannot send an API key with
 * one). Each is bound to a user, the API key that asked for it (so a key
 * revoked in the meantime spends its tokens too), an instance and a rank,
 * and only its
 * SHA-256 is kept, in memory: a token lives terminal_token_ttl_s (a minute
 * by default), so one lost with a restart costs the console a new request,
 * and nothing of it reaches the database or its backups. */
#include "domain/domain.h"
#include "gpurent/clock.h"
#include "gpurent/secrets.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Tokens outstanding at once, everyone's together, and per user: bounds
 * the table however fast keys ask. */
#define TOKENS_MAX 4096
#define TOKENS_PER_USER 64

struct token_entry {
    int used;                  /* the slot holds a live token */
    char hash[65];             /* SHA-256 of the token, hex */
    char user_id[ID_MAX];
    char key_id[ID_MAX];
    char instance_id[ID_MAX];
    int64_t rank;
    int64_t expires_at;        /* clock_now() seconds */
};

static struct token_entry tokens[TOKENS_MAX];
static pthread_mutex_t tokens_lock = PTHREAD_MUTEX_INITIALIZER;

int terminal_token_issue(const char *user_id, const char *key_id, const char *instance_id, int64_t rank,
                         int64_t ttl_s, char token[TERMINAL_TOKEN_MAX], int64_t *expires_at)
{
    unsigned char raw[32];
    if (random_bytes(raw, sizeof raw) < 0)
        return -2;
    memcpy(token, "trm_", 4);
    hex_encode(raw, sizeof raw, token + 4);
    secret_wipe(raw, sizeof raw);
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    int64_t now = clock_now();
    pthread_mutex_lock(&tokens_lock);
    int free_slot = -1, mine = 0;
    for (int i = 0; i < TOKENS_MAX; i++) {
        if (tokens[i].used && tokens[i].expires_at <= now)
            memset(&tokens[i], 0, sizeof tokens[i]); /* expired: never taken now */
        if (!tokens[i].used && free_slot < 0)
            free_slot = i;
        if (tokens[i].used && strcmp(tokens[i].user_id, user_id) == 0)
            mine++;
    }
    if (free_slot < 0 || mine >= TOKENS_PER_USER) {
        pthread_mutex_unlock(&tokens_lock);
        return -1;
    }
    struct token_entry *e = &tokens[free_slot];
    e->used = 1;
    snprintf(e->hash, sizeof e->hash, "%s", hash);
    snprintf(e->user_id, sizeof e->user_id, "%s", user_id);
    snprintf(e->key_id, sizeof e->key_id, "%s", key_id);
    snprintf(e->instance_id, sizeof e->instance_id, "%s", instance_id);
    e->rank = rank;
    e->expires_at = now + ttl_s;
    *expires_at = e->expires_at;
    pthread_mutex_unlock(&tokens_lock);
    return 0;
}

enum terminal_token_result terminal_token_take(const char *token, const char *instance_id, char user_id[ID_MAX],
                                               char key_id[ID_MAX], int64_t *rank)
{
    if (strlen(token) != TERMINAL_TOKEN_MAX - 1 || strncmp(token, "trm_", 4) != 0)
        return TOKEN_UNKNOWN;
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    int64_t now = clock_now();
    enum terminal_token_result r = TOKEN_UNKNOWN;
    pthread_mutex_lock(&tokens_lock);
    for (int i = 0; i < TOKENS_MAX; i++) {
        struct token_entry *e = &tokens[i];
        if (!e->used || !secret_equal(e->hash, hash, 64))
            continue;
        /* Taken whatever the outcome: a token is shown once. */
        if (e->expires_at <= now)
            r = TOKEN_EXPIRED;
        else if (strcmp(e->instance_id, instance_id) != 0)
            r = TOKEN_OTHER_INSTANCE;
        else {
            r = TOKEN_OK;
            snprintf(user_id, ID_MAX, "%s", e->user_id);
            snprintf(key_id, ID_MAX, "%s", e->key_id);
            *rank = e->rank;
        }
        memset(e, 0, sizeof *e);
        break;
    }
    pthread_mutex_unlock(&tokens_lock);
    return r;
}
