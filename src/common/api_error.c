/* api_error.c: the error table behind api_error.h. */
#include "gpurent/api_error.h"

static const struct api_error_info errors[ERR_COUNT] = {
    [ERR_MALFORMED_JSON] = {"malformed_json", 400, "the request body is not valid JSON"},
    [ERR_INVALID_ENCODING] = {"invalid_encoding", 400, "the request body is not valid UTF-8"},
    [ERR_NOT_AN_OBJECT] = {"not_an_object", 400, "the request body must be a JSON object"},
    [ERR_TOO_DEEP] = {"too_deep", 400, "the request body is nested too deeply"},
    [ERR_DUPLICATE_KEY] = {"duplicate_key", 400, "an object in the request body repeats a key"},
    [ERR_UNKNOWN_FIELD] = {"unknown_field", 400, "the request has a field this endpoint does not take"},
    [ERR_MISSING_FIELD] = {"missing_field", 400, "a required field is missing"},
    [ERR_INVALID_FIELD] = {"invalid_field", 400, "a field has the wrong type or value"},
    [ERR_INVALID_QUERY] = {"invalid_query", 400, "a query parameter is invalid"},
    [ERR_BODY_TOO_LARGE] = {"body_too_large", 413, "the request body is too large"},
    [ERR_URI_TOO_LONG] = {"uri_too_long", 414, "the request path is too long"},
    [ERR_UNAUTHORIZED] = {"unauthorized", 401, "a valid API key is required (Authorization: Bearer KEY)"},
    [ERR_INVALID_CREDENTIALS] = {"invalid_credentials", 401, "wrong email or password"},
    [ERR_FORBIDDEN] = {"forbidden", 403, "this API key may not do that"},
    [ERR_ACCOUNT_DISABLED] = {"account_disabled", 403, "this account is disabled"},
    [ERR_NOT_FOUND] = {"not_found", 404, "no such resource"},
    [ERR_METHOD_NOT_ALLOWED] = {"method_not_allowed", 405, "this resource does not take that method"},
    [ERR_EMAIL_TAKEN] = {"email_taken", 409, "an account with this email already exists"},
    [ERR_CONFLICT] = {"conflict", 409, "the resource's current state does not allow this"},
    [ERR_TOO_MANY_REQUESTS] = {"too_many_requests", 429, "too many attempts; retry later"},
    [ERR_INTERNAL] = {"internal", 500, "internal error; quote the request id when reporting it"},
    [ERR_UNAVAILABLE] = {"unavailable", 503, "the service is not available right now"},
    [ERR_INVALID_INVITE_CODE] = {"invalid_invite_code", 400, "the invite code is unknown, expired or used up"},
    [ERR_BAD_SIGNATURE] = {"bad_signature", 401, "the request signature is missing, wrong, stale or replayed"},
    [ERR_INSUFFICIENT_CAPACITY] = {"insufficient_capacity", 409, "not enough free cards of that type right now"},
    [ERR_QUOTA_EXCEEDED] = {"quota_exceeded", 403, "this would exceed your card quota"},
    [ERR_STACK_MISMATCH] = {"stack_mismatch", 400, "the image's software stack does not match the GPU type"},
    [ERR_RESERVATION_REQUIRED] = {"reservation_required", 403, "this GPU type is rented through reservations only"},
    [ERR_INVALID_STATE] = {"invalid_state", 409, "the instance's current state does not allow this"},
    [ERR_IDEMPOTENCY_KEY_REUSED] = {"idempotency_key_reused", 422, "this Idempotency-Key was used for another request"},
    [ERR_VOLUME_IN_USE] = {"volume_in_use", 409, "the volume is used by an instance"},
    [ERR_NAME_TAKEN] = {"name_taken", 409, "a resource with this name already exists"},
    [ERR_INSUFFICIENT_FUNDS] = {"insufficient_funds", 402, "your funds do not cover a minimum run"},
    [ERR_SSH_KEY_EXISTS] = {"ssh_key_exists", 409, "this SSH key is already on your account"},
    [ERR_SSH_KEY_LIMIT] = {"ssh_key_limit", 409, "your account has as many SSH keys as it may hold"},
    [ERR_BAD_REQUEST] = {"bad_request", 400, "the HTTP request is malformed"},
    [ERR_HEADERS_TOO_LARGE] = {"headers_too_large", 431, "the request headers are too large"},
    [ERR_NOT_IMPLEMENTED] = {"not_implemented", 501, "the server does not implement this"},
    [ERR_EMAIL_NOT_VERIFIED] = {"email_not_verified", 403,
                                "verify your e-mail address first (POST /v1/verify-email with the code we sent)"},
    [ERR_HTTP_VERSION] = {"http_version_not_supported", 505, "only HTTP/1.0 and HTTP/1.1 are served"},
    [ERR_UNSUPPORTED_MEDIA_TYPE] = {"unsupported_media_type", 415,
                                    "a request body must be JSON, sent with Content-Type: application/json"},
    [ERR_INVALID_RESET_CODE] = {"invalid_reset_code", 400,
                                "this password reset code does not work (wrong, expired, used, or tried too often);"
                                " ask for a new one"},
};

const struct api_error_info *api_error_info(enum api_error e)
{
    if ((unsigned)e >= ERR_COUNT)
        e = ERR_INTERNAL;
    return &errors[e];
}
