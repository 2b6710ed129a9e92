/* api_health.c: GET /healthz (the process answers), GET /readyz (it can
 * serve: database reachable and migrated) and GET /v1/openapi.json. */
#include "embedded.h"
#include "gpurent/clock.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>

void api_healthz(struct http_request *req)
{
    req->routine = 1;
    json_t *body = json_pack("{s:s, s:s, s:I}", "status", "ok", "clock", clock_is_testing() ? "testing" : "system",
                             "time", (json_int_t)clock_now());
    if (clock_is_testing())
        json_object_set_new(body, "warning",
                            json_string("TESTING CLOCK IN USE: time comes from a file, not the system clock"));
    http_reply_json(req, 200, body);
}

#define DISK_FULL_REASON "the database's file system is full: writes are refused until space returns"

int api_unavailable_cause(char *why, size_t whylen)
{
    if (!store_disk_full_lately())
        return 0;
    snprintf(why, whylen, "%s", DISK_FULL_REASON);
    return 1;
}

void api_readyz(struct http_request *req)
{
    req->routine = 1;
    struct store *s = store_thread();
    int version = s ? store_schema_version(s) : -1;
    if (version != store_latest_version()) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the database is not reachable or not migrated");
        return;
    }
    if (store_disk_full()) {
        http_error_ext(req, ERR_UNAVAILABLE, NULL, json_pack("{s:{s:s}}", "checks", "storage", "full"), "%s",
                       DISK_FULL_REASON);
        return;
    }
    /* Users whose billing keeps failing run unbilled: said here for the
     * operator, though the daemon still serves everyone else (readiness is
     * whether to send it traffic, and the API is fine). */
    struct billing_failures bf;
    billing_failures(&bf);
    json_t *billing = json_pack("{s:s, s:I, s:I}", "status", bf.users_repeated ? "failing" : "ok", "users_failing",
                                (json_int_t)bf.users, "users_failing_repeatedly", (json_int_t)bf.users_repeated);
    http_reply_json(
        req, 200,
        json_pack("{s:s, s:i, s:{s:o}}", "status", "ready", "schema_version", version, "checks", "billing", billing));
}

void api_openapi(struct http_request *req)
{
    http_reply_raw(req, 200, "application/json", embedded_openapi_json, strlen(embedded_openapi_json));
}
