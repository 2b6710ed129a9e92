/* api_error.h: the one table of error codes. Each code has a stable name that
 * clients may match on, one HTTP status and a default message; every error
 * body is {"error": {"code", "message", "field"}}. Add codes at the end. */
#ifndef GPURENT_API_ERROR_H
#define GPURENT_API_ERROR_H

enum api_error {
    ERR_MALFORMED_JSON,         /* body is not JSON */
    ERR_INVALID_ENCODING,       /* body is not UTF-8 */
    ERR_NOT_AN_OBJECT,          /* body is JSON but not an object */
    ERR_TOO_DEEP,               /* nesting deeper than the configured cap */
    ERR_DUPLICATE_KEY,          /* an object repeats a key */
    ERR_UNKNOWN_FIELD,          /* a field the endpoint does not take */
    ERR_MISSING_FIELD,          /* a required field is absent */
    ERR_INVALID_FIELD,          /* wrong type or a value out of range */
    ERR_INVALID_QUERY,          /* a bad query-string parameter */
    ERR_BODY_TOO_LARGE,         /* body over the configured cap */
    ERR_URI_TOO_LONG,           /* path over the configured cap */
    ERR_UNAUTHORIZED,           /* no or bad API key */
    ERR_INVALID_CREDENTIALS,    /* wrong email or password */
    ERR_FORBIDDEN,              /* authenticated, but not allowed */
    ERR_ACCOUNT_DISABLED,       /* the account is disabled */
    ERR_NOT_FOUND,              /* no such route or object (or not yours) */
    ERR_METHOD_NOT_ALLOWED,     /* route exists, method does not */
    ERR_EMAIL_TAKEN,            /* sign-up with an email already registered */
    ERR_CONFLICT,               /* the object's state forbids this */
    ERR_TOO_MANY_REQUESTS,      /* rate limited; see Retry-After */
    ERR_INTERNAL,               /* our fault; logged with the request id */
    ERR_UNAVAILABLE,            /* not ready or shutting down */
    ERR_INVALID_INVITE_CODE,    /* invite code unknown, expired or used up */
    ERR_BAD_SIGNATURE,          /* agent: request signature missing, wrong, stale or replayed */
    ERR_INSUFFICIENT_CAPACITY,  /* not enough free cards right now */
    ERR_QUOTA_EXCEEDED,         /* the user's card quota would be exceeded */
    ERR_STACK_MISMATCH,         /* a ROCm image on a CUDA type, or the reverse */
    ERR_RESERVATION_REQUIRED,   /* the GPU type is rented through reservations only */
    ERR_INVALID_STATE,          /* the instance's state does not allow this */
    ERR_IDEMPOTENCY_KEY_REUSED, /* the Idempotency-Key was used with another request */
    ERR_VOLUME_IN_USE,          /* the volume is used by an instance */
    ERR_NAME_TAKEN,             /* a resource of that name exists */
    ERR_INSUFFICIENT_FUNDS,     /* funds do not cover a minimum run */
    ERR_SSH_KEY_EXISTS,         /* the account already has this SSH key */
    ERR_SSH_KEY_LIMIT,          /* the account has max_ssh_keys_per_user keys */
    ERR_BAD_REQUEST,            /* the HTTP request itself is malformed (framing, NUL bytes, no Host) */
    ERR_HEADERS_TOO_LARGE,      /* request headers over the cap */
    ERR_NOT_IMPLEMENTED,        /* a transfer coding the server does not implement */
    ERR_EMAIL_NOT_VERIFIED,     /* the account's e-mail address is not verified yet */
    ERR_HTTP_VERSION,           /* an HTTP version other than 1.0 and 1.1 */
    ERR_UNSUPPORTED_MEDIA_TYPE, /* a body not sent as JSON, or content-encoded */
    ERR_INVALID_RESET_CODE,     /* a password reset code that is wrong, expired, used or worn out */
    ERR_COUNT
};

struct api_error_info {
    const char *code;    /* stable machine name, e.g. "missing_field" */
    unsigned status;     /* HTTP status */
    const char *message; /* default human message */
};

const struct api_error_info *api_error_info(enum api_error e);

#endif
