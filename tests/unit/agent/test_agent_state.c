/* test_agent_state.c: unit tests for what the agent keeps on disk: workload
 * records written atomically and read back equal (how a workload ended
 * included, and an older agent's records without it), unusable records
 * moved aside, leftovers of interrupted writes removed, node secrets and
 * fleet registrations with their file modes, and the state directory lock. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

#define SECRET "5f1c0a9e7b3d4c2a8e6f0d1b9a7c5e3f2d4b6a8c0e1f3a5b7d9c2e4f6a8b0c1d"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/gpurent-agent-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    /* Only the directory this test made. */
    snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void write_text(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    fchmod(fd, mode);
    close(fd);
}

static struct workload *make_workload(const char *id, const char *spec_json)
{
    struct workload *w = calloc(1, sizeof *w);
    char field[64], err[256];
    json_t *j = json_loads(spec_json, 0, NULL);
    assert_non_null(j);
    assert_int_equal(spec_parse(j, &w->spec, field, sizeof field, err, sizeof err), 0);
    json_decref(j);
    snprintf(w->id, sizeof w->id, "%s", id);
    return w;
}

struct loaded {
    struct workload *w[8];
    int n;
};

static void collect(struct agent_node *node, struct workload *w, void *ctx)
{
    struct loaded *l = ctx;
    assert_true(l->n < 8);
    l->w[l->n++] = w;
}

static void test_record_round_trip(void **state)
{
    struct workload *w = make_workload("wl_round", "{\"image\": \"rocm/pytorch:2.3\", \"gpus\": [4, 5],"
                                                   " \"stack\": \"ROCm\", \"env\": {\"K\": \"v w\"},"
                                                   " \"volumes\": [{\"source\": \"nfs:/x\", \"target\": \"/shared\"}]}");
    w->phase = WL_FAILED;
    snprintf(w->message, sizeof w->message, "pull: exit status 125: Error: \"quoted\"");
    w->created_at = 1795976993;
    w->updated_at = 1795977001;
    w->removing = 1;
    assert_int_equal(record_save(dir, w), 0);

    char path[256];
    snprintf(path, sizeof path, "%s/workloads/wl_round.json", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    struct agent_node node = {0};
    struct loaded l = {0};
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    struct workload *r = l.w[0];
    assert_ptr_equal(r->node, &node);
    assert_string_equal(r->id, "wl_round");
    assert_true(spec_equal(&r->spec, &w->spec));
    assert_int_equal(r->phase, WL_FAILED);
    assert_string_equal(r->message, w->message);
    assert_int_equal(r->created_at, 1795976993);
    assert_int_equal(r->updated_at, 1795977001);
    assert_int_equal(r->removing, 1);
    workload_free(r);

    /* Saving again replaces the record; deleting removes it. */
    w->removing = 0;
    w->phase = WL_RUNNING;
    assert_int_equal(record_save(dir, w), 0);
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_int_equal(l.w[0]->phase, WL_RUNNING);
    assert_int_equal(l.w[0]->removing, 0);
    workload_free(l.w[0]);
    assert_int_equal(record_delete(dir, "wl_round"), 0);
    assert_int_equal(record_delete(dir, "wl_round"), 0); /* gone is fine */
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 0);
    workload_free(w);
    workload_free(NULL);
}

/* A runtime's error text longer than the message field, with a character
 * across the cut and bytes that are not UTF-8, still makes a record that
 * is saved, loaded and saved again: cut between characters, the bad bytes
 * '?'. A record file whose message is cut inside a character on reading
 * (found by tests/fuzz/fuzz_spec.c) loads too. */
