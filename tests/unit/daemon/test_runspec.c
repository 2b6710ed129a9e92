/* test_runspec.c: unit tests for what an instance runs (domain/runspec.c):
 * image references (registry, name, tag, digest), the registry allow-list,
 * and the checks of command, env and working_dir, each refusal naming its
 * field, and the public view of env that never holds a secret value. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domain/domain.h"

static void ref_ok(const char *ref, const char *registry)
{
    char reg[256];
    const char *why = NULL;
    if (image_ref_parse(ref, reg, sizeof reg, &why) != 0)
        fail_msg("%s refused: %s", ref, why);
    assert_string_equal(reg, registry);
}

static void ref_bad(const char *ref, const char *word)
{
    char reg[256];
    const char *why = NULL;
    if (image_ref_parse(ref, reg, sizeof reg, &why) == 0)
        fail_msg("%s accepted", ref);
    if (!strstr(why, word))
        fail_msg("%s: '%s' does not say %s", ref, why, word);
}

static void test_image_references(void **state)
{
    ref_ok("alpine", "docker.io");
    ref_ok("alpine:3.19", "docker.io");
    ref_ok("library/ubuntu:22.04", "docker.io");
    ref_ok("rocm/pytorch:2.3-rocm6.2", "docker.io");
    ref_ok("pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime", "docker.io");
    ref_ok("docker.io/library/alpine", "docker.io");
    ref_ok("ghcr.io/org/team/img:v1", "ghcr.io");
    ref_ok("GHCR.io/org/img", "ghcr.io"); /* hosts are case-insensitive */
    ref_ok("registry.example.com:5000/a/b:c", "registry.example.com:5000");
    ref_ok("localhost/x", "localhost");
    ref_ok("localhost:5000/x:1", "localhost:5000");
    ref_ok("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io");
    ref_ok("a__b/c-d/e.f:T_1.x-y", "docker.io");
    static char digest[128];
    snprintf(digest, sizeof digest, "ghcr.io/x/y@sha256:%064d", 0);
    ref_ok(digest, "ghcr.io");
    snprintf(digest, sizeof digest, "ghcr.io/x/y:1@sha256:%064d", 7);
    ref_ok(digest, "ghcr.io");

    ref_bad("", "empty");
    ref_bad("Alpine", "lowercase");
    ref_bad("team/Img:1", "lowercase");
    ref_bad("a//b", "lowercase");
    ref_bad("a/", "lowercase");
    ref_bad("-a", "lowercase");
    ref_bad("a..b", "lowercase");
    ref_bad("a_-b", "lowercase");
    ref_bad("a b", "lowercase");
    ref_bad("a;rm", "lowercase");
    ref_bad("alpine:", "tag");
    ref_bad("alpine:-x", "tag");
    ref_bad("alpine:.x", "tag");
    ref_bad("alpine:a/b", "registry"); /* "alpine:a" reads as a host and port */
    ref_bad("alpine@sha256:abc", "digest");
    ref_bad("alpine@md5:0123", "digest");
    /* Valid references that podman would read as another transport: a
     * host path loaded as an image. Docker Hub's own docker image stays. */
    ref_bad("oci-archive:tmp", "transport");
    ref_bad("dir:root", "transport");
    ref_bad("docker-archive:root", "transport");
    ref_bad("containers-storage:x", "transport");
    ref_ok("docker:24-dind", "docker.io");
    ref_ok("oci/img:1", "docker.io");
    snprintf(digest, sizeof digest, "x@sha256:%064d", 0);
    digest[strlen(digest) - 1] = 'G';
    ref_bad(digest, "digest");
    ref_bad("bad_host.com/x", "registry");
    ref_bad("host-.com/x", "registry");
    ref_bad("host.com:0/x", "registry");
    ref_bad("host.com:65536/x", "registry");
    ref_bad("host.com:/x", "registry");
    ref_ok("host.com:5000", "docker.io"); /* no "/": the name host.com, tag 5000, as docker reads it */
    static char longer[300];
    memset(longer, 'a', 256);
    longer[256] = '\0';
    ref_bad(longer, "255");
}

static void test_registry_lists(void **state)
{
    const char *list = "docker.io, ghcr.io,registry.example.com:5000";
    assert_true(image_registry_listed("docker.io", list));
    assert_true(image_registry_listed("ghcr.io", list));
    assert_true(image_registry_listed("registry.example.com:5000", list));
    assert_false(image_registry_listed("registry.example.com", list));
    assert_false(image_registry_listed("ghcr.i", list));
    assert_false(image_registry_listed("docker.io", ""));
    char bad[64];
    assert_true(image_registries_valid(list, bad, sizeof bad));
    assert_true(image_registries_valid("", bad, sizeof bad));
    assert_false(image_registries_valid("docker.io,no_such/host", bad, sizeof bad));
    assert_string_equal(bad, "no_such/host");
    assert_false(image_registries_valid("a.com:99999", bad, sizeof bad));
}

