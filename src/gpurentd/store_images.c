/* store_images.c: SQL for the image catalog. */
#include "store.h"

#include <stdio.h>

static const char SQL_IMAGE_LIST[] = "SELECT id, ref, stack, description, created_at FROM images ORDER BY ref LIMIT ?";
static const char SQL_IMAGE_FIND[] =
    "SELECT id, ref, stack, description, created_at FROM images WHERE id = ?1 OR ref = ?1";
static const char SQL_IMAGE_INSERT[] =
    "INSERT INTO images (id, ref, stack, description, created_at) VALUES (?, ?, ?, ?, ?)";
static const char SQL_IMAGE_DELETE[] = "DELETE FROM images WHERE id = ?";

static void read_image(sqlite3_stmt *st, struct image *img)
{
    store_column_text(img->id, sizeof img->id, st, 0);
    store_column_text(img->ref, sizeof img->ref, st, 1);
    store_column_text(img->stack, sizeof img->stack, st, 2);
    store_column_text(img->description, sizeof img->description, st, 3);
    img->created_at = sqlite3_column_int64(st, 4);
}

int store_image_list(struct store *s, struct image *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_IMAGE_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)max);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < max)
        read_image(st, &out[(*n)++]);
    int result = rc == SQLITE_DONE || rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "list images");
    sqlite3_reset(st);
    return result;
}

int store_image_find(struct store *s, const char *id_or_ref, struct image *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_IMAGE_FIND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id_or_ref, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), result;
    if (rc == SQLITE_ROW) {
        read_image(st, out);
        result = STORE_OK;
    } else {
        result = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "find image");
    }
    sqlite3_reset(st);
    return result;
}

int store_image_insert(struct store *s, const struct image *img)
{
    sqlite3_stmt *st = store_stmt(s, SQL_IMAGE_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, img->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, img->ref, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, img->stack, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, img->description, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, img->created_at);
    return store_step_write(s, st, "insert image");
}

int store_image_delete(struct store *s, const char *id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_IMAGE_DELETE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "delete image");
}
