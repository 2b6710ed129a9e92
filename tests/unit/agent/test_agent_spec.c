/* test_agent_spec.c: unit tests for the agent's workload spec: what a valid
 * spec becomes, every refusal that protects the command line, bounds, and
 * the equality that makes PUT idempotent (volume sizes included). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "gpurent/secrets.h"

/* Parses JSON text into a spec; returns spec_parse's result and the field. */
static int parse(const char *text, struct wl_spec *s, char field[64])
{
    json_error_t jerr;
    /* JSON_ALLOW_NUL: the parser must cope even if a "\u0000" gets through. */
    json_t *j = json_loads(text, JSON_ALLOW_NUL, &jerr);
    assert_non_null(j);
    char err[256] = "";
    field[0] = '\0';
    int rc = spec_parse(j, s, field, 64, err, sizeof err);
    if (rc < 0)
        assert_true(err[0] != '\0'); /* every refusal says why */
    json_decref(j);
    return rc;
}

static void expect_bad(const char *text, const char *want_field)
{
    struct wl_spec s;
    char field[64];
    assert_int_equal(parse(text, &s, field), -1);
    assert_string_equal(field, want_field);
    /* A refused spec owns nothing. */
    assert_null(s.image);
    assert_null(s.env);
    assert_int_equal(s.n_volumes, 0);
}

static void test_full_spec(void **state)
{
    struct wl_spec s;
    char field[64];
    assert_int_equal(parse("{\"image\": \"rocm/pytorch:2.3-rocm6.2\", \"gpus\": [3, 1, 2], \"stack\": \"ROCm\","
                           " \"volumes\": [{\"source\": \"nfs.example:/export/vol_x\", \"target\": \"/shared\","
                           " \"size_gb\": 500}, {\"source\": \"nfs.example:/old\", \"target\": \"/old\"}],"
                           " \"env\": {\"MASTER_PORT\": \"29500\", \"GPURENT_NODE_RANK\": \"0\", \"EMPTY\": \"\"}}",
                           &s, field),
                     0);
    assert_string_equal(s.image, "rocm/pytorch:2.3-rocm6.2");
    assert_int_equal(s.n_gpus, 3);
    assert_int_equal(s.gpus[0], 3); /* order kept: it decides device numbering */
    assert_int_equal(s.gpus[2], 2);
    assert_string_equal(s.stack, "ROCm");
    assert_int_equal(s.n_volumes, 2);
    assert_string_equal(s.volumes[0].source, "nfs.example:/export/vol_x");
    assert_string_equal(s.volumes[0].target, "/shared");
    assert_int_equal(s.volumes[0].size_gb, 500);
    assert_int_equal(s.volumes[1].size_gb, 0); /* absent (an older control plane): no size */
    assert_int_equal(s.n_env, 3);
    assert_string_equal(s.env[0].name, "EMPTY"); /* sorted by name */
    assert_string_equal(s.env[1].name, "GPURENT_NODE_RANK");
    assert_string_equal(s.env[2].name, "MASTER_PORT");
    assert_string_equal(s.env[2].value, "29500");
    spec_free(&s);
    assert_null(s.image);
    spec_free(NULL); /* a no-op */
}

static void test_minimal_spec(void **state)
{
    struct wl_spec s;
    char field[64];
    assert_int_equal(parse("{\"image\": \"busybox\"}", &s, field), 0);
    assert_int_equal(s.n_gpus, 0);
    spec_free(&s);
    /* gpurentd's catalog allows '+' and '@' (digests); so does the agent. */
    assert_int_equal(parse("{\"image\": \"reg.example:5000/a+b/img@sha256:0f\"}", &s, field), 0);
    assert_int_equal(s.n_volumes, 0);
    assert_int_equal(s.n_env, 0);
    assert_string_equal(s.stack, "");
    spec_free(&s);
    /* Explicit nulls are absent values. */
    assert_int_equal(parse("{\"image\": \"busybox\", \"gpus\": null, \"env\": null}", &s, field), 0);
    spec_free(&s);
}