static int check(int (*fn)(const json_t *, struct op_outcome *), const char *text, const char *field)
{
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    assert_non_null(j);
    struct op_outcome o = {0};
    int rc = fn(j, &o);
    json_decref(j);
    if (rc < 0) {
        assert_string_equal(o.field, field);
        assert_true(o.message[0] != '\0');
    }
    return rc;
}

static int env_fn(const json_t *v, struct op_outcome *o)
{
    json_t *norm = NULL;
    int rc = run_env_check(v, &norm, o);
    assert_true(rc == 0 ? norm != NULL : norm == NULL);
    json_decref(norm);
    return rc;
}

static void test_command_and_env(void **state)
{
    assert_int_equal(check(run_command_check, "[\"sh\", \"-c\", \"echo hi\"]", "command"), 0);
    assert_int_equal(check(run_command_check, "[]", "command"), 0);
    assert_int_equal(check(run_command_check, "\"sh\"", "command"), -1);
    assert_int_equal(check(run_command_check, "[\"\"]", "command"), -1);
    assert_int_equal(check(run_command_check, "[\"a\", 1]", "command"), -1);
    static char big[70000];
    size_t off = (size_t)snprintf(big, sizeof big, "[");
    for (int i = 0; i < 65; i++)
        off += (size_t)snprintf(big + off, sizeof big - off, "%s\"x\"", i ? "," : "");
    snprintf(big + off, sizeof big - off, "]");
    assert_int_equal(check(run_command_check, big, "command"), -1);
    off = (size_t)snprintf(big, sizeof big, "[\"");
    memset(big + off, 'a', 4097);
    snprintf(big + off + 4097, sizeof big - off - 4097, "\"]");
    assert_int_equal(check(run_command_check, big, "command"), -1);
    big[off + 4096] = '"';
    big[off + 4097] = ']';
    big[off + 4098] = '\0';
    assert_int_equal(check(run_command_check, big, "command"), 0); /* 4096 bytes is fine */

    assert_int_equal(check(env_fn, "[{\"name\": \"A\", \"value\": \"1\"}, {\"name\": \"B_2\", \"value\": \"\","
                                   " \"secret\": true}]", "env"), 0);
    const char *bad_env[] = {
        "{}", "[1]", "[{\"name\": \"A\"}]", "[{\"value\": \"1\"}]", "[{\"name\": \"A\", \"value\": 1}]",
        "[{\"name\": \"A\", \"value\": \"1\", \"secret\": 1}]", "[{\"name\": \"A\", \"value\": \"1\", \"x\": 1}]",
        "[{\"name\": \"9A\", \"value\": \"1\"}]", "[{\"name\": \"\", \"value\": \"1\"}]",
        "[{\"name\": \"A.B\", \"value\": \"1\"}]", "[{\"name\": \"GPURENT_X\", \"value\": \"1\"}]",
        "[{\"name\": \"WORLD_SIZE\", \"value\": \"1\"}]", "[{\"name\": \"ROCR_VISIBLE_DEVICES\", \"value\": \"1\"}]",
        "[{\"name\": \"A\", \"value\": \"a\\nb\"}]",
        "[{\"name\": \"A\", \"value\": \"1\"}, {\"name\": \"A\", \"value\": \"2\"}]", NULL,
    };
    for (const char **t = bad_env; *t; t++)
        if (check(env_fn, *t, "env") != -1)
            fail_msg("env %s accepted", *t);

    struct op_outcome o = {0};
    assert_int_equal(run_working_dir_check("/shared/proj", &o), 0);
    assert_int_equal(run_working_dir_check("", &o), 0);
    assert_int_equal(run_working_dir_check("/a/..b/c..", &o), 0);
    assert_int_equal(run_working_dir_check("rel", &o), -1);
    assert_string_equal(o.field, "working_dir");
    assert_int_equal(run_working_dir_check("/a/../b", &o), -1);
    assert_int_equal(run_working_dir_check("/a/..", &o), -1);
    assert_int_equal(run_working_dir_check("/a\nb", &o), -1);
}

static void test_public_env_has_no_secret_value(void **state)
{
    json_t *env = json_loads("[{\"name\": \"A\", \"value\": \"1\", \"secret\": false},"
                             " {\"name\": \"T\", \"value\": \"hush\", \"secret\": true}]", 0, NULL);
    json_t *pub = run_env_public(env);
    char *text = json_dumps(pub, JSON_COMPACT);
    assert_string_equal(text, "[{\"name\":\"A\",\"value\":\"1\",\"secret\":false},{\"name\":\"T\",\"secret\":true}]");
    free(text);
    json_decref(pub);
    json_decref(env);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_image_references),
        cmocka_unit_test(test_registry_lists),
        cmocka_unit_test(test_command_and_env),
        cmocka_unit_test(test_public_env_has_no_secret_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
