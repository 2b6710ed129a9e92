/* discovery.c: GPU discovery as the agent calls it: picks the commands and
 * the parser for the configured tool, runs the commands through exec.c
 * under one deadline and one cap on their output together, parses what
 * they printed, and fills in the ROCm version from $ROCM_PATH/.info/version
 * when the tools did not print it. */
#include "discovery/private.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec.h"
#include "gpurent/clock.h"
#include "gpurent/log.h"

/* ---- the ROCm version file ------------------------------------------------- */

int discovery_parse_rocm_version(const char *text, size_t len, char *out, size_t cap)
{
    struct span v = {text, 0};
    size_t n = 0;

    if (cap > 0)
        out[0] = '\0';
    if (text == NULL || cap == 0)
        return -1;
    /* "6.0.2-115": the release, then the build number, which amd-smi leaves
     * out of its rocm_version, so it is left out here too. */
    while (v.n < len && isspace((unsigned char)text[v.n]) && text[v.n] != '\n')
        v.n++;
    v.p += v.n;
    v.n = 0;
    while (v.p + v.n < text + len && ((v.p[v.n] >= '0' && v.p[v.n] <= '9') || v.p[v.n] == '.'))
        v.n++;
    for (size_t i = 0; i < v.n; i++)
        n += v.p[i] >= '0' && v.p[i] <= '9';
    if (n == 0 || v.p[0] == '.' || v.n >= cap)
        return -1;
    text_copy(out, cap, v.p, v.n);
    return 0;
}

/* The ROCm version from $ROCM_PATH/.info/version (ROCm's install prefix,
 * /opt/rocm by default), for tools that do not print it. Best effort: ""
 * stays when the file is missing or odd. */