static void test_refusals(void **state)
{
    expect_bad("[]", "");
    expect_bad("{}", "image");
    expect_bad("{\"image\": 5}", "image");
    expect_bad("{\"image\": \"\"}", "image");
    /* An image that podman would read as an option. */
    expect_bad("{\"image\": \"--privileged\"}", "image");
    expect_bad("{\"image\": \"-v/:/host\"}", "image");
    expect_bad("{\"image\": \"a b\"}", "image");
    /* An image podman would load from a host path, or another transport. */
    expect_bad("{\"image\": \"oci-archive:/srv/x.tar\"}", "image");
    expect_bad("{\"image\": \"dir:/var/lib/x\"}", "image");
    expect_bad("{\"image\": \"docker://busybox\"}", "image");
    expect_bad("{\"image\": \"a\\u0000b\"}", "image");
    expect_bad("{\"image\": \"busybox\", \"extra\": 1}", "extra");
    expect_bad("{\"image\": \"busybox\", \"gpus\": [0, 0]}", "gpus");
    expect_bad("{\"image\": \"busybox\", \"gpus\": [-1]}", "gpus");
    expect_bad("{\"image\": \"busybox\", \"gpus\": [64]}", "gpus");
    expect_bad("{\"image\": \"busybox\", \"gpus\": [\"0\"]}", "gpus");
    expect_bad("{\"image\": \"busybox\", \"gpus\": 0}", "gpus");
    expect_bad("{\"image\": \"busybox\", \"stack\": \"rocm\"}", "stack");
    expect_bad("{\"image\": \"busybox\", \"volumes\": [1]}", "volumes[0]");
    expect_bad("{\"image\": \"busybox\", \"volumes\": [{\"source\": \"a\"}]}", "volumes[0].target");
    expect_bad("{\"image\": \"busybox\", \"volumes\": [{\"source\": \"a\", \"target\": \"/s\", \"ro\": true}]}",
               "volumes[0].ro");
    /* A source that would be an option to mount, or two words. */
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"-oremount\", \"target\": \"/s\"}]}",
               "volumes[0].source");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a b\", \"target\": \"/s\"}]}", "volumes[0].source");
    /* With a bind-mount template: the host's root, or a climb out. */
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"/\", \"target\": \"/s\"}]}", "volumes[0].source");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"../../etc\", \"target\": \"/s\"}]}",
               "volumes[0].source");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"/srv/v/../../etc\", \"target\": \"/s\"}]}",
               "volumes[0].source");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"nfs:../x\", \"target\": \"/s\"}]}",
               "volumes[0].source");
    /* Before a ':' only a host name is a host: a path there is checked
     * whole, so it cannot climb out ahead of the colon. */
    static const char *const climbs[] = {"../../../../dev/block/8:0", "../x:y", "a/../../b:c", ":/x"};
    for (size_t i = 0; i < sizeof climbs / sizeof climbs[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"image\": \"b\", \"volumes\": [{\"source\": \"%s\", \"target\": \"/s\"}]}",
                 climbs[i]);
        expect_bad(text, "volumes[0].source");
    }
    static const char *const fine[] = {"[fd00::1]:/export/v", "nfs-1.example:/export/v", "/srv/v/pci0000:00"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char text[256], field[64];
        struct wl_spec s;
        snprintf(text, sizeof text, "{\"image\": \"b\", \"volumes\": [{\"source\": \"%s\", \"target\": \"/s\"}]}",
                 fine[i]);
        assert_int_equal(parse(text, &s, field), 0);
        assert_string_equal(s.volumes[0].source, fine[i]);
        spec_free(&s);
    }
    static const char *const roots[] = {"//", "/.", "/./", "/.//", "/srv//v", "/srv/v/", "nfs:/", "nfs:"};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"image\": \"b\", \"volumes\": [{\"source\": \"%s\", \"target\": \"/s\"}]}",
                 roots[i]);
        expect_bad(text, "volumes[0].source");
    }
    /* Targets that would change the meaning of -v HOST:TARGET or escape. */
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/s:ro\"}]}", "volumes[0].target");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"s\"}]}", "volumes[0].target");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/\"}]}", "volumes[0].target");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/a/../etc\"}]}",
               "volumes[0].target");
    expect_bad("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/s\"},"
               " {\"source\": \"b\", \"target\": \"/s\"}]}",
               "volumes[1].target");
    /* A size quota is a whole number of GB within gpurentd's bounds. */
    static const char *const bad_sizes[] = {"0", "-1", "1048577", "1e3", "10.0", "\"10\"", "true", "null", "[1]"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/a\", \"size_gb\": 5},"
                 " {\"source\": \"b\", \"target\": \"/b\", \"size_gb\": %s}]}",
                 bad_sizes[i]);
        expect_bad(text, "volumes[1].size_gb");
    }
    expect_bad("{\"image\": \"b\", \"env\": {\"1A\": \"x\"}}", "env.1A");
    expect_bad("{\"image\": \"b\", \"env\": {\"A-B\": \"x\"}}", "env.A-B");
    expect_bad("{\"image\": \"b\", \"env\": {\"A\": 1}}", "env.A");
    /* The agent decides which cards a container sees. */
    expect_bad("{\"image\": \"b\", \"env\": {\"ROCR_VISIBLE_DEVICES\": \"0\"}}", "env.ROCR_VISIBLE_DEVICES");
    expect_bad("{\"image\": \"b\", \"env\": {\"CUDA_VISIBLE_DEVICES\": \"0\"}}", "env.CUDA_VISIBLE_DEVICES");
    /* Nor pass as another workload's process in the sim runtime. */
    expect_bad("{\"image\": \"b\", \"env\": {\"GPURENT_WORKLOAD\": \"wl_other\"}}", "env.GPURENT_WORKLOAD");
}

