/* test_ids.c: unit tests for random ids and hex (ids.c): the format of new
 * ids, that they pass id_valid for their own kind only, that many of them
 * never repeat and use the whole alphabet, that ordered ids carry the time
 * they were made and sort by it, that a forked child and its parent, or two
 * threads, never make the same ids from the pooled random bytes, id_valid's
 * edges, and hex_encode against known answers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpurent/ids.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";

static void test_new_format(void **state)
{
    (void)state;
    static const char *prefixes[] = {"usr", "key", "ins", "nod", "k", "", "abcdefghij"};
    for (size_t i = 0; i < ARRAY_LEN(prefixes); i++) {
        char id[ID_MAX];
        memset(id, 'X', sizeof id);
        assert_int_equal(id_new(prefixes[i], id), 0);
        size_t plen = strlen(prefixes[i]);
        assert_int_equal(strlen(id), plen + 1 + ID_RANDOM_CHARS);
        assert_memory_equal(id, prefixes[i], plen);
        assert_int_equal(id[plen], '_');
        for (size_t k = plen + 1; id[k]; k++)
            if (!strchr(alphabet, id[k]))
                fail_msg("'%s': '%c' is not in the alphabet", id, id[k]);
        assert_true(id_valid(prefixes[i], id));
    }
}

static void test_new_prefix_too_long(void **state)
{
    (void)state;
    char id[ID_MAX];
    /* 10 bytes is the longest prefix that fits with '_', 20 chars and NUL. */
    assert_int_equal(ID_MAX, 32);
    assert_int_equal(id_new("abcdefghij", id), 0);
    strcpy(id, "untouched");
    assert_int_equal(id_new("abcdefghijk", id), -1);
    assert_string_equal(id, "untouched");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* No two of the n ids are alike, and every character of the alphabet is in
 * use, about evenly, in each position of the random part from first on
 * (ids of kind "ins"). Sorts ids. */
static void assert_unique_and_spread(char (*ids)[ID_MAX], size_t n, size_t first)
{
    unsigned seen[ID_RANDOM_CHARS][32];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < n; i++)
        for (size_t k = first; k < ID_RANDOM_CHARS; k++)
            seen[k][strchr(alphabet, ids[i][4 + k]) - alphabet]++;
    qsort(ids, n, ID_MAX, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(ids[i - 1], ids[i]) == 0)
            fail_msg("id repeated: %s", ids[i]);
    /* Uniform would be n/32 per character per position; a low-bit bias or
     * a stuck character shows far outside these bounds (for n = 20000). */
    for (size_t k = first; k < ID_RANDOM_CHARS; k++)
        for (size_t c = 0; c < 32; c++)
            if (seen[k][c] < n * 450 / 20000 || seen[k][c] > n * 800 / 20000)
                fail_msg("position %zu char '%c' seen %u times of %zu", k, alphabet[c], seen[k][c], n);
}

/* 20000 ids: no repeats, every character in use in every position. */
static void test_new_unique_and_spread(void **state)
{
    (void)state;
    enum { N = 20000 };
    char (*ids)[ID_MAX] = calloc(N, ID_MAX);
    assert_non_null(ids);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(id_new("ins", ids[i]), 0);
    assert_unique_and_spread(ids, N, 0);
    free(ids);
}

static uint64_t wall_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
}

/* The time an ordered id carries, decoded from its first characters. */
static uint64_t ordered_ms(const char *random_part)
{
    uint64_t ms = 0;
    for (size_t k = 0; k < ID_TIME_CHARS; k++)
        ms = ms << 5 | (uint64_t)(strchr(alphabet, random_part[k]) - alphabet);
    return ms;
}

/* Ordered ids: valid ids of their kind; they carry the wall clock's
 * milliseconds of when they were made, so that their text sorts as their
 * times do; and the rest is random: no repeats among 20000 made within a
 * few milliseconds, and every character in use in every random position. */
