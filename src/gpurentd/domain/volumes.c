/* volumes.c: what a new volume is (its id and the source every node mounts,
 * rendered from volume_source_template) and each user's default "shared"
 * volume, which creating an instance makes on first use. */
#include "domain/domain.h"
#include "gpurent/clock.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>

#define DEFAULT_VOLUME "shared"

/* Renders volume_source_template for a new volume. */
static int render_source(const char *user_id, const char *volume_id, char *out, size_t n)
{
    const char *t = daemon_config->volume_source_template;
    size_t o = 0;
    while (*t) {
        const char *value = NULL;
        size_t skip = 0;
        if (strncmp(t, "{volume_id}", 11) == 0)
            value = volume_id, skip = 11;
        else if (strncmp(t, "{user_id}", 9) == 0)
            value = user_id, skip = 9;
        if (value) {
            size_t len = strlen(value);
            if (o + len >= n)
                return -1;
            memcpy(out + o, value, len);
            o += len;
            t += skip;
        } else {
            if (o + 1 >= n)
                return -1;
            out[o++] = *t++;
        }
    }
    out[o] = '\0';
    return 0;
}

int volume_limit_check(struct store *s, const char *user_id, int64_t size_gb, char *why, size_t whylen)
{
    int64_t max_count, max_gb, count, gb;
    int rc = store_user_volume_limits(s, user_id, daemon_config->default_max_volumes,
                                      daemon_config->default_max_volume_gb, &max_count, &max_gb);
    if (rc == STORE_OK)
        rc = store_user_volume_usage(s, user_id, &count, &gb);
    if (rc != STORE_OK)
        return rc;
    if (count + 1 > max_count) {
        if (why)
            snprintf(why, whylen, "your account may hold at most %lld volumes and has %lld; delete one first",
                     (long long)max_count, (long long)count);
        return VOLUME_OVER_LIMIT;
    }
    if (gb + size_gb > max_gb) {
        if (why)
            snprintf(why, whylen,
                     "your volumes may hold at most %lld GB together; you have %lld GB, so this one may have at most %lld",
                     (long long)max_gb, (long long)gb, (long long)(max_gb > gb ? max_gb - gb : 0));
        return VOLUME_OVER_LIMIT;
    }
    return STORE_OK;
}

int volume_create(struct store *s, const char *user_id, const char *name, int64_t size_gb, struct volume *v)
{
    return volume_create_in(s, user_id, name, size_gb, "", v);
}

int volume_create_in(struct store *s, const char *user_id, const char *name, int64_t size_gb, const char *region,
                     struct volume *v)
{
    memset(v, 0, sizeof *v);
    int rc = volume_limit_check(s, user_id, size_gb, NULL, 0);
    if (rc != STORE_OK)
        return rc;
    snprintf(v->region, sizeof v->region, "%s", region);
    if (id_new("vol", v->id) < 0)
        return STORE_ERROR;
    snprintf(v->user_id, sizeof v->user_id, "%s", user_id);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->size_gb = size_gb;
    v->created_at = clock_now();
    if (render_source(user_id, v->id, v->source, sizeof v->source) < 0)
        return STORE_ERROR;
    return store_volume_insert(s, v);
}

int volume_default(struct store *s, const char *user_id, char id_out[ID_MAX])
{
    int rc = store_volume_id_by_name(s, user_id, DEFAULT_VOLUME, id_out);
    if (rc != STORE_NOT_FOUND)
        return rc;
    struct volume v;
    if ((rc = volume_create(s, user_id, DEFAULT_VOLUME, daemon_config->volume_default_size_gb, &v)) == STORE_OK)
        memcpy(id_out, v.id, ID_MAX);
    return rc;
}
