/* paging.c: the pagination every list endpoint shares: `limit` and an
 * opaque `cursor` in, `next_cursor` out. A cursor names the last row of a
 * page by its sort key (a time or sequence number, and an id). */
#include "gpurent/jsonx.h"
#include "http/api.h"

#include <string.h>

int page_begin(struct http_request *req, int64_t max, int64_t def, struct page *p)
{
    memset(p, 0, sizeof *p);
    p->after_t = -1;
    if (http_query_int(req, "limit", 1, max, def, &p->limit) < 0)
        return -1;
    const char *cursor = http_query(req, "cursor");
    if (cursor && cursor_decode(cursor, &p->after_t, p->after_id, sizeof p->after_id) < 0) {
        http_error(req, ERR_INVALID_QUERY, "cursor", "cursor is not one this API returned");
        return -1;
    }
    return 0;
}

size_t page_shown(const struct page *p, size_t fetched)
{
    return fetched > (size_t)p->limit ? (size_t)p->limit : fetched;
}

json_t *page_cursor(int64_t last_t, const char *last_id)
{
    char c[CURSOR_MAX];
    cursor_encode(last_t, last_id, c);
    return json_string(c);
}
