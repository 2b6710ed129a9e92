/* api_images.c: GET /v1/images (public, like the GPU catalog) and the
 * admin's POST /v1/admin/images and DELETE /v1/admin/images/{id}. Images
 * are named by id in URLs because their refs hold '/' and ':'. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>

#define IMAGES_MAX 256

static json_t *image_json(const struct image *img)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", img->id, "ref", img->ref, "stack", img->stack, "description",
                     img->description, "created_at", json_time(img->created_at, 0));
}

void api_images_list(struct http_request *req)
{
    static _Thread_local struct image images[IMAGES_MAX];
    size_t n;
    struct store *s = store_thread();
    if (!s || store_image_list(s, images, IMAGES_MAX, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, image_json(&images[i]));
    /* The catalog first; beside it, whether users may bring their own
     * images and from where (options image_policy, image_registries). */
    json_t *registries = json_array();
    const char *list = daemon_config->image_registries;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (len)
            json_array_append_new(registries, json_stringn(p, len));
        p += len;
    }
    http_reply_json(req, 200, json_pack("{s:o, s:s, s:o}", "data", data, "image_policy", daemon_config->image_policy,
                                        "image_registries", registries));
}

/* An image reference as container runtimes take it: registry/name:tag or
 * @digest, without spaces or shell characters. */
static int ref_valid(const char *ref)
{
    size_t n = strlen(ref);
    if (n == 0 || n > 255 || ref[0] == '-' || ref[0] == '/' || ref[0] == ':')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = ref[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._-/:@+", c)))
            return 0;
    }
    return 1;
}

static int insert_txn(struct store *s, void *img)
{
    return store_image_insert(s, img);
}

void api_images_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"ref",         JSON_KIND_STRING, 1, 255},
        {"stack",       JSON_KIND_STRING, 1, 8  },
        {"description", JSON_KIND_STRING, 0, 512},
        {NULL,          0,                0, 0  },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct image img = {.created_at = clock_now()};
    const char *ref = json_string_value(json_object_get(body, "ref"));
    const char *stack = json_string_value(json_object_get(body, "stack"));
    const char *desc = json_string_value(json_object_get(body, "description"));
    int rc;
    if (!ref_valid(ref))
        http_error(req, ERR_INVALID_FIELD, "ref", "ref must be an image reference such as rocm/pytorch:2.3-rocm6.2");
    else if (strcmp(stack, "ROCm") != 0 && strcmp(stack, "CUDA") != 0)
        http_error(req, ERR_INVALID_FIELD, "stack", "stack must be ROCm or CUDA");
    else if (id_new("img", img.id) < 0)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        snprintf(img.ref, sizeof img.ref, "%s", ref);
        snprintf(img.stack, sizeof img.stack, "%s", stack);
        snprintf(img.description, sizeof img.description, "%s", desc ? desc : "");
        struct store *s = store_thread();
        rc = s ? store_txn(s, insert_txn, &img) : STORE_ERROR;
        if (rc == STORE_CONFLICT)
            http_error(req, ERR_NAME_TAKEN, "ref", "image %s is already in the catalog", img.ref);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            http_add_header(req, "Location", "/v1/images"); /* the catalog it joined */
            http_reply_json(req, 201, image_json(&img));
        }
    }
    json_decref(body);
}

static int delete_txn(struct store *s, void *id)
{
    return store_image_delete(s, id);
}

void api_images_delete(struct http_request *req)
{
    struct store *s = store_thread();
    int rc = s ? store_txn(s, delete_txn, req->params[0]) : STORE_ERROR;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no image %.64s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 204, NULL);
}
