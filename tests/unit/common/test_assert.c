/* test_assert.c: ASSERT() aborts with one log line naming the file, line,
 * function and condition, and lets a true condition pass untouched. */
#include "gpurent/assert.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static int broken_invariant(int legs)
{
    ASSERT(legs >= 2);
    return legs;
}

static void test_true_condition_passes(void **state)
{
    (void)state;
    assert_int_equal(broken_invariant(3), 3);
}

static void test_false_condition_logs_and_aborts(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        broken_invariant(1);
        _exit(0); /* not reached */
    }
    close(fds[1]);
    char out[1024] = "";
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(out, "<3>"));
    assert_non_null(strstr(out, "assertion failed: legs >= 2 (tests/unit/common/test_assert.c:18, in broken_invariant)"));
}

static void test_locks_held_counts_what_this_thread_holds(void **state)
{
    (void)state;
    assert_int_equal(locks_held(), 0);
    lock_note_acquired();
    lock_note_acquired();
    assert_int_equal(locks_held(), 2);
    lock_note_released();
    lock_note_released();
    assert_int_equal(locks_held(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_true_condition_passes),
        cmocka_unit_test(test_false_condition_logs_and_aborts),
        cmocka_unit_test(test_locks_held_counts_what_this_thread_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