static void test_bounds(void **state)
{
    char big[8192];
    struct wl_spec s;
    char field[64];
    /* 255 characters of image pass, 256 do not. */
    char img[SPEC_IMAGE_MAX + 1];
    memset(img, 'a', sizeof img);
    img[SPEC_IMAGE_MAX - 1] = '\0';
    snprintf(big, sizeof big, "{\"image\": \"%s\"}", img);
    assert_int_equal(parse(big, &s, field), 0);
    spec_free(&s);
    img[SPEC_IMAGE_MAX - 1] = 'a';
    img[SPEC_IMAGE_MAX] = '\0';
    snprintf(big, sizeof big, "{\"image\": \"%s\"}", img);
    expect_bad(big, "image");

    /* size_gb: 1 and 1048576 (1 PiB, gpurentd's largest volume) pass. */
    assert_int_equal(parse("{\"image\": \"b\", \"volumes\": [{\"source\": \"a\", \"target\": \"/a\", \"size_gb\": 1},"
                           " {\"source\": \"b\", \"target\": \"/b\", \"size_gb\": 1048576}]}",
                           &s, field),
                     0);
    assert_int_equal(s.volumes[0].size_gb, 1);
    assert_int_equal(s.volumes[1].size_gb, SPEC_SIZE_GB_MAX);
    spec_free(&s);

    /* 9 volumes are one too many. */
    size_t n = (size_t)snprintf(big, sizeof big, "{\"image\": \"b\", \"volumes\": [");
    for (int i = 0; i < SPEC_MAX_VOLUMES + 1; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "%s{\"source\": \"s%d\", \"target\": \"/t%d\"}", i ? "," : "",
                              i, i);
    snprintf(big + n, sizeof big - n, "]}");
    expect_bad(big, "volumes");

    /* 65 environment variables are one too many. */
    n = (size_t)snprintf(big, sizeof big, "{\"image\": \"b\", \"env\": {");
    for (int i = 0; i < SPEC_MAX_ENV + 1; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "%s\"V%d\": \"x\"", i ? "," : "", i);
    snprintf(big + n, sizeof big - n, "}}");
    expect_bad(big, "env");

    /* A value of SPEC_ENV_VALUE_MAX bytes is too long. */
    static char huge[SPEC_ENV_VALUE_MAX + 64];
    char val[SPEC_ENV_VALUE_MAX + 1];
    memset(val, 'v', sizeof val);
    val[SPEC_ENV_VALUE_MAX] = '\0';
    snprintf(huge, sizeof huge, "{\"image\": \"b\", \"env\": {\"A\": \"%s\"}}", val);
    expect_bad(huge, "env.A");
}