static void test_new_ordered(void **state)
{
    (void)state;
    enum { N = 20000 };
    char (*ids)[ID_MAX] = calloc(N, ID_MAX);
    assert_non_null(ids);
    uint64_t before = wall_ms();
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(id_new_ordered("ins", ids[i]), 0);
        assert_true(id_valid("ins", ids[i]));
        assert_false(id_valid("wl", ids[i]));
    }
    uint64_t after = wall_ms();
    uint64_t last = 0;
    for (size_t i = 0; i < N; i++) {
        uint64_t ms = ordered_ms(ids[i] + 4);
        if (ms < before || ms > after)
            fail_msg("%s carries %llu ms, made between %llu and %llu", ids[i], (unsigned long long)ms,
                     (unsigned long long)before, (unsigned long long)after);
        /* Made in this order: a later millisecond never sorts first. */
        assert_true(ms >= last);
        if (i > 0 && ms > last)
            assert_true(strcmp(ids[i - 1], ids[i]) < 0);
        last = ms;
    }
    assert_unique_and_spread(ids, N, ID_TIME_CHARS);
    /* A prefix that leaves no room is refused, as id_new does. */
    char id[ID_MAX] = "untouched";
    assert_int_equal(id_new_ordered("abcdefghijk", id), -1);
    assert_string_equal(id, "untouched");
    free(ids);
}

static void test_valid_edges(void **state)
{
    (void)state;
    static const struct { const char *prefix, *s; int valid; } cases[] = {
        {"usr", "usr_0123456789abcdefghjk", 1},
        {"usr", "usr_mnpqrstvwxyz00000000", 1},
        {"usr", "usr_zzzzzzzzzzzzzzzzzzzz", 1},
        {"", "_0123456789abcdefghjk", 1},
        /* length */
        {"usr", "usr_0123456789abcdefghj", 0},
        {"usr", "usr_0123456789abcdefghjkm", 0},
        {"usr", "usr_", 0},
        {"usr", "usr", 0},
        {"usr", "", 0},
        {"", "", 0},
        {"", "_", 0},
        /* the wrong kind, or a prefix of one */
        {"key", "usr_0123456789abcdefghjk", 0},
        {"us", "usr_0123456789abcdefghjk", 0},
        {"usrx", "usr_0123456789abcdefghjk", 0},
        {"", "usr_0123456789abcdefghjk", 0},
        {"usr", "_0123456789abcdefghjk", 0},
        {"usr", "USR_0123456789abcdefghjk", 0},
        {"usr", "usr-0123456789abcdefghjk", 0},
        {"usr", "usr__123456789abcdefghjk", 0},
        {"usr", "usrX0123456789abcdefghjk", 0},
        /* characters outside the alphabet: i l o u, uppercase, others */
        {"usr", "usr_i123456789abcdefghjk", 0},
        {"usr", "usr_0l23456789abcdefghjk", 0},
        {"usr", "usr_01o3456789abcdefghjk", 0},
        {"usr", "usr_012u456789abcdefghjk", 0},
        {"usr", "usr_0123456789ABCDEFGHJK", 0},
        {"usr", "usr_0123456789abcdefghj ", 0},
        {"usr", "usr_0123456789abcdefghj_", 0},
        {"usr", "usr_0123456789abcdefghj-", 0},
        {"usr", "usr_0123456789abcdefghj\n", 0},
        {"usr", "usr_0123456789abcdefgh\xc3\xa9", 0},
        {"usr", " usr_0123456789abcdefghjk", 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++)
        if (id_valid(cases[i].prefix, cases[i].s) != cases[i].valid)
            fail_msg("id_valid(\"%s\", \"%s\") != %d", cases[i].prefix, cases[i].s, cases[i].valid);
}

static void test_random_bytes(void **state)
{
    (void)state;
    unsigned char a[64], b[64], zero[64];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    memset(zero, 0, sizeof zero);
    assert_int_equal(random_bytes(a, sizeof a), 0);
    assert_int_equal(random_bytes(b, sizeof b), 0);
    assert_memory_not_equal(a, b, sizeof a);
    assert_memory_not_equal(a, zero, sizeof a);
    assert_int_equal(random_bytes(a, 0), 0);
}

static void test_hex_encode(void **state)
{
    (void)state;
    static const struct { const char *bytes; size_t n; const char *hex; } cases[] = {
        {"", 0, ""},
        {"\x00", 1, "00"},
        {"\xff", 1, "ff"},
        {"\x0f\xf0", 2, "0ff0"},
        {"\x01\x23\x45\x67\x89\xab\xcd\xef", 8, "0123456789abcdef"},
        {"abc", 3, "616263"},
        {"\x00\x00\x80", 3, "000080"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[64];
        memset(out, 'X', sizeof out);
        hex_encode(cases[i].bytes, cases[i].n, out);
        assert_string_equal(out, cases[i].hex);
        /* Exactly 2n+1 bytes are written. */
        assert_int_equal(out[2 * cases[i].n + 1], 'X');
    }
    unsigned char all[256];
    char hex[513];
    for (size_t i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    hex_encode(all, sizeof all, hex);
    for (size_t i = 0; i < 256; i++) {
        char want[3];
        snprintf(want, sizeof want, "%02x", (unsigned)i);
        assert_memory_equal(hex + 2 * i, want, 2);
    }
    assert_int_equal(hex[512], '\0');
}

/* Ids draw their random bytes from a pool per thread: a forked child
 * starts with a copy of its parent's pool, and must not hand out the ids
 * its parent goes on to make from it. */
static void test_forked_child_makes_other_ids_than_its_parent(void **state)
{
    (void)state;
    enum { N = 8 };
    char first[ID_MAX], parent[N][ID_MAX], child[N][ID_MAX];
    assert_int_equal(id_new("ins", first), 0); /* the pool is filled */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < N; i++)
            if (id_new("ins", child[i]) < 0)
                _exit(2);
        _exit(write(fds[1], child, sizeof child) == (ssize_t)sizeof child ? 0 : 3);
    }
    close(fds[1]);
    for (int i = 0; i < N; i++)
        assert_int_equal(id_new("ins", parent[i]), 0);
    assert_int_equal(read(fds[0], child, sizeof child), (ssize_t)sizeof child);
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++)
            if (strcmp(parent[i], child[k]) == 0)
                fail_msg("parent and child both made %s", parent[i]);
}