static void read_rocm_version(struct gpu_facts *f)
{
    const char *root = getenv("ROCM_PATH");
    char path[PATH_MAX], buf[256];
    struct stat st;
    ssize_t got;
    int fd;

    if (root == NULL || root[0] != '/')
        root = "/opt/rocm";
    if (snprintf(path, sizeof path, "%s/.info/version", root) >= (int)sizeof path)
        return;
    /* O_NONBLOCK: a FIFO planted there must not hang discovery. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        do
            got = read(fd, buf, sizeof buf);
        while (got < 0 && errno == EINTR);
        if (got > 0 && discovery_parse_rocm_version(buf, (size_t)got, f->stack_version, sizeof f->stack_version) != 0)
            log_warn("discovery: %s does not start with a version; no ROCm version reported", path);
    }
    close(fd);
}

/* ---- running the tools --------------------------------------------------- */

/* Where ROCm installs amd-smi and rocm-smi without putting them in PATH. */
#define ROCM_BIN "/opt/rocm/bin"

typedef int (*parser_fn)(const char *, size_t, struct gpu_facts *, char *, size_t);

/* Runs argv through exec.c until deadline_ms, appending its stdout to out.
 * 0 when it exited with status 0; otherwise -1 with err saying why, and
 * what it printed taken back out of out, since a failed command's output
 * is not parsed. */
static int run_one(char *const argv[], int64_t deadline_ms, struct exec_capture *out, char *err, size_t errlen)
{
    struct exec_opts o = {.deadline_ms = deadline_ms, .also_path = ROCM_BIN, .out = out};
    struct exec_result r;
    char prog[64], line[512], said[128];
    size_t start = out->len;

    if (exec_run(argv, &o, &r) == 0)
        return 0;
    text_copy_str(prog, sizeof prog, argv[0]);
    /* What the tool said last, on stderr or else on stdout (nvidia-smi
     * prints its failures there), kept to printable ASCII for the facts. */
    if (r.output[0] != '\0')
        exec_last_line(r.output, strlen(r.output), line, sizeof line);
    else
        exec_last_line(out->buf + start, out->len - start, line, sizeof line);
    text_copy_str(said, sizeof said, line);
    out->len = start;
    if (!r.started) {
        text_copy_str(line, sizeof line, r.output);
        text_err(err, errlen, "%s", line);
    } else if (r.timed_out) {
        text_err(err, errlen, "%s: no answer in time, killed", prog);
    } else if (r.overflowed) {
        text_err(err, errlen, "%s: more than %u bytes of output, killed", prog, DISCOVERY_MAX_OUTPUT);
    } else if (r.exited) {
        text_err(err, errlen, "%s exited with status %d%s%s", prog, r.status, said[0] ? ": " : "", said);
    } else {
        text_err(err, errlen, "%s killed by signal %d", prog, r.signal);
    }
    return -1;
}

/* The commands discovery_run uses when the caller gives none; words are
 * split on spaces into a private buffer so no string literal is ever passed
 * as a mutable argv. */
struct default_cmd {
    const char *words; /* argv, separated by single spaces */
    int optional;      /* failure is logged and discovery goes on */
};

static const struct default_cmd amd_cmds[] = {
    {"amd-smi version --json",                                           1},
    {"amd-smi static --asic --bus --vram --driver --board --ras --json", 0},
    {"amd-smi metric --ecc --json",                                      1},
    {NULL,                                                               0},
};
static const struct default_cmd rocm_cmds[] = {
    {"rocm-smi --showproductname --showmeminfo vram --showdriverversion --showserial --showbus --json", 0},
    {NULL,                                                                                              0},
};
/* No --query-gpu field gives the CUDA version; -q's header does. */
static const struct default_cmd nvidia_cmds[] = {
    {"nvidia-smi --query-gpu=" DISCOVERY_NVIDIA_SMI_FIELDS " --format=csv,noheader,nounits", 0},
    {"nvidia-smi -q -d COMPUTE",                                                             1},
    {NULL,                                                                                   0},
};

#define MAX_ARGS 16

static void split_words(const char *words, char *store, size_t cap, char *av[MAX_ARGS])
{
    size_t n = 0;
    char *save = NULL;

    snprintf(store, cap, "%s", words);
    for (char *w = strtok_r(store, " ", &save); w && n + 1 < MAX_ARGS; w = strtok_r(NULL, " ", &save))
        av[n++] = w;
    av[n] = NULL;
}

int discovery_run(const char *tool, char *const argv[], int timeout_s, struct gpu_facts *out, char *err, size_t errlen)
{
    const struct default_cmd *cmds;
    struct exec_capture cap = {.cap = DISCOVERY_MAX_OUTPUT};
    int64_t deadline_ms;
    parser_fn parse;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (tool == NULL) {
        text_err(err, errlen, "discovery: no tool named");
        return -1;
    }
    if (strcmp(tool, "amd-smi") == 0) {
        parse = discovery_parse_amd_smi;
        cmds = amd_cmds;
    } else if (strcmp(tool, "rocm-smi") == 0) {
        parse = discovery_parse_rocm_smi;
        cmds = rocm_cmds;
    } else if (strcmp(tool, "nvidia-smi") == 0) {
        parse = discovery_parse_nvidia_smi_csv;
        cmds = nvidia_cmds;
    } else {
        char shown[32];

        text_copy_str(shown, sizeof shown, tool);
        text_err(err, errlen, "discovery: unknown tool \"%s\"", shown);
        return -1;
    }
    if (timeout_s <= 0 || timeout_s > 3600) {
        text_err(err, errlen, "discovery: timeout must be 1 to 3600 seconds");
        return -1;
    }
    if (argv != NULL && (argv[0] == NULL || argv[0][0] == '\0')) {
        text_err(err, errlen, "discovery: empty command");
        return -1;
    }
    /* One buffer for every command's stdout, so the cap is on them all. */
    if ((cap.buf = malloc(cap.cap)) == NULL) {
        text_err(err, errlen, "discovery: out of memory");
        return -1;
    }
    deadline_ms = clock_mono_ms() + (int64_t)timeout_s * 1000;

    if (argv != NULL) {
        if (run_one(argv, deadline_ms, &cap, err, errlen) != 0)
            goto done;
    } else {
        for (const struct default_cmd *c = cmds; c->words != NULL; c++) {
            char store[512], *av[MAX_ARGS];
            char why[256];

            split_words(c->words, store, sizeof store, av);
            if (run_one(av, deadline_ms, &cap, why, sizeof why) == 0)
                continue;
            if (!c->optional) {
                text_err(err, errlen, "%s", why);
                goto done;
            }
            log_warn("discovery: skipping `%s`: %s", c->words, why);
        }
    }
    rc = parse(cap.buf, cap.len, out, err, errlen);
    /* rocm-smi never prints the ROCm version, and amd-smi's version command
     * is optional. */
    if (rc == 0 && strcmp(out->stack, "ROCm") == 0 && out->stack_version[0] == '\0')
        read_rocm_version(out);
done:
    free(cap.buf);
    return rc;
}