static void test_equality(void **state)
{
    struct wl_spec a, b;
    char field[64];
    const char *base = "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
                       " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}";
    assert_int_equal(parse(base, &a, field), 0);
    /* The same, with env in another order: equal. */
    assert_int_equal(parse("{\"env\": {\"Y\": \"2\", \"X\": \"1\"}, \"gpus\": [0, 1], \"image\": \"img\","
                           " \"volumes\": [{\"target\": \"/shared\", \"source\": \"s\"}]}",
                           &b, field),
                     0);
    assert_true(spec_equal(&a, &b));
    assert_true(spec_equal(&b, &a));
    spec_free(&b);

    static const char *const different[] = {
        "{\"image\": \"img2\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
        "{\"image\": \"img\", \"gpus\": [1, 0], \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
        "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"3\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
        "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
        "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
        " \"volumes\": [{\"source\": \"s2\", \"target\": \"/shared\"}]}",
        "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"2\"}}",
        "{\"image\": \"img\", \"gpus\": [0, 1], \"stack\": \"CUDA\", \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
        /* A size where there was none: another quota, so another spec. */
        "{\"image\": \"img\", \"gpus\": [0, 1], \"env\": {\"X\": \"1\", \"Y\": \"2\"},"
        " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\", \"size_gb\": 100}]}",
    };
    for (size_t i = 0; i < sizeof different / sizeof different[0]; i++) {
        assert_int_equal(parse(different[i], &b, field), 0);
        assert_false(spec_equal(&a, &b));
        spec_free(&b);
    }
    spec_free(&a);

    /* With sizes: the same size is the same spec, another size is not. */
    const char *sized = "{\"image\": \"img\", \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\","
                        " \"size_gb\": 100}]}";
    assert_int_equal(parse(sized, &a, field), 0);
    assert_int_equal(parse("{\"volumes\": [{\"size_gb\": 100, \"target\": \"/shared\", \"source\": \"s\"}],"
                           " \"image\": \"img\"}",
                           &b, field),
                     0);
    assert_true(spec_equal(&a, &b));
    spec_free(&b);
    assert_int_equal(parse("{\"image\": \"img\", \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\","
                           " \"size_gb\": 101}]}",
                           &b, field),
                     0);
    assert_false(spec_equal(&a, &b));
    spec_free(&b);
    assert_int_equal(parse("{\"image\": \"img\", \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"}]}",
                           &b, field),
                     0);
    assert_false(spec_equal(&a, &b));
    assert_false(spec_equal(&b, &a));
    spec_free(&b);
    spec_free(&a);
}

static void test_json_round_trip(void **state)
{
    struct wl_spec a, b;
    char field[64], err[256];
    assert_int_equal(parse("{\"image\": \"img\", \"gpus\": [2], \"stack\": \"CUDA\", \"env\": {\"B\": \"x\", \"A\": \"y\"},"
                           " \"volumes\": [{\"source\": \"s\", \"target\": \"/shared\"},"
                           " {\"source\": \"q\", \"target\": \"/q\", \"size_gb\": 1048576}]}",
                           &a, field),
                     0);
    json_t *j = spec_to_json(&a);
    assert_non_null(j);
    assert_int_equal(spec_parse(j, &b, field, sizeof field, err, sizeof err), 0);
    assert_true(spec_equal(&a, &b));
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(text, "{\"env\":{\"A\":\"y\",\"B\":\"x\"},\"gpus\":[2],\"image\":\"img\",\"stack\":\"CUDA\","
                              "\"volumes\":[{\"source\":\"s\",\"target\":\"/shared\"},"
                              "{\"size_gb\":1048576,\"source\":\"q\",\"target\":\"/q\"}]}");
    free(text);
    json_decref(j);
    spec_free(&a);
    spec_free(&b);
}

static void test_names_and_phases(void **state)
{
    assert_true(agent_name_valid("wl_7qx-3"));
    assert_true(agent_name_valid("sim-mi450-01"));
    assert_false(agent_name_valid(""));
    assert_false(agent_name_valid("WL_1"));
    assert_false(agent_name_valid("wl/1"));
    assert_false(agent_name_valid("wl 1"));
    assert_false(agent_name_valid(".."));
    char long_name[80];
    memset(long_name, 'a', sizeof long_name);
    long_name[63] = '\0';
    assert_true(agent_name_valid(long_name));
    long_name[63] = 'a';
    long_name[64] = '\0';
    assert_false(agent_name_valid(long_name));

    enum wl_phase p;
    for (int i = WL_PULLING; i <= WL_FAILED; i++) {
        assert_int_equal(wl_phase_parse(wl_phase_name((enum wl_phase)i), &p), 0);
        assert_int_equal(p, i);
    }
    assert_string_equal(wl_phase_name(WL_RUNNING), "running");
    assert_int_equal(wl_phase_parse("removed", &p), -1);
}

static void test_sim_switches(void **state)
{
    struct wl_spec s = {0};
    s.image = (char *)(uintptr_t)"registry/exit-after-250:latest";
    assert_int_equal(sim_exit_after_ms(&s, 5000), 250);
    s.image = (char *)(uintptr_t)"busybox-exit-after";
    assert_int_equal(sim_exit_after_ms(&s, 5000), 5000);
    s.image = (char *)(uintptr_t)"busybox";
    assert_int_equal(sim_exit_after_ms(&s, 5000), -1);
    s.image = (char *)(uintptr_t)"exit-after-99999999999";
    assert_int_equal(sim_exit_after_ms(&s, 5000), 86400000);
    s.image = (char *)(uintptr_t)"x/fail-pull";
    assert_true(spec_image_has(&s, "fail-pull"));
    assert_false(spec_image_has(&s, "fail-start"));
}

