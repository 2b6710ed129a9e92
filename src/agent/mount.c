/* mount.c: where volume sources are mounted on the host, the mount command
 * for a volume (its source, host directory and size quota put into the
 * mount_command template), and the check that a mount really happened. The
 * check reads mountinfo rather than comparing st_dev of the target and its
 * parent, because a bind mount from the same filesystem has the same st_dev
 * as its parent and would look unmounted. */
#include "agent.h"
#include "gpurent/secrets.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mount_host_dir(const char *mount_root, const char *source, char *out, size_t outlen)
{
    char hex[65];
    sha256_hex(source, strlen(source), hex);
    int n = snprintf(out, outlen, "%s/v-%.16s", mount_root, hex);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

void mount_unescape(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* Strips trailing slashes so "/a/b/" and "/a/b" compare equal. */
static void trim_slashes(char *s)
{
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/')
        s[--n] = '\0';
}

int mount_is_mount_point(const char *mountinfo_file, const char *path)
{
    char want[PATH_MAX], real[PATH_MAX];
    snprintf(want, sizeof want, "%s", path);
    trim_slashes(want);
    if (!realpath(path, real))
        snprintf(real, sizeof real, "%s", want);
    FILE *f = fopen(mountinfo_file, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    /* Format (proc(5)): ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... */
    while (!found && getline(&line, &cap, f) > 0) {
        char *save = NULL, *field = strtok_r(line, " \n", &save);
        for (int i = 0; field && i < 4; i++)
            field = strtok_r(NULL, " \n", &save);
        if (!field)
            continue;
        mount_unescape(field);
        trim_slashes(field);
        found = strcmp(field, want) == 0 || strcmp(field, real) == 0;
    }
    free(line);
    fclose(f);
    return found;
}

int mount_argv(struct argv_buf *a, const char *tmpl, const struct spec_volume *v, const char *host_dir, char *msg,
               size_t msglen)
{
    char size[24];
    const char *sizep = NULL;
    if (v->size_gb > 0) {
        snprintf(size, sizeof size, "%lld", (long long)v->size_gb);
        sizep = size;
    } else if (argv_template_uses_size(tmpl)) {
        /* Mounting without the quota would hand the workload storage the
         * site meant to bound; the fix is on the control plane's side. */
        snprintf(msg, msglen,
                 "mount %s: mount_command uses {size_gb} but the workload spec gives this volume no size_gb "
                 "(a control plane that predates it?)",
                 v->source);
        return -1;
    }
    if (argv_from_template_sized(a, tmpl, v->source, host_dir, sizep) < 0) {
        snprintf(msg, msglen, "mount %s: bad mount_command template", v->source);
        return -1;
    }
    return 0;
}
