/* test_store_accounts.c: the store's connections, transactions and
 * migrations (store.c, migrate.c), and the SQL of the smaller tables:
 * users, API keys, the GPU catalog, images, volumes, idempotency records
 * and admin actions. Each test runs on a fresh copy of a migrated database
 * (store_fixtures.h) and checks what each call returns and what it left. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

/* ---------------------------------------------------------------- store.c */

static void test_readonly_connection_reads_and_refuses_writes(void **state)
{
    char alice[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_ADMIN, alice);
    char err[256];
    struct store *ro = store_open_readonly(fx.path, err, sizeof err);
    assert_non_null(ro);
    struct user u;
    assert_int_equal(store_user_get(ro, alice, &u), STORE_OK);
    assert_int_equal(store_user_count_admins(ro), 1);
    struct user v = {.active = 1, .created_at = 1};
    assert_int_equal(id_new("usr", v.id), 0);
    snprintf(v.email, sizeof v.email, "bob@example.com");
    assert_int_equal(store_user_insert(ro, &v), STORE_ERROR);
    store_close(ro);
    store_close(NULL); /* a no-op */
}

static void test_opening_a_missing_file_readonly_fails_with_a_reason(void **state)
{
    char err[256] = "";
    char path[200];
    snprintf(path, sizeof path, "%s/no-such-dir/x.db", fx.dir);
    assert_null(store_open_readonly(path, err, sizeof err));
    assert_non_null(strstr(err, "cannot open database"));
    assert_null(store_open(path, err, sizeof err));
}

