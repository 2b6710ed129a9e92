/* fuzz_journal.c: fuzz target for the gateway's usage journal read back at
 * start (gw_journal_open), the file a crash or a disk may have left torn
 * or corrupt. What a start recovers is usage records, each an object with
 * an id no other has; a second start right after it (the first one's
 * compaction in place) recovers exactly the same, so a crash after a start
 * loses and invents nothing; and a last line cut short by a crash changes
 * nothing of what the lines before it give. */
#include "gateway.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], path[96], lock_path[96];

static void remove_dir(void)
{
    unlink(path);
    unlink(lock_path);
    rmdir(dir);
}

static void setup(void)
{
    if (dir[0])
        return;
    /* tmpfs where there is one: the journal fsyncs at every start. */
    snprintf(dir, sizeof dir, "%s", access("/dev/shm", W_OK) == 0 ? "/dev/shm/fuzz-journal-XXXXXX"
                                                                   : "/tmp/fuzz-journal-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    snprintf(path, sizeof path, "%s/usage.journal", dir);
    snprintf(lock_path, sizeof lock_path, "%s/gateway.lock", dir);
    atexit(remove_dir);
}

static void write_file(const void *p, size_t n, const char *more)
{
    int f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (f < 0 || (n && write(f, p, n) != (ssize_t)n) ||
        (more && write(f, more, strlen(more)) != (ssize_t)strlen(more)))
        abort();
    close(f);
}

/* What a start recovers from the file as it is now. */
static json_t *start(void)
{
    json_t *recovered = json_array();
    if (gw_journal_open(dir, recovered) != 0)
        abort(); /* a readable file is never refused: bad lines are skipped */
    gw_journal_close();
    return recovered;
}

static void check_records(const json_t *recovered)
{
    json_t *ids = json_object();
    size_t i;
    json_t *r;
    json_array_foreach(recovered, i, r)
    {
        const char *id = json_string_value(json_object_get(r, "id"));
        if (!json_is_object(r) || !id || json_object_get(ids, id))
            abort(); /* not a record, or one recovered twice */
        json_object_set_new(ids, id, json_true());
    }
    json_decref(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    write_file(data, size, NULL);
    json_t *first = start();
    check_records(first);
    json_t *second = start();
    if (!json_equal(first, second))
        abort(); /* the first start's compaction changed what is owed */
    json_decref(second);

    /* A record torn by a crash after the file's last whole line. */
    if (size == 0 || data[size - 1] == '\n') {
        write_file(data, size, "{\"id\":\"torn-by-a-crash\",\"app_id\":\"a");
        json_t *torn = start();
        if (!json_equal(first, torn))
            abort();
        json_decref(torn);
    }
    json_decref(first);
    return 0;
}
