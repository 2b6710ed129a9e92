/* gang.c: the rules of multi-node instances (issue 12) that create and
 * start apply: the rendezvous bound, a /shared every node of the instance
 * really shares, the instance-internal SSH key pair its ranks log in to each
 * other with; and which address other ranks reach a node at. */
#include "domain/domain.h"
#include "domain/placement.h"
#include "gpurent/secrets.h"
#include "gpurent/url.h"
#include "store/store.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void node_data_address(const char *data_host, const char *data_address, const char *public_host,
                       const char *agent_url, char *out, size_t n)
{
    if (data_host[0])
        snprintf(out, n, "%s", data_host);
    else if (data_address[0])
        snprintf(out, n, "%s", data_address);
    else
        node_connect_host(public_host, agent_url, out, n);
}

int instance_multi_node(int64_t card_count)
{
    return card_count > PLACEMENT_NODE_CARDS;
}

/* A source that is a path is a directory on each node, not one store the
 * nodes share: rank 1 would not see what rank 0 wrote. */
static int volume_check(struct store *s, const struct instance *in, struct op_outcome *o)
{
    struct volume v;
    int rc = store_volume_get(s, NULL, in->volume_id, &v);
    if (rc != STORE_OK)
        return rc;
    if (v.source[0] == '/' && !daemon_config->volume_source_shared)
        return op_refuse(o, ERR_CONFLICT, "volume_id", NULL,
                      "volume %s is a directory local to each node (%.120s): an instance of %lld cards spans "
                      "several nodes, which would not share it; ask the operator for a network volume source",
                      v.id, v.source, (long long)in->card_count);
    return STORE_OK;
}

/* Every rank's authorized_keys carries the users' keys and the internal one;
 * agents take at most 64. */
static int keys_check(struct store *s, const struct instance *in, struct op_outcome *o)
{
    char *keys = NULL;
    int rc = store_instance_ssh(s, in->id, &keys, NULL);
    if (rc != STORE_OK)
        return rc;
    json_t *arr = json_loads(keys, 0, NULL);
    size_t n = json_array_size(arr);
    json_decref(arr);
    free(keys);
    if (n >= INSTANCE_MAX_SSH_KEYS)
        return op_refuse(o, ERR_INVALID_FIELD, "ssh_key_ids", NULL,
                      "an instance of more than one node takes at most %d of your SSH keys (its ranks' own key "
                      "takes the last place); name fewer with ssh_key_ids",
                      INSTANCE_MAX_SSH_KEYS - 1);
    return STORE_OK;
}

int instance_gang_prepare(struct store *s, const struct instance *in, int64_t rendezvous_timeout_s,
                          struct op_outcome *o)
{
    int rc;
    if (rendezvous_timeout_s > 0 &&
        (rc = store_instance_set_rendezvous_timeout(s, in->id, rendezvous_timeout_s)) != STORE_OK)
        return rc;
    if ((rc = store_instance_set_rendezvous(s, in->id, 0)) != STORE_OK)
        return rc;
    if (!instance_multi_node(in->card_count))
        return STORE_OK;
    if ((rc = volume_check(s, in, o)) != STORE_OK || (rc = keys_check(s, in, o)) != STORE_OK)
        return rc;
    /* Made once and kept across starts: the ranks' containers are new each
     * start, so nothing of the old key survives anywhere but here. */
    struct instance_gang g;
    if ((rc = store_instance_gang(s, in->id, &g)) != STORE_OK || g.has_key)
        return rc;
    static _Thread_local struct instance_key k;
    char comment[ID_MAX + 16];
    snprintf(comment, sizeof comment, "gpurent-%s", in->id);
    if (ssh_ed25519_keypair(comment, k.pub, sizeof k.pub, k.priv, sizeof k.priv) < 0)
        return STORE_ERROR;
    rc = store_instance_set_internal_key(s, in->id, k.pub, k.priv);
    secret_wipe(&k, sizeof k);
    return rc;
}