#define KEY_ED "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIM9DZ3VtLWKV/52U+E2HTaN7kEefgRLIcmUmQRHCiu1"
#define KEY_EC                                                                                                        \
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBHjqs4qlTyvPNDA/"                         \
    "dUNgsNfk989ON7+mzM1sw16qmKgdvPNuidunQGtILY/LfwuOj+3ZKzuVuSd7YC+mikkH2wI="

/* ssh: parsed, canonical only when given, part of equality. */
static void test_ssh(void **state)
{
    struct wl_spec a, b;
    char field[64];
    const char *with = "{\"image\": \"img\", \"ssh\": {\"user\": \"ins_abc-0\", \"authorized_keys\": [\"" KEY_ED
                       "\", \"" KEY_EC "\"]}}";
    assert_int_equal(parse(with, &a, field), 0);
    assert_true(a.ssh.present);
    assert_string_equal(a.ssh.user, "ins_abc-0");
    assert_int_equal(a.ssh.n_keys, 2);
    assert_string_equal(a.ssh.keys[1], KEY_EC);
    json_t *j = spec_to_json(&a);
    char err[256];
    assert_non_null(json_object_get(j, "ssh"));
    assert_int_equal(spec_parse(j, &b, field, sizeof field, err, sizeof err), 0);
    assert_true(spec_equal(&a, &b));
    json_decref(j);
    spec_free(&b);

    /* Without ssh: not present, not in the canonical form, not equal. */
    assert_int_equal(parse("{\"image\": \"img\"}", &b, field), 0);
    assert_false(b.ssh.present);
    j = spec_to_json(&b);
    assert_null(json_object_get(j, "ssh"));
    json_decref(j);
    assert_false(spec_equal(&a, &b));
    spec_free(&b);
    /* Other keys, fewer keys, another order, another user: different. */
    static const char *const different[] = {
        "{\"image\": \"img\", \"ssh\": {\"user\": \"ins_abc-0\", \"authorized_keys\": [\"" KEY_ED "\"]}}",
        "{\"image\": \"img\", \"ssh\": {\"user\": \"ins_abc-0\", \"authorized_keys\": [\"" KEY_EC "\", \"" KEY_ED
        "\"]}}",
        "{\"image\": \"img\", \"ssh\": {\"user\": \"ins_abc-1\", \"authorized_keys\": [\"" KEY_ED "\", \"" KEY_EC
        "\"]}}",
    };
    for (size_t i = 0; i < sizeof different / sizeof different[0]; i++) {
        assert_int_equal(parse(different[i], &b, field), 0);
        assert_false(spec_equal(&a, &b));
        /* Only the user makes them differ but for the keys (a PUT with
         * other keys replaces them; one with another user is a conflict). */
        assert_int_equal(spec_equal_but_ssh_keys(&a, &b), i < 2);
        spec_free(&b);
    }
    /* The digest: SHA-256 of each line and a newline, in order; of "" for none. */
    char digest[65], want[65];
    spec_ssh_keys_digest(&a.ssh, digest);
    const char *joined = KEY_ED "\n" KEY_EC "\n";
    sha256_hex(joined, strlen(joined), want);
    assert_string_equal(digest, want);
    assert_int_equal(parse("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": []}}", &b, field), 0);
    spec_ssh_keys_digest(&b.ssh, digest);
    assert_string_equal(digest, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    spec_free(&b);
    /* A key list on its own (PUT .../ssh-keys): checked line by line, the
     * field named after the caller's. */
    struct spec_ssh keys = {0};
    char why[256];
    json_t *list = json_pack("[s, s]", KEY_EC, "ssh-ed25519 AAAA");
    assert_int_equal(spec_ssh_keys_parse(list, "authorized_keys", &keys, field, 64, why, sizeof why), -1);
    assert_string_equal(field, "authorized_keys[1]");
    spec_ssh_keys_free(keys.keys, keys.n_keys);
    json_decref(list);
    list = json_pack("[s]", KEY_EC);
    assert_int_equal(spec_ssh_keys_parse(list, "authorized_keys", &keys, field, 64, why, sizeof why), 0);
    assert_int_equal(keys.n_keys, 1);
    assert_string_equal(keys.keys[0], KEY_EC);
    spec_ssh_keys_free(keys.keys, keys.n_keys);
    json_decref(list);
    spec_free(&a);
    /* No keys is a valid (if useless) list. */
    assert_int_equal(parse("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": []}}", &b, field), 0);
    assert_int_equal(b.ssh.n_keys, 0);
    spec_free(&b);

    expect_bad("{\"image\": \"img\", \"ssh\": []}", "ssh");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": [], \"x\": 1}}", "ssh.x");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"authorized_keys\": []}}", "ssh.user");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"\", \"authorized_keys\": []}}", "ssh.user");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"Root\", \"authorized_keys\": []}}", "ssh.user");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"a b\", \"authorized_keys\": []}}", "ssh.user");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": 5, \"authorized_keys\": []}}", "ssh.user");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\"}}", "ssh.authorized_keys");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": \"" KEY_ED "\"}}",
               "ssh.authorized_keys");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": [\"" KEY_ED " me@host\"]}}",
               "ssh.authorized_keys[0]");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": [\"" KEY_ED "\", 3]}}",
               "ssh.authorized_keys[1]");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": [\"ssh-ed25519 AAAA\"]}}",
               "ssh.authorized_keys[0]");
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": [\"ssh-foo AAAA\"]}}",
               "ssh.authorized_keys[0]");
    /* The type word and the blob disagree. */
    expect_bad("{\"image\": \"img\", \"ssh\": {\"user\": \"u\", \"authorized_keys\": "
               "[\"ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIIM9DZ3VtLWKV/52U+E2HTaN7kEefgRLIcmUmQRHCiu1\"]}}",
               "ssh.authorized_keys[0]");

    /* Bounds: an 80-character user, 64 keys; one more of either is refused. */
    char user[96], text[8192];
    memset(user, 'u', 80);
    user[80] = '\0';
    snprintf(text, sizeof text, "{\"image\": \"img\", \"ssh\": {\"user\": \"%s\", \"authorized_keys\": []}}", user);
    assert_int_equal(parse(text, &b, field), 0);
    spec_free(&b);
    user[80] = 'u';
    user[81] = '\0';
    snprintf(text, sizeof text, "{\"image\": \"img\", \"ssh\": {\"user\": \"%s\", \"authorized_keys\": []}}", user);
    expect_bad(text, "ssh.user");
    static char many[65 * 120 + 200];
    for (int n = 64; n <= 65; n++) {
        size_t off = (size_t)snprintf(many, sizeof many, "{\"image\": \"img\", \"ssh\": {\"user\": \"u\", "
                                                         "\"authorized_keys\": [");
        for (int i = 0; i < n; i++)
            off += (size_t)snprintf(many + off, sizeof many - off, "%s\"" KEY_ED "\"", i ? ", " : "");
        snprintf(many + off, sizeof many - off, "]}}");
        if (n == 64) {
            assert_int_equal(parse(many, &b, field), 0);
            assert_int_equal(b.ssh.n_keys, 64);
            spec_free(&b);
        } else {
            expect_bad(many, "ssh.authorized_keys");
        }
    }
}

