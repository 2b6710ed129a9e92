/* fuzz_spec.c: fuzz target for the workload spec the agent takes from the
 * control plane (spec_parse, PUT /v1/workloads/{id}) and the workload
 * record it reads back from its state directory at start
 * (record_from_json): a refusal names a reason, and what is accepted
 * survives its own round trip: spec_to_json reads back as an equal spec
 * and is a fixed point, and a record written by record_to_json reads back
 * and writes out the same JSON, the way a restart reads what the last run
 * saved; a cluster's hostfiles, known_hosts and ssh config hold a line
 * per rank whatever its fields. */
#include "agent.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libssh 0.10.6 (Debian 12) leaks 5 bytes inside itself when it refuses
 * some malformed OpenSSH private keys (a cluster identity), the key freed
 * or never made: corpus spec/libssh-leak-malformed-identity. Not ours to
 * free, so LeakSanitizer is told to skip leaks allocated in libssh; that
 * also hides a key this code forgot to free, which the unit tests'
 * sanitized run (tests/unit/agent) still finds. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libssh.so\n";
}

/* Whether text is n lines, each with exactly spaces spaces and no other
 * control character: no field of a host made a line of its own. */
static int lines_of(const char *text, int n, int spaces)
{
    int lines = 0, in_line = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') {
            if (in_line != spaces)
                return 0;
            lines++;
            in_line = 0;
        } else if (*p == ' ') {
            in_line++;
        } else if ((unsigned char)*p < ' ' || *p == 0x7f) {
            return 0;
        }
    }
    return lines == n && in_line == 0;
}

/* The files a cluster's container gets (cluster.c): a line per rank, and
 * the ssh config's eight per rank after its comment. */
static void check_cluster_files(const struct spec_cluster *c)
{
    char *deepspeed = cluster_hostfile(c, 0), *mpi = cluster_hostfile(c, 1), *kh = cluster_known_hosts(c);
    char *config = cluster_ssh_config(c, "/root/.ssh");
    if (!deepspeed || !mpi || !kh || !config)
        abort();
    if (!lines_of(deepspeed, c->n_hosts, 1) || !lines_of(mpi, c->n_hosts, 0) || !lines_of(kh, c->n_hosts, 2))
        abort();
    int config_lines = 0;
    for (const char *p = config; *p; p++) {
        config_lines += *p == '\n';
        if (*p == '\r' || *p == '"')
            abort();
    }
    if (config_lines != 1 + 8 * c->n_hosts)
        abort();
    free(deepspeed);
    free(mpi);
    free(kh);
    free(config);
}

static void check_spec(const json_t *j)
{
    struct wl_spec spec, again;
    char field[64], err[256];
    err[0] = '\0';
    if (spec_parse(j, &spec, field, sizeof field, err, sizeof err) < 0) {
        if (!err[0])
            abort(); /* every refusal says why */
        return;
    }
    if (spec.cluster.present)
        check_cluster_files(&spec.cluster);
    json_t *out = spec_to_json(&spec);
    if (!out)
        abort(); /* an accepted spec that cannot be written back */
    if (spec_parse(out, &again, field, sizeof field, err, sizeof err) < 0 || !spec_equal(&spec, &again))
        abort();
    json_t *out2 = spec_to_json(&again);
    if (!out2 || !json_equal(out, out2))
        abort();
    json_decref(out);
    json_decref(out2);
    spec_free(&spec);
    spec_free(&again);
}

static void check_record(const json_t *j)
{
    struct workload *w = calloc(1, sizeof *w), *back = calloc(1, sizeof *back);
    char err[256];
    if (!w || !back)
        abort();
    err[0] = '\0';
    if (record_from_json(j, w, err, sizeof err) < 0) {
        if (!err[0])
            abort();
        workload_free(w);
        workload_free(back);
        return;
    }
    /* What this run would save must read back the same at the next start. */
    json_t *saved = record_to_json(w);
    if (!saved)
        abort(); /* the record could not be saved */
    if (record_from_json(saved, back, err, sizeof err) < 0)
        abort();
    json_t *saved2 = record_to_json(back);
    if (!saved2 || !json_equal(saved, saved2) || !spec_equal(&w->spec, &back->spec))
        abort();
    json_decref(saved);
    json_decref(saved2);
    workload_free(w);
    workload_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Both readers refuse a repeated key (json_body.c, state.c). */
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (j) {
        check_spec(j);
        check_record(j);
        json_decref(j);
    }
    return 0;
}