static void test_record_with_long_multibyte_message(void **state)
{
    struct workload *w = make_workload("wl_utf8", "{\"image\": \"img\"}");
    char msg[600] = "x";
    for (int i = 0; i < 120; i++)
        strcat(msg, "\xe5\xae\xb9"); /* 容: the field's 255 bytes end inside one */
    workload_message_set(w, msg);
    assert_int_equal(strlen(w->message), 253);
    assert_memory_equal(w->message, msg, 253);
    w->phase = WL_FAILED;
    assert_int_equal(record_save(dir, w), 0);
    struct agent_node node = {0};
    struct loaded l = {0};
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_string_equal(l.w[0]->message, w->message);
    workload_free(l.w[0]);

    workload_message_set(w, "podman: \xff\xfe bad \xe5\xae");
    assert_string_equal(w->message, "podman: ?? bad ??");
    assert_int_equal(record_save(dir, w), 0);

    /* A record written with the whole message, read into the shorter field. */
    char path[256];
    snprintf(path, sizeof path, "%s/workloads/wl_utf8.json", dir);
    json_t *rec = record_to_json(w);
    assert_non_null(rec);
    json_object_set_new(rec, "message", json_string(msg));
    assert_int_equal(json_dump_file(rec, path, 0), 0);
    json_decref(rec);
    struct workload *back = calloc(1, sizeof *back);
    char err[256];
    json_t *j = json_load_file(path, 0, NULL);
    assert_int_equal(record_from_json(j, back, err, sizeof err), 0);
    json_decref(j);
    assert_int_equal(strlen(back->message), 253);
    json_t *again = record_to_json(back);
    assert_non_null(again); /* was NULL: the record could not be saved again */
    json_decref(again);
    workload_free(back);
    workload_free(w);
}

/* How a workload ended survives a save and a load: the exit second and
 * status, the instant it entered running, and null for each when unknown. */
static void test_record_keeps_how_it_ended(void **state)
{
    struct workload *w = make_workload("wl_ended", "{\"image\": \"registry/exit-after-1500:1\"}");
    w->phase = WL_EXITED;
    snprintf(w->message, sizeof w->message, "the container exited with status 3");
    w->created_at = 1795976993;
    w->updated_at = 1795977004;
    w->running_at_ms = 1795976995250;
    w->exited_at = 1795977001;
    w->exit_known = 1;
    w->exit_code = 3;
    assert_int_equal(record_save(dir, w), 0);

    char path[256];
    snprintf(path, sizeof path, "%s/workloads/wl_ended.json", dir);
    size_t len = 0;
    char *text = state_read_file(path, STATE_RECORD_MAX, &len);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"exited_at\":1795977001"));
    assert_non_null(strstr(text, "\"exit_code\":3"));
    assert_non_null(strstr(text, "\"running_at_ms\":1795976995250"));
    free(text);

    struct agent_node node = {0};
    struct loaded l = {0};
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    struct workload *r = l.w[0];
    assert_int_equal(r->phase, WL_EXITED);
    assert_int_equal(r->running_at_ms, 1795976995250);
    assert_int_equal(r->exited_at, 1795977001);
    assert_int_equal(r->exit_known, 1);
    assert_int_equal(r->exit_code, 3);
    workload_free(r);

    /* Failed before its container ran: an exit second, no status. A
     * negative status (docker reports -1 for some) is a status too. */
    w->phase = WL_FAILED;
    w->running_at_ms = 0;
    w->exit_known = 0;
    w->exit_code = 0;
    assert_int_equal(record_save(dir, w), 0);
    text = state_read_file(path, STATE_RECORD_MAX, &len);
    assert_non_null(strstr(text, "\"exit_code\":null"));
    assert_non_null(strstr(text, "\"running_at_ms\":null"));
    free(text);
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_int_equal(l.w[0]->exited_at, 1795977001);
    assert_int_equal(l.w[0]->exit_known, 0);
    assert_int_equal(l.w[0]->running_at_ms, 0);
    workload_free(l.w[0]);
    w->exit_known = 1;
    w->exit_code = -1;
    assert_int_equal(record_save(dir, w), 0);
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_int_equal(l.w[0]->exit_known, 1);
    assert_int_equal(l.w[0]->exit_code, -1);
    workload_free(l.w[0]);

    /* Still running: every one of them null but the running instant. */
    w->phase = WL_RUNNING;
    w->running_at_ms = 1795976995250;
    w->exited_at = 0;
    w->exit_known = 0;
    assert_int_equal(record_save(dir, w), 0);
    text = state_read_file(path, STATE_RECORD_MAX, &len);
    assert_non_null(strstr(text, "\"exited_at\":null"));
    assert_non_null(strstr(text, "\"exit_code\":null"));
    free(text);
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_int_equal(l.w[0]->exited_at, 0);
    assert_int_equal(l.w[0]->exit_known, 0);
    assert_int_equal(l.w[0]->running_at_ms, 1795976995250);
    workload_free(l.w[0]);
    workload_free(w);
}