static void test_thread_connection_is_kept_until_closed(void **state)
{
    store_set_path(fx.path);
    struct store *a = store_thread(), *b = store_thread();
    assert_non_null(a);
    assert_ptr_equal(a, b);
    char alice[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    struct user u;
    assert_int_equal(store_user_get(a, alice, &u), STORE_OK);
    store_close_threads();
    struct store *c = store_thread();
    assert_non_null(c);
    assert_int_equal(store_user_get(c, alice, &u), STORE_OK);
    store_close_threads();
}

struct part_ctx {
    int part_result;          /* what the part returned */
    int part_rc;              /* what store_part returned */
};

static int insert_user(struct store *s, const char *email)
{
    struct user u = {.active = 1, .created_at = 1};
    id_new("usr", u.id);
    snprintf(u.email, sizeof u.email, "%s", email);
    return store_user_insert(s, &u);
}

static int failing_part(struct store *s, void *ctx)
{
    (void)ctx;
    int rc = insert_user(s, "inside@example.com");
    return rc == STORE_OK ? STORE_CONFLICT : rc;
}

static int txn_with_part(struct store *s, void *vctx)
{
    struct part_ctx *c = vctx;
    if (insert_user(s, "before@example.com") != STORE_OK)
        return STORE_ERROR;
    c->part_rc = store_part(s, failing_part, NULL, &c->part_result);
    return insert_user(s, "after@example.com");
}

static void test_part_undoes_only_its_own_work(void **state)
{
    struct part_ctx c = {0};
    assert_int_equal(store_txn(fx.s, txn_with_part, &c), STORE_OK);
    assert_int_equal(c.part_rc, 0);
    assert_int_equal(c.part_result, STORE_CONFLICT);
    struct user u;
    assert_int_equal(store_user_get_by_email(fx.s, "before@example.com", &u), STORE_OK);
    assert_int_equal(store_user_get_by_email(fx.s, "after@example.com", &u), STORE_OK);
    assert_int_equal(store_user_get_by_email(fx.s, "inside@example.com", &u), STORE_NOT_FOUND);
}

static int insert_then_refuse(struct store *s, void *ctx)
{
    (void)ctx;
    return insert_user(s, "refused@example.com") == STORE_OK ? REFUSED : STORE_ERROR;
}

static void test_txn_commits_once_and_a_refusal_leaves_nothing(void **state)
{
    struct store_txn_stats before, after;
    store_txn_stats(&before);
    assert_int_equal(store_txn(fx.s, insert_then_refuse, NULL), REFUSED);
    struct user u;
    assert_int_equal(store_user_get_by_email(fx.s, "refused@example.com", &u), STORE_NOT_FOUND);
    store_txn_stats(&after);
    assert_int_equal(after.transactions, before.transactions);
    assert_int_equal(after.waiting, 0);
}

/* ---------------------------------------------------------------- migrate.c */

static void test_migrated_database_is_at_the_latest_version(void **state)
{
    assert_true(store_latest_version() >= 13);
    assert_int_equal(store_schema_version(fx.s), store_latest_version());
    char err[256];
    assert_int_equal(store_migrate(fx.s, 0, err, sizeof err), 0); /* nothing to do */
    assert_int_equal(store_schema_version(fx.s), store_latest_version());
}

static void test_migrate_goes_up_to_a_target_then_the_rest(void **state)
{
    char path[200], err[256];
    snprintf(path, sizeof path, "%s/empty.db", fx.dir);
    struct store *s = store_open(path, err, sizeof err);
    assert_non_null(s);
    assert_int_equal(store_schema_version(s), 0);
    assert_int_equal(store_migrate(s, 3, err, sizeof err), 0);
    assert_int_equal(store_schema_version(s), 3);
    assert_int_equal(store_migrate(s, 0, err, sizeof err), 0);
    assert_int_equal(store_schema_version(s), store_latest_version());
    store_close(s);
    fx_unlink_db(path);
}

static void test_migrate_refuses_a_database_from_a_newer_release(void **state)
{
    char sql[160];
    snprintf(sql, sizeof sql, "INSERT INTO schema_migrations VALUES (%d, 'from_the_future', 0)",
             store_latest_version() + 1);
    fx_sql_exec(fx.s, sql);
    char err[512] = "";
    assert_int_equal(store_migrate(fx.s, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "newer release"));
}

/* ---------------------------------------------------------------- users */

static void test_user_round_trips_by_id_and_email(void **state)
{
    struct user u = {.role = ROLE_USER, .active = 0, .created_at = 1234};
    assert_int_equal(id_new("usr", u.id), 0);
    snprintf(u.email, sizeof u.email, "carol@example.com");
    snprintf(u.password_hash, sizeof u.password_hash, "pbkdf2-sha256$1000$salt$hash");
    snprintf(u.invite_code, sizeof u.invite_code, "AMD6GW");
    assert_int_equal(store_user_insert(fx.s, &u), STORE_OK);
    struct user a, b;
    assert_int_equal(store_user_get(fx.s, u.id, &a), STORE_OK);
    assert_int_equal(store_user_get_by_email(fx.s, "carol@example.com", &b), STORE_OK);
    assert_string_equal(a.id, u.id);
    assert_string_equal(b.id, u.id);
    assert_string_equal(a.email, "carol@example.com");
    assert_string_equal(a.password_hash, u.password_hash);
    assert_string_equal(a.invite_code, "AMD6GW");
    assert_int_equal(a.role, ROLE_USER);
    assert_int_equal(a.active, 0);
    assert_int_equal(a.created_at, 1234);
    assert_int_equal(store_user_get(fx.s, "usr_nosuch", &a), STORE_NOT_FOUND);
    assert_int_equal(store_user_get_by_email(fx.s, "nobody@example.com", &a), STORE_NOT_FOUND);
}

static void test_user_with_a_taken_email_is_a_conflict(void **state)
{
    char id[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, id);
    struct user u = {.active = 1, .created_at = 1};
    assert_int_equal(id_new("usr", u.id), 0);
    snprintf(u.email, sizeof u.email, "alice@example.com");
    assert_int_equal(store_user_insert(fx.s, &u), STORE_CONFLICT);
}

static void test_count_admins_counts_admins_only(void **state)
{
    char id[ID_MAX];
    assert_int_equal(store_user_count_admins(fx.s), 0);
    fx_user(fx.s, "user@example.com", ROLE_USER, id);
    fx_user(fx.s, "root@example.com", ROLE_ADMIN, id);
    fx_user(fx.s, "ops@example.com", ROLE_ADMIN, id);
    assert_int_equal(store_user_count_admins(fx.s), 2);
}

/* ---------------------------------------------------------------- API keys */

static void key(const char *user, const char *name, int64_t created_at, char id[ID_MAX])
{
    struct api_key k = {.created_at = created_at};
    assert_int_equal(id_new("key", k.id), 0);
    snprintf(k.user_id, sizeof k.user_id, "%s", user);
    snprintf(k.name, sizeof k.name, "%s", name);
    for (int i = 0; i < API_SECRET_HASH_LEN; i++)
        k.secret_hash[i] = (unsigned char)(i * 7 + name[0]);
    assert_int_equal(store_api_key_insert(fx.s, &k), STORE_OK);
    memcpy(id, k.id, ID_MAX);
}

static void test_api_key_round_trips_with_its_hash(void **state)
{
    char alice[ID_MAX], k[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    key(alice, "laptop", 500, k);
    struct api_key got;
    assert_int_equal(store_api_key_get(fx.s, k, &got), STORE_OK);
    assert_string_equal(got.user_id, alice);
    assert_string_equal(got.name, "laptop");
    assert_int_equal(got.created_at, 500);
    assert_int_equal(got.revoked_at, 0);
    for (int i = 0; i < API_SECRET_HASH_LEN; i++)
        assert_int_equal(got.secret_hash[i], (unsigned char)(i * 7 + 'l'));
    assert_int_equal(store_api_key_get(fx.s, "key_nosuch", &got), STORE_NOT_FOUND);
}

static void test_api_key_list_pages_by_creation_and_shows_revoked_keys(void **state)
{
    char alice[ID_MAX], bob[ID_MAX], k1[ID_MAX], k2[ID_MAX], k3[ID_MAX], other[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    key(alice, "c", 300, k3);
    key(alice, "a", 100, k1);
    key(alice, "b", 200, k2);
    key(bob, "x", 150, other);
    assert_int_equal(store_api_key_revoke(fx.s, alice, k2, 250), STORE_OK);
    struct api_key page[2];
    size_t n;
    assert_int_equal(store_api_key_list(fx.s, alice, -1, "", page, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(page[0].id, k1);
    assert_string_equal(page[1].id, k2);
    assert_int_equal(page[1].revoked_at, 250);
    assert_int_equal(store_api_key_list(fx.s, alice, page[1].created_at, page[1].id, page, 2, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(page[0].id, k3);
    assert_int_equal(store_api_key_list(fx.s, alice, page[0].created_at, page[0].id, page, 2, &n), STORE_OK);
    assert_int_equal(n, 0);
}

static void test_api_key_revoke_is_for_the_owner_and_keeps_the_first_time(void **state)
{
    char alice[ID_MAX], bob[ID_MAX], k[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    key(alice, "laptop", 100, k);
    assert_int_equal(store_api_key_revoke(fx.s, bob, k, 200), STORE_NOT_FOUND);
    assert_int_equal(store_api_key_revoke(fx.s, alice, "key_nosuch", 200), STORE_NOT_FOUND);
    struct api_key got;
    assert_int_equal(store_api_key_get(fx.s, k, &got), STORE_OK);
    assert_int_equal(got.revoked_at, 0);
    assert_int_equal(store_api_key_revoke(fx.s, alice, k, 200), STORE_OK);
    assert_int_equal(store_api_key_revoke(fx.s, alice, k, 300), STORE_OK);
    assert_int_equal(store_api_key_get(fx.s, k, &got), STORE_OK);
    assert_int_equal(got.revoked_at, 200);
}

static void test_api_key_auth_reads_the_owner_s_role_and_standing(void **state)
{
    char alice[ID_MAX], root[ID_MAX], k[ID_MAX], r[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "root@example.com", ROLE_ADMIN, root);
    key(alice, "laptop", 100, k);
    key(root, "ops", 100, r);
    struct key_auth got;
    assert_int_equal(store_api_key_auth(fx.s, k, &got), STORE_OK);
    assert_string_equal(got.key.user_id, alice);
    assert_string_equal(got.key.name, "laptop");
    assert_int_equal(got.key.secret_hash[1], (unsigned char)(7 + 'l'));
    assert_int_equal(got.role, ROLE_USER);
    assert_true(got.active);
    assert_int_equal(store_api_key_auth(fx.s, r, &got), STORE_OK);
    assert_int_equal(got.role, ROLE_ADMIN);
    assert_int_equal(store_user_set_active(fx.s, alice, 0), STORE_OK);
    assert_int_equal(store_api_key_auth(fx.s, k, &got), STORE_OK);
    assert_false(got.active);
    assert_int_equal(store_api_key_revoke(fx.s, alice, k, 200), STORE_OK);
    assert_int_equal(store_api_key_auth(fx.s, k, &got), STORE_OK);
    assert_int_equal(got.key.revoked_at, 200);
    assert_int_equal(store_api_key_auth(fx.s, "key_nosuch", &got), STORE_NOT_FOUND);
    /* A key whose owner row is gone is the database's fault, not a 401. */
    assert_int_equal(sqlite3_exec(store_db(fx.s), "PRAGMA foreign_keys = OFF; DELETE FROM users WHERE role = 'admin';"
                                  "PRAGMA foreign_keys = ON;", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(store_api_key_auth(fx.s, r, &got), STORE_ERROR);
}

/* ---------------------------------------------------------------- GPU types */

static void test_gpu_type_list_is_the_catalog_by_code(void **state)
{
    struct gpu_type *t;
    size_t n;
    assert_int_equal(store_gpu_type_list(fx.s, &t, &n), STORE_OK);
    assert_int_equal(n, 5); /* seeded by migration 0002 */
    assert_string_equal(t[0].code, "H100-SXM");
    assert_int_equal(t[0].reservation_required, 1);
    assert_string_equal(t[3].code, "MI450");
    assert_string_equal(t[3].stack, "ROCm");
    assert_int_equal(t[3].memory_gb, 192);
    assert_string_equal(t[4].code, "RTX4090");
    assert_string_equal(t[4].features, "[\"inference\"]");
    free(t);
}

/* No bound cuts the catalog: every type is listed however many there are. */
static void test_gpu_type_list_has_no_bound(void **state)
{
    for (int i = 0; i < 300; i++) {
        struct gpu_type t = {.memory_gb = 16};
        snprintf(t.code, sizeof t.code, "A%04d", i);
        snprintf(t.vendor, sizeof t.vendor, "AMD");
        snprintf(t.memory_type, sizeof t.memory_type, "HBM3");
        snprintf(t.stack, sizeof t.stack, "ROCm");
        snprintf(t.features, sizeof t.features, "[]");
        int created;
        assert_int_equal(store_gpu_type_put(fx.s, &t, 1000, &created), STORE_OK);
        assert_int_equal(created, 1);
    }
    struct gpu_type *all;
    size_t n;
    assert_int_equal(store_gpu_type_list(fx.s, &all, &n), STORE_OK);
    assert_int_equal(n, 305);
    assert_string_equal(all[0].code, "A0000");
    assert_string_equal(all[304].code, "RTX4090");
    free(all);
}

static void test_gpu_type_put_creates_then_replaces_its_description(void **state)
{
    struct gpu_type t = {.memory_gb = 288, .reservation_required = 0};
    snprintf(t.code, sizeof t.code, "MI355X");
    snprintf(t.vendor, sizeof t.vendor, "AMD");
    snprintf(t.memory_type, sizeof t.memory_type, "HBM3e");
    snprintf(t.stack, sizeof t.stack, "ROCm");
    snprintf(t.features, sizeof t.features, "[\"FP4\",\"FP8\"]");
    snprintf(t.description, sizeof t.description, "first");
    int created = -1;
    assert_int_equal(store_gpu_type_put(fx.s, &t, 1000, &created), STORE_OK);
    assert_int_equal(created, 1);
    snprintf(t.description, sizeof t.description, "second");
    t.reservation_required = 1;
    assert_int_equal(store_gpu_type_put(fx.s, &t, 2000, &created), STORE_OK);
    assert_int_equal(created, 0);
    struct gpu_type got;
    assert_int_equal(store_gpu_type_row(fx.s, "MI355X", &got), STORE_OK);
    assert_string_equal(got.description, "second");
    assert_string_equal(got.features, "[\"FP4\",\"FP8\"]");
    assert_int_equal(got.reservation_required, 1);
    assert_int_equal(got.created_at, 1000);
    assert_int_equal(got.updated_at, 2000);
    /* The catalog's CHECKs refuse what is not a type. */
    snprintf(t.vendor, sizeof t.vendor, "ACME");
    assert_int_equal(store_gpu_type_put(fx.s, &t, 3000, &created), STORE_ERROR);
}

static void test_gpu_type_get_counts_cards_and_row_does_not(void **state)
{
    char alice[ID_MAX], node[ID_MAX], cordoned[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_tst_type(fx.s);
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(fx_beat(fx.s, node, 1000, FX_TST, 8, 0x80), STORE_OK); /* card 7 failed */
    fx_ready_node(fx.s, "n2", FX_TST, 4, "f1", 1000, cordoned);
    assert_int_equal(store_node_set_admin_state(fx.s, cordoned, "cordoned", "rack work", 1001), STORE_OK);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 2, "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x3), STORE_OK);
    struct gpu_type t;
    assert_int_equal(store_gpu_type_get(fx.s, FX_TST, &t), STORE_OK);
    assert_int_equal(t.cards_total, 12);
    assert_int_equal(t.cards_free, 5); /* cordoned cards are not free */
    assert_int_equal(t.cards_in_use, 2);
    assert_int_equal(store_gpu_type_row(fx.s, FX_TST, &t), STORE_OK);
    assert_int_equal(t.cards_total + t.cards_free + t.cards_in_use, 0);
    /* An unknown type, and the list's counts agree with get's. */
    assert_int_equal(store_gpu_type_get(fx.s, "NOSUCH", &t), STORE_NOT_FOUND);
    assert_int_equal(store_gpu_type_row(fx.s, "NOSUCH", &t), STORE_NOT_FOUND);
    struct gpu_type *all;
    size_t n;
    assert_int_equal(store_gpu_type_list(fx.s, &all, &n), STORE_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i].code, FX_TST) == 0)
            assert_int_equal(all[i].cards_free, 5);
    free(all);
}

static void test_gpu_type_delete_is_refused_while_a_node_names_it_even_removed(void **state)
{
    char node[ID_MAX];
    fx_gpu_type(fx.s, "OLD", "AMD", "ROCm");
    fx_node(fx.s, "n1", "OLD", 8, "f1", 1000, node);
    struct gpu_type_users users;
    assert_int_equal(store_gpu_type_delete(fx.s, "OLD", &users), STORE_CONFLICT);
    assert_int_equal(users.nodes, 1);
    assert_int_equal(store_node_remove(fx.s, node, 2000), STORE_OK);
    assert_int_equal(store_gpu_type_delete(fx.s, "OLD", &users), STORE_CONFLICT); /* removed nodes count too */
    assert_int_equal(users.nodes, 1);
}

static void test_gpu_type_delete_removes_an_unused_type_once(void **state)
{
    fx_gpu_type(fx.s, "GONE", "NVIDIA", "CUDA");
    struct gpu_type_users users;
    assert_int_equal(store_gpu_type_delete(fx.s, "GONE", &users), STORE_OK);
    struct gpu_type t;
    assert_int_equal(store_gpu_type_row(fx.s, "GONE", &t), STORE_NOT_FOUND);
    assert_int_equal(store_gpu_type_delete(fx.s, "GONE", &users), STORE_NOT_FOUND);
    assert_int_equal(store_gpu_type_delete(fx.s, "MI250", &users), STORE_OK); /* seeded, never priced */
}

/* A priced type cannot be deleted: its prices are the history billed usage
 * was priced by. Refused like a type nodes name (409 at the API), not a
 * foreign-key failure (it was a 500). */
static void test_gpu_type_delete_of_a_priced_type_is_a_conflict(void **state)
{
    fx_gpu_type(fx.s, "PRICED", "AMD", "ROCm");
    assert_int_equal(store_price_insert(fx.s, "PRICED", 0, 1000000, 10), STORE_OK);
    struct gpu_type_users users;
    assert_int_equal(store_gpu_type_delete(fx.s, "PRICED", &users), STORE_CONFLICT);
    assert_int_equal(users.prices, 1);
    assert_int_equal(users.nodes + users.instances, 0);
    struct gpu_type t;
    assert_int_equal(store_gpu_type_row(fx.s, "PRICED", &t), STORE_OK);
}

/* ---------------------------------------------------------------- images */

static void test_image_list_is_by_ref_and_find_takes_id_or_ref(void **state)
{
    struct image img[8];
    size_t n;
    assert_int_equal(store_image_list(fx.s, img, 8, &n), STORE_OK);
    assert_int_equal(n, 3); /* seeded by migration 0003 */
    assert_string_equal(img[0].id, "img_cuda121_pytorch23");
    assert_string_equal(img[1].id, "img_rocm62_pytorch23");
    assert_string_equal(img[2].id, "img_rocm57_pytorch23");
    struct image a, b;
    assert_int_equal(store_image_find(fx.s, "img_rocm62_pytorch23", &a), STORE_OK);
    assert_int_equal(store_image_find(fx.s, "rocm/pytorch:2.3-rocm6.2", &b), STORE_OK);
    assert_string_equal(a.id, b.id);
    assert_string_equal(a.stack, "ROCm");
    assert_int_equal(store_image_find(fx.s, "nosuch:latest", &a), STORE_NOT_FOUND);
}

static void test_image_insert_refuses_a_taken_ref_and_delete_removes_it_once(void **state)
{
    struct image img = {.created_at = 700};
    snprintf(img.id, sizeof img.id, "img_test");
    snprintf(img.ref, sizeof img.ref, "example/job:1");
    snprintf(img.stack, sizeof img.stack, "CUDA");
    snprintf(img.description, sizeof img.description, "a job");
    assert_int_equal(store_image_insert(fx.s, &img), STORE_OK);
    struct image got;
    assert_int_equal(store_image_find(fx.s, "example/job:1", &got), STORE_OK);
    assert_string_equal(got.description, "a job");
    assert_int_equal(got.created_at, 700);
    snprintf(img.id, sizeof img.id, "img_other");
    assert_int_equal(store_image_insert(fx.s, &img), STORE_CONFLICT);
    assert_int_equal(store_image_delete(fx.s, "img_test"), STORE_OK);
    assert_int_equal(store_image_find(fx.s, "example/job:1", &got), STORE_NOT_FOUND);
    assert_int_equal(store_image_delete(fx.s, "img_test"), STORE_NOT_FOUND);
}

/* ---------------------------------------------------------------- volumes */

static void volume(const char *user, const char *name, int64_t created_at, char id[ID_MAX])
{
    struct volume v = {.size_gb = 50, .created_at = created_at};
    assert_int_equal(id_new("vol", v.id), 0);
    snprintf(v.user_id, sizeof v.user_id, "%s", user);
    snprintf(v.name, sizeof v.name, "%s", name);
    snprintf(v.source, sizeof v.source, "nfs://store/%s", v.id);
    assert_int_equal(store_volume_insert(fx.s, &v), STORE_OK);
    memcpy(id, v.id, ID_MAX);
}

static void test_volume_names_are_unique_per_owner(void **state)
{
    char alice[ID_MAX], bob[ID_MAX], a[ID_MAX], b[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    volume(alice, "data", 100, a);
    volume(bob, "data", 100, b);
    struct volume v = {.size_gb = 1, .created_at = 1};
    assert_int_equal(id_new("vol", v.id), 0);
    snprintf(v.user_id, sizeof v.user_id, "%s", alice);
    snprintf(v.name, sizeof v.name, "data");
    snprintf(v.source, sizeof v.source, "nfs://x");
    assert_int_equal(store_volume_insert(fx.s, &v), STORE_CONFLICT);
}

static void test_volume_get_is_the_owner_s_or_anyone_s(void **state)
{
    char alice[ID_MAX], bob[ID_MAX], a[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    volume(alice, "data", 100, a);
    struct volume v;
    assert_int_equal(store_volume_get(fx.s, alice, a, &v), STORE_OK);
    assert_string_equal(v.name, "data");
    assert_int_equal(v.size_gb, 50);
    assert_int_equal(v.instances, 0);
    assert_int_equal(store_volume_get(fx.s, bob, a, &v), STORE_NOT_FOUND);
    assert_int_equal(store_volume_get(fx.s, NULL, a, &v), STORE_OK);
    char id[ID_MAX] = "";
    assert_int_equal(store_volume_id_by_name(fx.s, alice, "data", id), STORE_OK);
    assert_string_equal(id, a);
    assert_int_equal(store_volume_id_by_name(fx.s, bob, "data", id), STORE_NOT_FOUND);
    /* What agents mount, alone; a deleted volume has none. */
    char want[600];
    snprintf(want, sizeof want, "nfs://store/%s", a);
    assert_int_equal(store_volume_mount(fx.s, a, &v), STORE_OK);
    assert_string_equal(v.source, want);
    assert_int_equal(v.size_gb, 50);
    assert_string_equal(v.name, "");
    assert_int_equal(store_volume_mount(fx.s, "vol_nosuch", &v), STORE_NOT_FOUND);
    assert_int_equal(store_volume_delete(fx.s, alice, a, 200), STORE_OK);
    assert_int_equal(store_volume_mount(fx.s, a, &v), STORE_NOT_FOUND);
}

static void test_volume_list_pages_by_creation(void **state)
{
    char alice[ID_MAX], a[ID_MAX], b[ID_MAX], c[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    volume(alice, "third", 300, c);
    volume(alice, "first", 100, a);
    volume(alice, "second", 200, b);
    struct volume page[2];
    size_t n;
    assert_int_equal(store_volume_list(fx.s, alice, -1, "", page, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(page[0].id, a);
    assert_string_equal(page[1].id, b);
    assert_int_equal(store_volume_list(fx.s, alice, page[1].created_at, page[1].id, page, 2, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(page[0].id, c);
}

static void test_volume_counts_its_live_and_mounted_instances(void **state)
{
    char alice[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_tst_type(fx.s);
    struct instance running, stopped, gone;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &running);
    fx_instance(fx.s, alice, FX_TST, 1, "stopped", 100, &stopped);
    fx_instance(fx.s, alice, FX_TST, 1, "terminated", 100, &gone);
    struct volume v;
    assert_int_equal(store_volume_get(fx.s, alice, running.volume_id, &v), STORE_OK);
    assert_int_equal(v.instances, 2);
    assert_int_equal(v.mounted, 1);
}

static void test_volume_delete_is_refused_while_an_instance_uses_it(void **state)
{
    char alice[ID_MAX], bob[ID_MAX];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    fx_tst_type(fx.s);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "stopped", 100, &in);
    assert_int_equal(store_volume_delete(fx.s, alice, in.volume_id, 200), STORE_CONFLICT);
    assert_int_equal(store_volume_delete(fx.s, bob, in.volume_id, 200), STORE_NOT_FOUND);
    assert_int_equal(store_instance_set_state(fx.s, in.id, "terminated", "", "user", 300), STORE_OK);
    assert_int_equal(store_volume_delete(fx.s, alice, in.volume_id, 400), STORE_OK);
    struct volume v;
    assert_int_equal(store_volume_get(fx.s, alice, in.volume_id, &v), STORE_NOT_FOUND);
    assert_int_equal(store_volume_delete(fx.s, alice, in.volume_id, 500), STORE_NOT_FOUND);
    /* Its name is free again. */
    char again[ID_MAX];
    volume(alice, "shared", 600, again);
}

/* ---------------------------------------------------------------- idempotency */

static void test_idempotency_keeps_the_first_answer_per_user_and_key(void **state)
{
    char alice[ID_MAX], bob[ID_MAX], hash[65];
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    char h1[65];
    memset(h1, 'a', 64);
    h1[64] = '\0';
    int status = 0;
    char *resp = NULL, location[IDEM_LOCATION_MAX];
    assert_int_equal(store_idempotency_get(fx.s, alice, "k1", hash, &status, location, &resp), STORE_NOT_FOUND);
    assert_null(resp);
    assert_int_equal(store_idempotency_put(fx.s, alice, "k1", h1, 201, "/v1/instances/ins_1", "{\"id\":\"ins_1\"}", 100),
                     STORE_OK);
    assert_int_equal(store_idempotency_get(fx.s, alice, "k1", hash, &status, location, &resp), STORE_OK);
    assert_string_equal(hash, h1);
    assert_int_equal(status, 201);
    assert_string_equal(location, "/v1/instances/ins_1");
    assert_string_equal(resp, "{\"id\":\"ins_1\"}");
    free(resp);
    assert_int_equal(store_idempotency_put(fx.s, alice, "k1", h1, 200, "", "{}", 200), STORE_CONFLICT);
    /* Keys are per user. */
    assert_int_equal(store_idempotency_get(fx.s, bob, "k1", hash, &status, location, &resp), STORE_NOT_FOUND);
    assert_int_equal(store_idempotency_put(fx.s, bob, "k1", h1, 202, "", "{}", 200), STORE_OK);
    assert_int_equal(store_idempotency_get(fx.s, bob, "k1", hash, &status, location, &resp), STORE_OK);
    assert_string_equal(location, "");
    free(resp);
}

/* ---------------------------------------------------------------- admin actions */

static void action(const char *admin, const char *key_id, const char *what, const char *target, int64_t amount,
                   int64_t at)
{
    struct admin_action a = {.at = at, .amount = amount};
    snprintf(a.admin_user_id, sizeof a.admin_user_id, "%s", admin);
    snprintf(a.api_key_id, sizeof a.api_key_id, "%s", key_id);
    snprintf(a.action, sizeof a.action, "%s", what);
    snprintf(a.target, sizeof a.target, "%s", target);
    snprintf(a.detail, sizeof a.detail, "{\"n\":%lld}", (long long)at);
    snprintf(a.reason, sizeof a.reason, "because %lld", (long long)at);
    assert_int_equal(store_admin_action_insert(fx.s, &a), STORE_OK);
}

static void test_admin_actions_are_listed_newest_first_with_filters_and_a_cursor(void **state)
{
    char root[ID_MAX], ops[ID_MAX], k1[ID_MAX], k2[ID_MAX], alice[ID_MAX];
    fx_user(fx.s, "root@example.com", ROLE_ADMIN, root);
    fx_user(fx.s, "ops@example.com", ROLE_ADMIN, ops);
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    key(root, "root", 10, k1);
    key(ops, "ops", 10, k2);
    action(root, k1, "grant", alice, 5000000, 100);
    action(ops, k2, "price", "MI450", 1200000, 200);
    action(root, k1, "billing_run", "", -1, 300);
    action(root, k1, "topup", alice, 1000000, 400);

    struct admin_action out[8];
    size_t n;
    struct admin_action_filter all = {.before_id = INT64_MAX};
    assert_int_equal(store_admin_actions(fx.s, &all, out, 8, &n), STORE_OK);
    assert_int_equal(n, 4);
    assert_string_equal(out[0].action, "topup");
    assert_true(out[0].id > out[1].id);
    assert_string_equal(out[1].action, "billing_run");
    assert_string_equal(out[1].target, "");
    assert_int_equal(out[1].amount, -1);
    assert_string_equal(out[3].detail, "{\"n\":100}");
    assert_string_equal(out[3].reason, "because 100");
    assert_string_equal(out[3].api_key_id, k1);

    struct admin_action_filter to_alice = {.target = alice, .before_id = INT64_MAX};
    assert_int_equal(store_admin_actions(fx.s, &to_alice, out, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    struct admin_action_filter by_ops = {.admin_user_id = ops, .before_id = INT64_MAX};
    assert_int_equal(store_admin_actions(fx.s, &by_ops, out, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].target, "MI450");
    struct admin_action_filter grants = {.action = "grant", .before_id = INT64_MAX};
    assert_int_equal(store_admin_actions(fx.s, &grants, out, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(out[0].amount, 5000000);

    /* Pages of two, newest first. */
    assert_int_equal(store_admin_actions(fx.s, &all, out, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    struct admin_action_filter next = {.before_id = out[1].id};
    assert_int_equal(store_admin_actions(fx.s, &next, out, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(out[0].action, "price");
    assert_string_equal(out[1].action, "grant");
}

static void test_admin_action_of_an_unknown_kind_is_refused(void **state)
{
    char root[ID_MAX], k[ID_MAX];
    fx_user(fx.s, "root@example.com", ROLE_ADMIN, root);
    key(root, "root", 10, k);
    struct admin_action a = {.at = 1, .amount = -1};
    snprintf(a.admin_user_id, sizeof a.admin_user_id, "%s", root);
    snprintf(a.api_key_id, sizeof a.api_key_id, "%s", k);
    snprintf(a.action, sizeof a.action, "delete_all");
    snprintf(a.detail, sizeof a.detail, "{}");
    assert_int_equal(store_admin_action_insert(fx.s, &a), STORE_ERROR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_readonly_connection_reads_and_refuses_writes),
        fx_test(test_opening_a_missing_file_readonly_fails_with_a_reason),
        fx_test(test_thread_connection_is_kept_until_closed),
        fx_test(test_part_undoes_only_its_own_work),
        fx_test(test_txn_commits_once_and_a_refusal_leaves_nothing),
        fx_test(test_migrated_database_is_at_the_latest_version),
        fx_test(test_migrate_goes_up_to_a_target_then_the_rest),
        fx_test(test_migrate_refuses_a_database_from_a_newer_release),
        fx_test(test_user_round_trips_by_id_and_email),
        fx_test(test_user_with_a_taken_email_is_a_conflict),
        fx_test(test_count_admins_counts_admins_only),
        fx_test(test_api_key_round_trips_with_its_hash),
        fx_test(test_api_key_list_pages_by_creation_and_shows_revoked_keys),
        fx_test(test_api_key_revoke_is_for_the_owner_and_keeps_the_first_time),
        fx_test(test_api_key_auth_reads_the_owner_s_role_and_standing),
        fx_test(test_gpu_type_list_is_the_catalog_by_code),
        fx_test(test_gpu_type_list_has_no_bound),
        fx_test(test_gpu_type_put_creates_then_replaces_its_description),
        fx_test(test_gpu_type_get_counts_cards_and_row_does_not),
        fx_test(test_gpu_type_delete_is_refused_while_a_node_names_it_even_removed),
        fx_test(test_gpu_type_delete_removes_an_unused_type_once),
        fx_test(test_gpu_type_delete_of_a_priced_type_is_a_conflict),
        fx_test(test_image_list_is_by_ref_and_find_takes_id_or_ref),
        fx_test(test_image_insert_refuses_a_taken_ref_and_delete_removes_it_once),
        fx_test(test_volume_names_are_unique_per_owner),
        fx_test(test_volume_get_is_the_owner_s_or_anyone_s),
        fx_test(test_volume_list_pages_by_creation),
        fx_test(test_volume_counts_its_live_and_mounted_instances),
        fx_test(test_volume_delete_is_refused_while_an_instance_uses_it),
        fx_test(test_idempotency_keeps_the_first_answer_per_user_and_key),
        fx_test(test_admin_actions_are_listed_newest_first_with_filters_and_a_cursor),
        fx_test(test_admin_action_of_an_unknown_kind_is_refused),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