/* ports: parsed in order, canonical only when given, part of equality,
 * every bound refused with the entry's field. */
static void test_ports(void **state)
{
    struct wl_spec a, b;
    char field[64], err[256];
    const char *with =
        "{\"image\": \"img\", \"ports\": [{\"container\": 8888, \"host\": 30007}, {\"container\": 1, \"host\": 65535}]}";
    assert_int_equal(parse(with, &a, field), 0);
    assert_int_equal(a.n_ports, 2);
    assert_int_equal(a.ports[0].container, 8888);
    assert_int_equal(a.ports[0].host, 30007);
    assert_int_equal(a.ports[1].container, 1);
    assert_int_equal(a.ports[1].host, 65535);
    json_t *j = spec_to_json(&a);
    json_t *ports = json_object_get(j, "ports");
    assert_int_equal(json_array_size(ports), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ports, 0), "host")), 30007);
    assert_int_equal(spec_parse(j, &b, field, sizeof field, err, sizeof err), 0);
    assert_true(spec_equal(&a, &b));
    json_decref(j);
    spec_free(&b);

    /* None, an empty list and null are the same spec, without "ports". */
    static const char *const none[] = {"{\"image\": \"img\"}", "{\"image\": \"img\", \"ports\": []}",
                                       "{\"image\": \"img\", \"ports\": null}"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        assert_int_equal(parse(none[i], &b, field), 0);
        assert_int_equal(b.n_ports, 0);
        j = spec_to_json(&b);
        assert_null(json_object_get(j, "ports"));
        json_decref(j);
        assert_false(spec_equal(&a, &b));
        spec_free(&b);
    }
    /* Another host port, another order, one fewer: different. */
    static const char *const different[] = {
        "{\"image\": \"img\", \"ports\": [{\"container\": 8888, \"host\": 30008}, {\"container\": 1, \"host\": 65535}]}",
        "{\"image\": \"img\", \"ports\": [{\"container\": 1, \"host\": 65535}, {\"container\": 8888, \"host\": 30007}]}",
        "{\"image\": \"img\", \"ports\": [{\"container\": 8888, \"host\": 30007}]}",
    };
    for (size_t i = 0; i < sizeof different / sizeof different[0]; i++) {
        assert_int_equal(parse(different[i], &b, field), 0);
        assert_false(spec_equal(&a, &b));
        spec_free(&b);
    }
    spec_free(&a);

    /* Eight is the most. */
    char text[1024];
    size_t len = (size_t)snprintf(text, sizeof text, "{\"image\": \"img\", \"ports\": [");
    for (int i = 0; i < SPEC_MAX_PORTS + 1; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s{\"container\": %d, \"host\": %d}", i ? ", " : "",
                                8000 + i, 30000 + i);
    snprintf(text + len, sizeof text - len, "]}");
    expect_bad(text, "ports");
    char *last = strrchr(text, '{');
    snprintf(last - 2, 4, "]}");
    assert_int_equal(parse(text, &b, field), 0);
    assert_int_equal(b.n_ports, SPEC_MAX_PORTS);
    spec_free(&b);

    expect_bad("{\"image\": \"img\", \"ports\": {}}", "ports");
    expect_bad("{\"image\": \"img\", \"ports\": [8888]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 8888}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 8888, \"host\": \"30007\"}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 0, \"host\": 30007}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 65536, \"host\": 30007}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 80, \"host\": -1}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 80, \"host\": 30007, \"udp\": true}]}", "ports[0]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 80, \"host\": 30007},"
               " {\"container\": 80, \"host\": 30008}]}",
               "ports[1]");
    expect_bad("{\"image\": \"img\", \"ports\": [{\"container\": 80, \"host\": 30007},"
               " {\"container\": 81, \"host\": 30007}]}",
               "ports[1]");
}