enum { PER_THREAD = 200 };
static void *make_ids(void *out)
{
    char(*ids)[ID_MAX] = out;
    for (int i = 0; i < PER_THREAD; i++)
        if (id_new("req", ids[i]) < 0)
            return out;
    return NULL;
}

static void test_threads_make_other_ids(void **state)
{
    (void)state;
    static char ids[4][PER_THREAD][ID_MAX];
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, make_ids, ids[i]), 0);
    for (int i = 0; i < 4; i++) {
        void *failed = NULL;
        assert_int_equal(pthread_join(t[i], &failed), 0);
        assert_null(failed);
    }
    char(*all)[ID_MAX] = &ids[0][0];
    qsort(all, 4 * PER_THREAD, ID_MAX, (int (*)(const void *, const void *))strcmp);
    for (int i = 1; i < 4 * PER_THREAD; i++)
        if (strcmp(all[i - 1], all[i]) == 0)
            fail_msg("%s made twice", all[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_format),
        cmocka_unit_test(test_new_prefix_too_long),
        cmocka_unit_test(test_new_unique_and_spread),
        cmocka_unit_test(test_new_ordered),
        cmocka_unit_test(test_forked_child_makes_other_ids_than_its_parent),
        cmocka_unit_test(test_threads_make_other_ids),
        cmocka_unit_test(test_valid_edges),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_hex_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
