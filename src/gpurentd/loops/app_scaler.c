/* app_scaler.c: the app marketplace's auto-scaler (issue 17), on its own
 * thread: every app_scale_interval_ms (or when a gateway's report wakes
 * it), each app's replicas are brought to what the gateways' reported
 * demand asks for (domain/apps.c decides, each app in its own transaction),
 * and the reconciler is woken to drive the agents. */
#include "domain/apps.h"
#include "gpurent/clock.h"
#include "loops/loops.h"
#include "store/store.h"

#include <stdlib.h>

static struct bg_loop loop = BG_LOOP_INIT("app-scaler");

struct scale_ctx {
    struct app *a;
    int changed;
};

static int scale_txn(struct store *s, void *vctx)
{
    struct scale_ctx *ctx = vctx;
    /* Re-read inside the transaction: a PATCH may have changed the bounds. */
    struct app fresh;
    int rc = store_app_get_by_id(s, ctx->a->id, &fresh);
    if (rc != STORE_OK)
        return rc;
    rc = fresh.deleted_at ? STORE_OK : app_scale(s, &fresh, clock_now(), &ctx->changed);
    store_app_free(&fresh);
    return rc;
}

/* One pass over every live app; an app whose pass fails is logged and
 * the others go on. */
static void scale_pass(struct store *s)
{
    struct app *apps;
    size_t n;
    if (store_app_all(s, &apps, &n) != STORE_OK)
        return;
    int changed = 0;
    for (size_t i = 0; i < n; i++) {
        struct scale_ctx ctx = {.a = &apps[i]};
        int rc = store_txn(s, scale_txn, &ctx);
        if (rc != STORE_OK)
            log_warn("app-scaler: %s: pass failed (%d)", apps[i].slug, rc);
        changed |= ctx.changed;
        store_app_free(&apps[i]);
    }
    free(apps);
    if (changed)
        reconciler_wake();
}

static void *scaler_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    for (;;) {
        if (s)
            scale_pass(s);
        if (loop_sleep(&loop, daemon_config->app_scale_interval_ms))
            return NULL;
    }
}

int app_scaler_start(void)
{
    return loop_start(&loop, scaler_main);
}

void app_scaler_wake(void)
{
    loop_wake(&loop);
}

void app_scaler_stop(void)
{
    loop_stop(&loop);
}