/* command, working_dir and secret_env (issue 12): parsed, bounded, kept in
 * the record's JSON, part of equality, and secret values masked in the
 * public view; podman's env file holds NAME=VALUE lines. */
static void test_command_and_secrets(void **state)
{
    struct wl_spec a, b;
    char field[64];
    assert_int_equal(parse("{\"image\": \"img\", \"env\": {\"T\": \"hush\", \"A\": \"1\"},"
                           " \"secret_env\": [\"T\"], \"command\": [\"python3\", \"-c\", \"print(1)\"],"
                           " \"working_dir\": \"/shared/p\"}", &a, field), 0);
    assert_int_equal(a.n_command, 3);
    assert_string_equal(a.command[2], "print(1)");
    assert_string_equal(a.working_dir, "/shared/p");
    assert_string_equal(a.env[1].name, "T");
    assert_true(a.env[1].secret && !a.env[0].secret);
    json_t *pub = json_object();
    spec_public_json(&a, pub);
    assert_string_equal(json_string_value(json_object_get(json_object_get(pub, "env"), "T")), "***");
    assert_string_equal(json_string_value(json_object_get(json_object_get(pub, "env"), "A")), "1");
    json_decref(pub);
    char *file = oci_env_file_text(&a);
    assert_string_equal(file, "A=1\nT=hush\n");
    free(file);
    /* The record keeps everything; it parses back to an equal spec. */
    json_t *j = spec_to_json(&a);
    char f2[64], err[256];
    assert_int_equal(spec_parse(j, &b, f2, sizeof f2, err, sizeof err), 0);
    json_decref(j);
    assert_true(spec_equal(&a, &b));
    b.env[1].secret = 0;
    assert_false(spec_equal(&a, &b));
    b.env[1].secret = 1;
    b.working_dir[0] = '\0';
    assert_false(spec_equal(&a, &b));
    spec_free(&b);
    spec_free(&a);

    expect_bad("{\"image\": \"img\", \"command\": []}", "command");
    expect_bad("{\"image\": \"img\", \"command\": \"sh\"}", "command");
    expect_bad("{\"image\": \"img\", \"command\": [\"\"]}", "command");
    expect_bad("{\"image\": \"img\", \"command\": [\"a\", 2]}", "command");
    expect_bad("{\"image\": \"img\", \"working_dir\": \"rel\"}", "working_dir");
    expect_bad("{\"image\": \"img\", \"working_dir\": \"/a/../b\"}", "working_dir");
    expect_bad("{\"image\": \"img\", \"working_dir\": 3}", "working_dir");
    expect_bad("{\"image\": \"img\", \"secret_env\": [\"T\"]}", "secret_env");
    expect_bad("{\"image\": \"img\", \"env\": {\"T\": \"a\\nb\"}, \"secret_env\": [\"T\"]}", "secret_env");
    expect_bad("{\"image\": \"img\", \"env\": {\"T\": \"x\"}, \"secret_env\": \"T\"}", "secret_env");
    /* 64 words pass, 65 do not. */
    static char many[2000];
    for (int n = 64; n <= 65; n++) {
        size_t off = (size_t)snprintf(many, sizeof many, "{\"image\": \"img\", \"command\": [");
        for (int i = 0; i < n; i++)
            off += (size_t)snprintf(many + off, sizeof many - off, "%s\"w\"", i ? ", " : "");
        snprintf(many + off, sizeof many - off, "]}");
        if (n == 64) {
            assert_int_equal(parse(many, &a, field), 0);
            spec_free(&a);
        } else {
            expect_bad(many, "command");
        }
    }
}

