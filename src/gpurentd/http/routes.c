/* routes.c: every route gpurentd serves, in one table. Keep docs/openapi.json
 * in step: a unit test checks that each route here is described there. */
#include "http/api.h"

/* A route that takes no query parameters refuses any (http_route.query):
 * "?force=1" or a misspelt "?limt=5" must not pass unnoticed. The others
 * check theirs in the handler; health, metrics and the console's files
 * ignore the query, as probes, scrapers and browsers may add one. */
#define NO_QUERY         http_no_query
#define QUERY_IN_HANDLER NULL

const struct http_route daemon_routes[] = {
    {"GET",    "/healthz",                    api_healthz,             AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/readyz",                     api_readyz,              AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/v1/openapi.json",            api_openapi,             AUTH_NONE, NO_QUERY},
    {"GET",    "/metrics",                    api_metrics,             AUTH_ADMIN, QUERY_IN_HANDLER},

    {"GET",    "/",                           api_console_root,        AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/console",                    api_console_index,       AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/console/{file}",             api_console_file,        AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/console/{dir}/{file}",       api_console_file,        AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/console/{dir}/{sub}/{file}", api_console_file,        AUTH_NONE, QUERY_IN_HANDLER},

    {"POST",   "/v1/signup",                  api_signup,              AUTH_NONE, NO_QUERY},
    {"POST",   "/v1/login",                   api_login,               AUTH_NONE, NO_QUERY},
    {"GET",    "/v1/me",                      api_me,                  AUTH_USER, NO_QUERY},
    {"POST",   "/v1/verify-email",            api_verify_email,        AUTH_NONE, NO_QUERY},
    {"POST",   "/v1/verify-email/resend",     api_verify_email_resend, AUTH_USER, NO_QUERY},

    {"POST",   "/v1/api-keys",                api_keys_create,         AUTH_USER, NO_QUERY},
    {"GET",    "/v1/api-keys",                api_keys_list,           AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/api-keys/{id}",           api_keys_get,            AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/api-keys/{id}",           api_keys_revoke,         AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/api-keys",                api_keys_revoke_all,     AUTH_USER, QUERY_IN_HANDLER},
    {"POST",   "/v1/me/password",             api_me_password,         AUTH_USER, NO_QUERY},
    {"POST",   "/v1/password-reset",          api_password_reset,      AUTH_NONE, NO_QUERY},
    {"POST",   "/v1/password-reset/confirm",  api_password_reset_confirm, AUTH_NONE, NO_QUERY},

    {"GET",    "/v1/gpu-types",               api_gpu_types_list,      AUTH_NONE, NO_QUERY},
    {"PUT",    "/v1/admin/gpu-types/{code}",  api_gpu_types_put,       AUTH_ADMIN, NO_QUERY},
    {"DELETE", "/v1/admin/gpu-types/{code}",  api_gpu_types_delete,    AUTH_ADMIN, NO_QUERY},

    {"POST",   "/v1/admin/nodes",             api_nodes_create,        AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/nodes",             api_nodes_list,          AUTH_ADMIN, QUERY_IN_HANDLER},
    {"GET",    "/v1/admin/nodes/{id}",        api_nodes_get,           AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/admin/nodes/{id}/state",  api_nodes_set_state,     AUTH_ADMIN, NO_QUERY},
    {"DELETE", "/v1/admin/nodes/{id}",        api_nodes_delete,        AUTH_ADMIN, NO_QUERY},
    {"PATCH",  "/v1/admin/nodes/{id}",        api_nodes_patch,         AUTH_ADMIN, NO_QUERY},

    {"GET",    "/v1/images",                  api_images_list,         AUTH_NONE, NO_QUERY},
    {"POST",   "/v1/admin/images",            api_images_create,       AUTH_ADMIN, NO_QUERY},
    {"DELETE", "/v1/admin/images/{id}",       api_images_delete,       AUTH_ADMIN, NO_QUERY},

    {"POST",   "/v1/volumes",                 api_volumes_create_verified, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/volumes",                 api_volumes_list,        AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/volumes/{id}",            api_volumes_get,         AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/volumes/{id}",            api_volumes_delete,      AUTH_USER, NO_QUERY},

    {"POST",   "/v1/reservations",            api_reservations_create, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/reservations",            api_reservations_list,   AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/reservations/availability", api_reservations_availability, AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/reservations/{id}",       api_reservations_get,    AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/reservations/{id}",       api_reservations_cancel, AUTH_USER, NO_QUERY},

    {"POST",   "/v1/instances",               api_instances_create_verified, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/instances",               api_instances_list,      AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/instances/{id}",          api_instances_get,       AUTH_USER, NO_QUERY},
    {"PATCH",  "/v1/instances/{id}",          api_instances_patch,     AUTH_USER, NO_QUERY},
    {"POST",   "/v1/instances/{id}/start",    api_instances_start_verified, AUTH_USER, NO_QUERY},
    {"POST",   "/v1/instances/{id}/stop",     api_instances_stop,      AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/instances/{id}",          api_instances_terminate, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/instances/{id}/events",   api_instances_events,    AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/instances/{id}/ssh-config", api_instances_ssh_config, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/instances/{id}/logs",     api_instances_logs,      AUTH_USER, QUERY_IN_HANDLER},
    {"POST",   "/v1/instances/{id}/terminal-tokens", api_terminal_tokens_create, AUTH_USER, NO_QUERY},
    /* The token in the query authorises it: a browser WebSocket carries no key. */
    {"GET",    "/v1/instances/{id}/terminal", api_instances_terminal,  AUTH_NONE, QUERY_IN_HANDLER},

    {"POST",   "/v1/ssh-keys",                api_ssh_keys_create,     AUTH_USER, NO_QUERY},
    {"GET",    "/v1/ssh-keys",                api_ssh_keys_list,       AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/ssh-keys/{id}",           api_ssh_keys_get,        AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/ssh-keys/{id}",           api_ssh_keys_delete,     AUTH_USER, NO_QUERY},

    {"PUT",    "/v1/admin/users/{id}/limits", api_users_set_limits,    AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/users",             api_admin_users_find,    AUTH_ADMIN, QUERY_IN_HANDLER},
    {"POST",   "/v1/admin/users/{id}/suspend", api_admin_users_suspend, AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/admin/users/{id}/reinstate", api_admin_users_reinstate, AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/signups",           api_admin_signups,       AUTH_ADMIN, QUERY_IN_HANDLER},

    {"GET",    "/v1/balance",                 api_balance_get,         AUTH_USER, NO_QUERY},
    {"GET",    "/v1/transactions",            api_transactions_list,   AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/usage",                   api_usage_get,           AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/statements/{month}",      api_statements_get,      AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/v1/prices",                  api_prices_list,         AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/v1/estimate",                api_estimate_get,        AUTH_NONE, QUERY_IN_HANDLER},
    {"PUT",    "/v1/admin/prices/{gpu_type}", api_prices_put,          AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/storage-prices",          api_storage_prices_list, AUTH_NONE, QUERY_IN_HANDLER},
    {"PUT",    "/v1/admin/storage-prices/{region}", api_storage_prices_put, AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/invite-codes/redeem",     api_invite_redeem,       AUTH_USER, NO_QUERY},
    {"POST",   "/v1/admin/invite-codes",      api_invite_codes_create, AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/invite-codes",      api_invite_codes_list,   AUTH_ADMIN, QUERY_IN_HANDLER},
    {"GET",    "/v1/admin/invite-codes/{code}", api_invite_codes_get,  AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/admin/users/{id}/grants", api_grants_create,       AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/admin/users/{id}/topups", api_topups_create,       AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/users/{id}/grants/{grant_id}", api_grants_get, AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/users/{id}/topups/{topup_id}", api_topups_get, AUTH_ADMIN, NO_QUERY},
    {"POST",   "/v1/payments/webhook",        api_payments_webhook,    AUTH_NONE, NO_QUERY},
    {"POST",   "/v1/admin/billing/run",       api_billing_run,         AUTH_ADMIN, NO_QUERY},
    {"GET",    "/v1/admin/audit",             api_audit_list,          AUTH_ADMIN, QUERY_IN_HANDLER},


    {"POST",   "/v1/apps",                    api_apps_create_verified, AUTH_USER, NO_QUERY},
    {"GET",    "/v1/apps",                    api_apps_list,           AUTH_NONE, QUERY_IN_HANDLER},
    {"GET",    "/v1/apps/{slug}",             api_apps_get,            AUTH_USER, NO_QUERY},
    {"PATCH",  "/v1/apps/{slug}",             api_apps_patch,          AUTH_USER, NO_QUERY},
    {"DELETE", "/v1/apps/{slug}",             api_apps_delete,         AUTH_USER, NO_QUERY},
    {"GET",    "/v1/apps/{slug}/stats",       api_apps_stats,          AUTH_USER, QUERY_IN_HANDLER},
    {"GET",    "/internal/gateway/state",     api_gateway_state,       AUTH_SIGNED, NO_QUERY},
    {"POST",   "/internal/gateway/reports",   api_gateway_reports,     AUTH_SIGNED, NO_QUERY},

    {NULL,     NULL,                          NULL,                    AUTH_NONE, NULL},
};

/* Served on metrics_listen, when set: for a scraper on a private network. */
const struct http_route metrics_routes[] = {
    {"GET", "/metrics", api_metrics, AUTH_NONE, QUERY_IN_HANDLER},
    {NULL,  NULL,       NULL,        AUTH_NONE, NULL},
};