/* Records written by the agent before exits were reported have none of the
 * three fields: they load, as unknown. */
static void test_older_records_load_without_exit_fields(void **state)
{
    char wdir[128], path[256];
    snprintf(wdir, sizeof wdir, "%s/workloads", dir);
    assert_int_equal(state_mkdirs(wdir), 0);
    snprintf(path, sizeof path, "%s/wl_old.json", wdir);
    write_text(path,
               "{\"created_at\":1795976993,\"id\":\"wl_old\",\"message\":\"the container exited with status 0\","
               "\"phase\":\"exited\",\"removing\":false,\"spec\":{\"env\":{},\"gpus\":[0],\"image\":\"busybox\","
               "\"stack\":\"ROCm\",\"volumes\":[]},\"updated_at\":1795977001,\"version\":1}",
               0600);
    struct agent_node node = {0};
    struct loaded l = {0};
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    struct workload *r = l.w[0];
    assert_string_equal(r->id, "wl_old");
    assert_int_equal(r->phase, WL_EXITED);
    assert_int_equal(r->updated_at, 1795977001);
    assert_int_equal(r->exited_at, 0);
    assert_int_equal(r->exit_known, 0);
    assert_int_equal(r->running_at_ms, 0);
    /* The API shows them as null. */
    json_t *doc = workload_json(r);
    assert_true(json_is_null(json_object_get(doc, "exited_at")));
    assert_true(json_is_null(json_object_get(doc, "exit_code")));
    json_decref(doc);
    workload_free(r);

    /* Present but of the wrong kind: the record is unusable, as for any field. */
    static const char *const bad[] = {"\"exited_at\":\"1795977001\"", "\"exited_at\":0", "\"exit_code\":1.5",
                                      "\"exit_code\":4294967296", "\"running_at_ms\":-5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(path, sizeof path, "%s/wl_bad%zu.json", wdir, i);
        snprintf(text, sizeof text,
                 "{\"version\":1,\"id\":\"wl_bad%zu\",\"spec\":{\"image\":\"b\"},\"phase\":\"exited\","
                 "\"message\":\"\",\"created_at\":1,\"updated_at\":1,\"removing\":false,%s}",
                 i, bad[i]);
        write_text(path, text, 0600);
    }
    l.n = 0;
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_string_equal(l.w[0]->id, "wl_old");
    workload_free(l.w[0]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/wl_bad%zu.json.corrupt", wdir, i);
        assert_int_equal(access(path, F_OK), 0);
    }
}