/* health: strict shape, round trip, equality, and the verdict's rule. */
static void test_health(void **state)
{
    (void)state;
    struct wl_spec a, b;
    char field[64];
    assert_int_equal(parse("{\"image\":\"x\",\"health\":{\"port\":8000,\"path\":\"/health\",\"interval_s\":2}}", &a,
                           field),
                     0);
    assert_true(a.health.present);
    assert_int_equal(a.health.port, 8000);
    assert_string_equal(a.health.path, "/health");
    assert_int_equal(a.health.interval_s, 2);
    json_t *j = spec_to_json(&a);
    assert_int_equal(spec_parse(j, &b, field, sizeof field, (char[256]){0}, 256), 0);
    json_decref(j);
    assert_true(spec_equal(&a, &b));
    b.health.interval_s = 3;
    assert_false(spec_equal(&a, &b));
    spec_free(&b);
    assert_int_equal(parse("{\"image\":\"x\"}", &b, field), 0);
    assert_false(b.health.present);
    assert_false(spec_equal(&a, &b));
    spec_free(&a);
    spec_free(&b);

    expect_bad("{\"image\":\"x\",\"health\":1}", "health");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":8000,\"path\":\"/h\",\"interval_s\":2,\"x\":1}}", "health.x");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":0,\"path\":\"/h\",\"interval_s\":2}}", "health.port");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":65536,\"path\":\"/h\",\"interval_s\":2}}", "health.port");
    expect_bad("{\"image\":\"x\",\"health\":{\"path\":\"/h\",\"interval_s\":2}}", "health.port");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"h\",\"interval_s\":2}}", "health.path");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/a b\",\"interval_s\":2}}", "health.path");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/a\\u0000b\",\"interval_s\":2}}", "health.path");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/a\\r\\n\",\"interval_s\":2}}", "health.path");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/h\",\"interval_s\":0}}", "health.interval_s");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/h\",\"interval_s\":3601}}", "health.interval_s");
    expect_bad("{\"image\":\"x\",\"health\":{\"port\":80,\"path\":\"/h\"}}", "health.interval_s");

    /* Nothing listening keeps a starting server starting; a bad answer, or
     * silence after a pass, is unhealthy; 2xx and 3xx pass. */
    assert_int_equal(health_next(WL_HEALTH_STARTING, 0, 0), WL_HEALTH_STARTING);
    assert_int_equal(health_next(WL_HEALTH_STARTING, 1, 500), WL_HEALTH_UNHEALTHY);
    assert_int_equal(health_next(WL_HEALTH_STARTING, 1, 204), WL_HEALTH_HEALTHY);
    assert_int_equal(health_next(WL_HEALTH_HEALTHY, 1, 302), WL_HEALTH_HEALTHY);
    assert_int_equal(health_next(WL_HEALTH_HEALTHY, 0, 0), WL_HEALTH_UNHEALTHY);
    assert_int_equal(health_next(WL_HEALTH_HEALTHY, 1, 404), WL_HEALTH_UNHEALTHY);
    assert_int_equal(health_next(WL_HEALTH_UNHEALTHY, 1, 200), WL_HEALTH_HEALTHY);
    assert_string_equal(wl_health_name(WL_HEALTH_UNHEALTHY), "unhealthy");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_spec),       cmocka_unit_test(test_minimal_spec),
        cmocka_unit_test(test_refusals),        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_equality),        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_names_and_phases), cmocka_unit_test(test_sim_switches),
        cmocka_unit_test(test_ssh),             cmocka_unit_test(test_ports),
        cmocka_unit_test(test_command_and_secrets),
        cmocka_unit_test(test_health),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
