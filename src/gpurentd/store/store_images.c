/* store_images.c: SQL for the image catalog. */
#include "store/store_sql.h"

#include <stdio.h>

static const char SQL_IMAGE_LIST[] = "SELECT id, ref, stack, description, created_at FROM images ORDER BY ref LIMIT ?";
static const char SQL_IMAGE_FIND[] =
    "SELECT id, ref, stack, description, created_at FROM images WHERE id = ?1 OR ref = ?1";
static const char SQL_IMAGE_INSERT[] =
    "INSERT INTO images (id, ref, stack, description, created_at) VALUES (?, ?, ?, ?, ?)";
static const char SQL_IMAGE_DELETE[] = "DELETE FROM images WHERE id = ?";

static void read_image(sqlite3_stmt *st, void *row)
{
    struct image *img = row;
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
    return store_read_rows(s, st, out, sizeof *out, max, n, read_image, "list images");
}

int store_image_find(struct store *s, const char *id_or_ref, struct image *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_IMAGE_FIND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id_or_ref, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_image, "find image");
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