static void test_bad_records_are_moved_aside(void **state)
{
    char wdir[128], path[256];
    snprintf(wdir, sizeof wdir, "%s/workloads", dir);
    assert_int_equal(state_mkdirs(wdir), 0);
    struct workload *w = make_workload("wl_good", "{\"image\": \"busybox\"}");
    assert_int_equal(record_save(dir, w), 0);
    workload_free(w);

    snprintf(path, sizeof path, "%s/wl_trunc.json", wdir);
    write_text(path, "{\"version\":1,\"id\":\"wl_tr", 0600);
    snprintf(path, sizeof path, "%s/wl_other.json", wdir);
    write_text(path,
               "{\"version\":1,\"id\":\"wl_x\",\"spec\":{\"image\":\"b\"},\"phase\":\"running\",\"message\":\"\","
               "\"created_at\":1,\"updated_at\":1,\"removing\":false}",
               0600);
    snprintf(path, sizeof path, "%s/wl_phase.json", wdir);
    write_text(path,
               "{\"version\":1,\"id\":\"wl_phase\",\"spec\":{\"image\":\"b\"},\"phase\":\"dancing\",\"message\":\"\","
               "\"created_at\":1,\"updated_at\":1,\"removing\":false}",
               0600);
    snprintf(path, sizeof path, "%s/wl_spec.json", wdir);
    write_text(path,
               "{\"version\":1,\"id\":\"wl_spec\",\"spec\":{\"image\":\"--privileged\"},\"phase\":\"running\","
               "\"message\":\"\",\"created_at\":1,\"updated_at\":1,\"removing\":false}",
               0600);
    /* A write a crash interrupted. */
    snprintf(path, sizeof path, "%s/.wl_good.json.tmp", wdir);
    write_text(path, "{\"vers", 0600);

    struct agent_node node = {0};
    struct loaded l = {0};
    assert_int_equal(records_load(dir, &node, collect, &l), 1);
    assert_string_equal(l.w[0]->id, "wl_good");
    workload_free(l.w[0]);

    static const char *const aside[] = {"wl_trunc", "wl_other", "wl_phase", "wl_spec"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s.json.corrupt", wdir, aside[i]);
        assert_int_equal(access(path, F_OK), 0);
        snprintf(path, sizeof path, "%s/%s.json", wdir, aside[i]);
        assert_int_equal(access(path, F_OK), -1);
    }
    snprintf(path, sizeof path, "%s/.wl_good.json.tmp", wdir);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_atomic_write_and_read(void **state)
{
    char path[256];
    assert_int_equal(state_write_atomic(dir, "f", "hello", 5, 0640), 0);
    snprintf(path, sizeof path, "%s/f", dir);
    size_t len = 0;
    char *text = state_read_file(path, 5, &len);
    assert_non_null(text);
    assert_int_equal(len, 5);
    assert_string_equal(text, "hello");
    free(text);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    /* A file over the cap is refused rather than cut. */
    assert_null(state_read_file(path, 4, &len));
    snprintf(path, sizeof path, "%s/.f.tmp", dir);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_secret_file(void **state)
{
    char path[256], out[65], err[256];
    snprintf(path, sizeof path, "%s/secret", dir);
    write_text(path, SECRET "\n", 0600);
    assert_int_equal(secret_read(path, out, err, sizeof err), 0);
    assert_string_equal(out, SECRET);

    chmod(path, 0644);
    assert_int_equal(secret_read(path, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "chmod 600"));
    assert_string_equal(out, "");

    write_text(path, "5F1C", 0600);
    assert_int_equal(secret_read(path, out, err, sizeof err), -1);
    write_text(path, SECRET "00", 0600);
    assert_int_equal(secret_read(path, out, err, sizeof err), -1);
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(secret_read(path, out, err, sizeof err), -1);

    assert_true(secret_valid(SECRET));
    assert_false(secret_valid("abc"));
}

static void test_registration(void **state)
{
    char node_dir[128], id[ID_MAX], secret[65], path[256];
    snprintf(node_dir, sizeof node_dir, "%s/nodes/sim-mi450-01", dir);
    assert_int_equal(registration_load(node_dir, id, secret), -1);
    assert_int_equal(registration_save(node_dir, "node_abc", SECRET), 0);
    assert_int_equal(registration_load(node_dir, id, secret), 0);
    assert_string_equal(id, "node_abc");
    assert_string_equal(secret, SECRET);
    snprintf(path, sizeof path, "%s/registration.json", node_dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(node_dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
}

static void test_lock(void **state)
{
    int fd = state_lock(dir);
    assert_true(fd >= 0);
    assert_int_equal(state_lock(dir), -1); /* a second agent on the same directory */
    close(fd);
    fd = state_lock(dir);
    assert_true(fd >= 0);
    close(fd);
}

int main(void)
{
    log_set_level(LOG_LVL_ERROR - 1); /* the moved-aside records log errors on purpose */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_keeps_how_it_ended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_with_long_multibyte_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_records_load_without_exit_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_records_are_moved_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_atomic_write_and_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
