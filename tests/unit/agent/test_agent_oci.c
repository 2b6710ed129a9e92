/* test_agent_oci.c: unit tests for the commands the real runtime runs:
 * the exact podman and docker command lines for ROCm and CUDA workloads,
 * pull, inspect (status, exit code and finish time), stop and rm; mount
 * command templates, with a volume's {size_gb}; the mount-point check on a
 * recorded mountinfo; inspect output and finish-time parsing; and the
 * process runner exec.c (exit status, output tail, timeout, cancel, no
 * shell, stdout kept apart and capped, a directory after PATH, default
 * signals in the child). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "gpurent/clock.h"

#define MOUNTINFO "tests/data/agent/mountinfo.txt"

static struct wl_spec spec_of(const char *text)
{
    struct wl_spec s;
    char field[64], err[256];
    json_t *j = json_loads(text, 0, NULL);
    assert_non_null(j);
    assert_int_equal(spec_parse(j, &s, field, sizeof field, err, sizeof err), 0);
    json_decref(j);
    return s;
}

static void assert_line(const struct argv_buf *a, const char *want)
{
    char line[4096];
    assert_int_equal(a->overflow, 0);
    assert_null(a->v[a->n]);
    argv_join(a, line, sizeof line);
    assert_string_equal(line, want);
}

static const char *const SPEC_ROCM =
    "{\"image\": \"rocm/pytorch:2.3-rocm6.2\", \"gpus\": [2, 3], \"stack\": \"ROCm\","
    " \"volumes\": [{\"source\": \"nfs.example:/export/vol_x\", \"target\": \"/shared\"}],"
    " \"env\": {\"MASTER_PORT\": \"29500\", \"GPURENT_NODE_RANK\": \"0\"}}";
static const char *const SPEC_CUDA =
    "{\"image\": \"nvcr.io/nvidia/pytorch:24.05-py3\", \"gpus\": [0, 5], \"stack\": \"CUDA\","
    " \"volumes\": [{\"source\": \"nfs.example:/export/vol_y\", \"target\": \"/shared\"}],"
    " \"env\": {\"A\": \"x y\"}}";

/* The render nodes of cards 2 and 3 (fabric_render_nodes), and no groups. */
static char ROCM_NODES[][FABRIC_RENDER_NODE_MAX] = {"/dev/dri/renderD130", "/dev/dri/renderD131"};
static const struct oci_host ROCM_HOST = {.video_gid = -1, .render_gid = -1, .render_nodes = ROCM_NODES};

static void test_run_podman_rocm(void **state)
{
    /* Its own cards' render nodes and no other: never /dev/dri whole. */
    struct wl_spec s = spec_of(SPEC_ROCM);
    struct oci_cmd c = {.exe = "podman", .docker = 0, .stop_timeout_s = 30, .host = &ROCM_HOST};
    char *dirs[] = {(char *)(uintptr_t)"/run/m/v-1", NULL};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_abc", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_abc --label gpurent.workload=wl_abc --pull never"
                    " --device /dev/kfd --device /dev/dri/renderD130 --device /dev/dri/renderD131 --shm-size 64g"
                    " --volume /run/m/v-1:/shared --env GPURENT_NODE_RANK=0 --env MASTER_PORT=29500"
                    " docker.io/rocm/pytorch:2.3-rocm6.2");
    argv_free(&a);
    argv_free(NULL);
    /* Without the render nodes a ROCm line is refused, not widened. */
    c.host = NULL;
    assert_int_equal(oci_argv_run(&c, "wl_abc", &s, dirs, &a), -1);
    argv_free(&a);
    spec_free(&s);
}

static void test_run_docker_rocm(void **state)
{
    struct wl_spec s = spec_of(SPEC_ROCM);
    struct oci_cmd c = {.exe = "/usr/bin/docker", .docker = 1, .stop_timeout_s = 30,
                        .run_args = "--ipc=host  --shm-size=16g", .host = &ROCM_HOST};
    char *dirs[] = {(char *)(uintptr_t)"/run/m/v-1", NULL};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_abc", &s, dirs, &a), 0);
    assert_line(&a, "/usr/bin/docker run --detach --name gpurent-wl_abc --label gpurent.workload=wl_abc --pull never"
                    " --device /dev/kfd --device /dev/dri/renderD130 --device /dev/dri/renderD131"
                    " --volume /run/m/v-1:/shared --env GPURENT_NODE_RANK=0 --env MASTER_PORT=29500"
                    " --ipc=host --shm-size=16g rocm/pytorch:2.3-rocm6.2");
    argv_free(&a);
    spec_free(&s);
}

static void test_run_podman_cuda(void **state)
{
    struct wl_spec s = spec_of(SPEC_CUDA);
    struct oci_cmd c = {.exe = "podman", .docker = 0, .stop_timeout_s = 30};
    char *dirs[] = {(char *)(uintptr_t)"/run/m/v-2", NULL};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_n", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_n --label gpurent.workload=wl_n --pull never"
                    " --device nvidia.com/gpu=0 --device nvidia.com/gpu=5 --env NVIDIA_VISIBLE_DEVICES=void --shm-size 64g"
                    " --volume /run/m/v-2:/shared --env A=x y nvcr.io/nvidia/pytorch:24.05-py3");
    /* "A=x y" is one word, not two. */
    int found = 0;
    for (int i = 0; i < a.n; i++)
        found |= strcmp(a.v[i], "A=x y") == 0;
    assert_true(found);
    argv_free(&a);
    spec_free(&s);
}

static void test_run_docker_cuda(void **state)
{
    struct wl_spec s = spec_of(SPEC_CUDA);
    struct oci_cmd c = {.exe = "docker", .docker = 1, .stop_timeout_s = 30};
    char *dirs[] = {(char *)(uintptr_t)"/run/m/v-2", NULL};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_n", &s, dirs, &a), 0);
    assert_line(&a, "docker run --detach --name gpurent-wl_n --label gpurent.workload=wl_n --pull never"
                    " --gpus \"device=0,5\" --shm-size 64g --volume /run/m/v-2:/shared --env A=x y nvcr.io/nvidia/pytorch:24.05-py3");
    /* The quotes are part of the word: docker's --gpus would split 0,5 otherwise. */
    int found = 0;
    for (int i = 0; i < a.n; i++)
        found |= strcmp(a.v[i], "\"device=0,5\"") == 0;
    assert_true(found);
    argv_free(&a);
    spec_free(&s);
    /* Without cards, nothing sets NVIDIA_VISIBLE_DEVICES for the nvidia
     * runtime but the image ("all"): void takes every card away. */
    s = spec_of("{\"image\": \"nvcr.io/nvidia/pytorch:24.05-py3\", \"stack\": \"CUDA\"}");
    assert_int_equal(oci_argv_run(&c, "wl_0", &s, dirs, &a), 0);
    assert_line(&a, "docker run --detach --name gpurent-wl_0 --label gpurent.workload=wl_0 --pull never"
                    " --env NVIDIA_VISIBLE_DEVICES=void nvcr.io/nvidia/pytorch:24.05-py3");
    argv_free(&a);
    spec_free(&s);
}

static void test_run_without_gpus(void **state)
{
    struct wl_spec s = spec_of("{\"image\": \"busybox\", \"stack\": \"ROCm\"}");
    struct oci_cmd c = {.exe = "podman", .stop_timeout_s = 30};
    char *dirs[] = {NULL};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_0", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_0 --label gpurent.workload=wl_0 --pull never docker.io/library/busybox");
    argv_free(&a);
    spec_free(&s);
}

static void test_run_published_ports(void **state)
{
    /* Each published port is one -p HOST:CONTAINER/tcp, in the spec's
     * order, after the environment and before run_args, for both runtimes. */
    struct wl_spec s = spec_of("{\"image\": \"busybox\", \"stack\": \"ROCm\", \"ports\": [{\"container\": 8888,"
                               " \"host\": 30007}, {\"container\": 6006, \"host\": 30000}]}");
    char *dirs[] = {NULL};
    struct argv_buf a = {0};
    struct oci_cmd podman = {.exe = "podman", .stop_timeout_s = 30, .run_args = "--ipc=host"};
    assert_int_equal(oci_argv_run(&podman, "wl_p", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_p --label gpurent.workload=wl_p --pull never"
                    " -p 30007:8888/tcp -p 30000:6006/tcp --ipc=host docker.io/library/busybox");
    argv_free(&a);
    struct oci_cmd docker = {.exe = "docker", .docker = 1, .stop_timeout_s = 30};
    assert_int_equal(oci_argv_run(&docker, "wl_p", &s, dirs, &a), 0);
    assert_line(&a, "docker run --detach --name gpurent-wl_p --label gpurent.workload=wl_p --pull never"
                    " -p 30007:8888/tcp -p 30000:6006/tcp busybox");
    argv_free(&a);
    spec_free(&s);
}

/* A two-rank cluster (this node rank 1), the second rank known by name. */
static const char *const SPEC_CLUSTER_TAIL =
    " \"cluster\": {\"rank\": 1, \"hosts\": ["
    "{\"name\": \"rank0\", \"address\": \"10.0.0.5\", \"ssh_port\": 2222, \"user\": \"ins_x-0\", \"slots\": 8,"
    " \"host_key\": \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G\"},"
    "{\"name\": \"rank1\", \"address\": \"fd00::6\", \"ssh_port\": 2222, \"user\": \"ins_x-1\", \"slots\": 8,"
    " \"host_key\": \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G\"},"
    "{\"name\": \"rank2\", \"address\": \"gpu-9.example\", \"ssh_port\": 2222, \"user\": \"ins_x-2\", \"slots\": 8,"
    " \"host_key\": \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G\"}],"
    " \"identity\": \"-----BEGIN OPENSSH PRIVATE KEY-----\\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\\n"
    "QyNTUxOQAAACA4h3lXiLw9DmQgpu4Qnu/0QiskU+ZNKsS0QALhK6C/RgAAAIjQ7WeU0O1n\\n"
    "lAAAAAtzc2gtZWQyNTUxOQAAACA4h3lXiLw9DmQgpu4Qnu/0QiskU+ZNKsS0QALhK6C/Rg\\n"
    "AAAEDaF9tTOV7RmcsDDZ3s3V87o3jkk4hu7t0NLicgZpXwNDiHeVeIvD0OZCCm7hCe7/RC\\n"
    "KyRT5k0qxLRAAuEroL9GAAAAAAECAwQF\\n"
    "-----END OPENSSH PRIVATE KEY-----\\n\"}}";

static struct wl_spec spec_with_cluster(const char *head)
{
    char text[4096];
    snprintf(text, sizeof text, "%s,%s", head, SPEC_CLUSTER_TAIL);
    return spec_of(text);
}

static void test_run_multi_node(void **state)
{
    /* ROCm, two RDMA devices, the host's video and render groups, a
     * published port dropped (host networking), --add-host for the ranks
     * with an IP, the cluster files mounted read-only; podman and docker
     * spell it all the same. */
    struct wl_spec s = spec_with_cluster("{\"image\": \"rocm/pytorch:2.3-rocm6.2\", \"gpus\": [0, 1], \"stack\": \"ROCm\","
                                         " \"ports\": [{\"container\": 8888, \"host\": 30007}],"
                                         " \"env\": {\"NODE_RANK\": \"1\"}");
    char *rdma[] = {(char *)(uintptr_t)"/dev/infiniband/rdma_cm", (char *)(uintptr_t)"/dev/infiniband/uverbs0"};
    char nodes[][FABRIC_RENDER_NODE_MAX] = {"/dev/dri/renderD128", "/dev/dri/renderD129"};
    struct oci_host host = {.rdma = rdma, .n_rdma = 2, .video_gid = 44, .render_gid = 109, .shm_size = "128g",
                            .cluster_dir = "/var/lib/gpurent-agent/cluster/wl_m", .render_nodes = nodes};
    const char *rest = " --device /dev/kfd --device /dev/dri/renderD128 --device /dev/dri/renderD129"
                       " --group-add 44 --group-add 109 --shm-size 128g --env NODE_RANK=1"
                       " --network host --device /dev/infiniband/rdma_cm --device /dev/infiniband/uverbs0"
                       " --cap-add IPC_LOCK --ulimit memlock=-1:-1"
                       " --add-host rank0:10.0.0.5 --add-host rank1:fd00::6"
                       " --volume /var/lib/gpurent-agent/cluster/wl_m/hostfile:/etc/gpurent/hostfile:ro,Z"
                       " --volume /var/lib/gpurent-agent/cluster/wl_m/hostfile.mpi:/etc/gpurent/hostfile.mpi:ro,Z"
                       " --volume /var/lib/gpurent-agent/cluster/wl_m/ssh:/root/.ssh:ro,Z";
    char want[4096];
    char *dirs[] = {NULL};
    for (int docker = 0; docker <= 1; docker++) {
        struct oci_cmd c = {.exe = docker ? "docker" : "podman", .docker = docker, .stop_timeout_s = 30, .host = &host};
        struct argv_buf a = {0};
        assert_int_equal(oci_argv_run(&c, "wl_m", &s, dirs, &a), 0);
        snprintf(want, sizeof want, "%s run --detach --name gpurent-wl_m --label gpurent.workload=wl_m --pull never%s %s",
                 c.exe, rest, docker ? "rocm/pytorch:2.3-rocm6.2" : "docker.io/rocm/pytorch:2.3-rocm6.2");
        assert_line(&a, want);
        argv_free(&a);
    }
    /* Without RDMA devices or a video group; one gid shared by both groups
     * is added once. */
    struct oci_host bare = {.video_gid = -1, .render_gid = 109, .render_nodes = nodes};
    struct oci_cmd c = {.exe = "podman", .stop_timeout_s = 30, .host = &bare};
    struct argv_buf a = {0};
    assert_int_equal(oci_argv_run(&c, "wl_m", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_m --label gpurent.workload=wl_m --pull never"
                    " --device /dev/kfd --device /dev/dri/renderD128 --device /dev/dri/renderD129 --group-add 109"
                    " --shm-size 64g --env NODE_RANK=1 --network host --cap-add IPC_LOCK --ulimit memlock=-1:-1"
                    " --add-host rank0:10.0.0.5 --add-host rank1:fd00::6 docker.io/rocm/pytorch:2.3-rocm6.2");
    argv_free(&a);
    struct oci_host same = {.video_gid = 44, .render_gid = 44, .render_nodes = nodes};
    c.host = &same;
    spec_free(&s);

    /* CUDA: no groups; a one-host cluster: files, none of the flags. */
    s = spec_of("{\"image\": \"busybox\", \"gpus\": [0], \"stack\": \"CUDA\","
                " \"ports\": [{\"container\": 8888, \"host\": 30007}]}");
    assert_int_equal(oci_argv_run(&c, "wl_s", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_s --label gpurent.workload=wl_s --pull never"
                    " --device nvidia.com/gpu=0 --env NVIDIA_VISIBLE_DEVICES=void --shm-size 64g -p 30007:8888/tcp"
                    " docker.io/library/busybox");
    argv_free(&a);
    spec_free(&s);
    s = spec_of("{\"image\": \"busybox\", \"gpus\": [0], \"stack\": \"ROCm\"}");
    assert_int_equal(oci_argv_run(&c, "wl_s", &s, dirs, &a), 0);
    assert_line(&a, "podman run --detach --name gpurent-wl_s --label gpurent.workload=wl_s --pull never"
                    " --device /dev/kfd --device /dev/dri/renderD128 --group-add 44 --shm-size 64g docker.io/library/busybox");
    argv_free(&a);
    spec_free(&s);
}

/* A KFD topology node: its properties file. */
static void topology_node(const char *dir, int node, long gpu_id, long minor)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, node);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/%d/properties", dir, node);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "cpu_cores_count 0\nsimd_count 304\ngpu_id %ld\n", gpu_id);
    if (minor >= 0)
        fprintf(f, "drm_render_minor %ld\n", minor);
    fclose(f);
}

static void test_render_nodes_from_the_kfd_topology(void **state)
{
    /* Node 0 a CPU; GPU nodes 1, 2 and 10 (numeric order, not the
     * directory's): ROCr's cards 0, 1 and 2. */
    char dir[] = "/tmp/gpurent-kfd-XXXXXX";
    assert_non_null(mkdtemp(dir));
    topology_node(dir, 0, 0, -1);
    topology_node(dir, 1, 4660, 128);
    topology_node(dir, 10, 9999, 136);
    topology_node(dir, 2, 5555, 129);
    char out[3][FABRIC_RENDER_NODE_MAX], why[256];
    int gpus[] = {2, 0};
    assert_int_equal(fabric_render_nodes(dir, gpus, 2, out, why, sizeof why), 0);
    assert_string_equal(out[0], "/dev/dri/renderD136");
    assert_string_equal(out[1], "/dev/dri/renderD128");
    int beyond[] = {3};
    assert_int_equal(fabric_render_nodes(dir, beyond, 1, out, why, sizeof why), -1);
    assert_non_null(strstr(why, "card 3 has no render node"));
    assert_int_equal(fabric_render_nodes("/nonexistent/kfd", gpus, 1, out, why, sizeof why), -1);
    assert_non_null(strstr(why, "cannot read the KFD topology"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_other_commands(void **state)
{
    struct oci_cmd c = {.exe = "podman", .stop_timeout_s = 45};
    struct argv_buf a = {0};
    /* podman is given the name docker would read a short one as (Docker
     * Hub's); a name with a registry host stays as it is, and docker keeps
     * its own reading. */
    static const char *const pulls[][2] = {
        {"rocm/pytorch:2.3", "docker.io/rocm/pytorch:2.3"},
        {"busybox", "docker.io/library/busybox"},
        {"busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
         "docker.io/library/busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
        {"nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3"},
        {"registry:5000/team/train:1", "registry:5000/team/train:1"},
        {"localhost/train:1", "localhost/train:1"},
        {"docker.io/library/busybox", "docker.io/library/busybox"},
    };
    char want[512];
    for (size_t i = 0; i < sizeof pulls / sizeof pulls[0]; i++) {
        assert_int_equal(oci_argv_pull(&c, pulls[i][0], &a), 0);
        snprintf(want, sizeof want, "podman pull %s", pulls[i][1]);
        assert_line(&a, want);
        argv_free(&a);
    }
    struct oci_cmd hub = {.exe = "docker", .docker = 1};
    assert_int_equal(oci_argv_pull(&hub, "rocm/pytorch:2.3", &a), 0);
    assert_line(&a, "docker pull rocm/pytorch:2.3");
    argv_free(&a);
    assert_int_equal(oci_argv_inspect(&c, "wl_1", &a), 0);
    assert_line(&a, "podman container inspect --format {{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}"
                    " gpurent-wl_1");
    assert_int_equal(a.n, 6); /* the format is one word */
    assert_string_equal(a.v[4], "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}");
    argv_free(&a);
    struct oci_cmd d = {.exe = "/usr/bin/docker", .docker = 1, .stop_timeout_s = 45};
    assert_int_equal(oci_argv_inspect(&d, "wl_1", &a), 0);
    assert_line(&a, "/usr/bin/docker container inspect --format {{.State.Status}} {{.State.ExitCode}}"
                    " {{.State.FinishedAt}} gpurent-wl_1");
    argv_free(&a);
    assert_int_equal(oci_argv_stop(&c, "wl_1", &a), 0);
    assert_line(&a, "podman stop -t 45 gpurent-wl_1");
    argv_free(&a);
    assert_int_equal(oci_argv_rm(&c, "wl_1", &a), 0);
    assert_line(&a, "podman rm --force gpurent-wl_1");
    argv_free(&a);
    assert_int_equal(oci_argv_logs(&c, "wl_1", 1714566896, &a), 0);
    assert_line(&a, "podman logs --timestamps --since 1714566896 gpurent-wl_1");
    argv_free(&a);
    assert_int_equal(oci_argv_logs(&d, "wl_1", 0, &a), 0);
    assert_line(&a, "/usr/bin/docker logs --timestamps --since 0 gpurent-wl_1");
    argv_free(&a);
    int64_t t;
    size_t at;
    const char *l = "2024-05-01T12:34:56.123456789Z epoch 1 loss 0.5";
    assert_int_equal(oci_parse_log_line(l, strlen(l), &t, &at), 0);
    assert_int_equal(t, 1714566896123LL);
    assert_string_equal(l + at, "epoch 1 loss 0.5");
    l = "2024-05-01T14:34:56+02:00 x";
    assert_int_equal(oci_parse_log_line(l, strlen(l), &t, &at), 0);
    assert_int_equal(t, 1714566896000LL);
    assert_int_equal(oci_parse_log_line("no time here", 12, &t, &at), -1);
    assert_int_equal(oci_parse_log_line("2024-05-01T12:34:56Z", 20, &t, &at), -1);
    char name[96];
    oci_container_name("wl_zz", name, sizeof name);
    assert_string_equal(name, "gpurent-wl_zz");
}

static void test_parse_state(void **state)
{
    struct rt_exit ex;
    assert_int_equal(oci_parse_state("running 0 0001-01-01 00:00:00 +0000 UTC\n", &ex), RT_RUNNING);
    assert_int_equal(oci_parse_state("running 0\n", &ex), RT_RUNNING);
    /* podman's spelling of the finish time, and docker's. */
    assert_int_equal(oci_parse_state("exited 137 2026-11-30 14:02:07.123456789 +0100 CET\n", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 1);
    assert_int_equal(ex.code, 137);
    assert_int_equal(ex.at, 1796043727); /* 13:02:07 UTC */
    assert_int_equal(oci_parse_state("exited 3 2026-11-30T13:02:07.999999999Z", &ex), RT_EXITED);
    assert_int_equal(ex.code, 3);
    assert_int_equal(ex.at, 1796043727);
    assert_int_equal(oci_parse_state("WARN[0000] something\nexited 3 2026-11-30T13:02:07Z\n", &ex), RT_EXITED);
    assert_int_equal(ex.code, 3);
    assert_int_equal(ex.at, 1796043727);
    /* Without a usable finish time: the code alone (the driver uses the
     * time it noticed). The zero time is a container that never finished. */
    assert_int_equal(oci_parse_state("exited 3\n", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 1);
    assert_int_equal(ex.code, 3);
    assert_int_equal(ex.at, 0);
    assert_int_equal(oci_parse_state("exited 0 0001-01-01T00:00:00Z", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 1);
    assert_int_equal(ex.at, 0);
    assert_int_equal(oci_parse_state("exited 1 yesterday", &ex), RT_EXITED);
    assert_int_equal(ex.code, 1);
    assert_int_equal(ex.at, 0);
    assert_int_equal(oci_parse_state("exited 1 1969-12-31T23:59:59Z", &ex), RT_EXITED);
    assert_int_equal(ex.at, 0);
    /* No code, or a container that never ran: no status to report. */
    assert_int_equal(oci_parse_state("exited", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 0);
    assert_int_equal(ex.at, 0);
    assert_int_equal(oci_parse_state("created 0 0001-01-01 00:00:00 +0000 UTC", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 0);
    assert_int_equal(oci_parse_state("stopped -1 2026-11-30T13:02:07+00:00", &ex), RT_EXITED);
    assert_int_equal(ex.has_code, 1);
    assert_int_equal(ex.code, -1);
    assert_int_equal(ex.at, 1796043727);
    assert_int_equal(oci_parse_state("", &ex), RT_UNKNOWN);
    assert_int_equal(oci_parse_state("banana 1", &ex), RT_UNKNOWN);
}

/* Finish times as the runtimes print them: RFC 3339 (docker) and Go's
 * default format (podman), fractions and offsets of both signs; anything
 * else refused rather than guessed. */
static void test_parse_time(void **state)
{
    static const struct {
        const char *text;
        int64_t want;
    } good[] = {
        {"1970-01-01T00:00:00Z", 0},
        {"2026-11-30T13:02:07Z", 1796043727},
        {"2026-11-30t13:02:07z", 1796043727},
        {"2026-11-30T13:02:07.5Z", 1796043727},
        {"2026-11-30T13:02:07.999999999Z", 1796043727},
        {"2026-11-30T14:02:07.123+01:00", 1796043727},
        {"2026-11-30T08:32:07-04:30", 1796043727},
        {"2026-11-30 13:02:07 +0000 UTC", 1796043727},
        {"2026-11-30 14:02:07.123456789 +0100 CET", 1796043727},
        {"2026-11-30 09:02:07.1 -0400 EDT", 1796043727},
        {"2026-11-30 16:02:07 +0300 +03", 1796043727},
        {"2026-12-01T00:02:07+11:00", 1796043727},   /* the next day in the east */
        {"2026-11-30 13:02:07.5 +0000 UTC m=+0.000000001", 1796043727},
        {"2028-02-29T00:00:00Z", 1835395200},        /* a leap day */
        {"2016-12-31T23:59:60Z", 1483228800},        /* a leap second: the next minute */
        {"  2026-11-30T13:02:07Z\n", 1796043727},
        {"0001-01-01 00:00:00 +0000 UTC", -62135596800},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t t = 42;
        if (oci_parse_time(good[i].text, &t) != 0 || t != good[i].want)
            fail_msg("'%s': got %lld, want %lld", good[i].text, (long long)t, (long long)good[i].want);
    }
    static const char *const bad[] = {
        "",
        "2026-11-30T13:02:07",           /* no zone */
        "2026-11-30 13:02:07",
        "2026-11-30T13:02:07.Z",          /* a point without digits */
        "2026-11-30T13:02:07+0100x",
        "2026-11-30T13:02:07Zulu",
        "2026-11-30T13:02Z",
        "2026-11-30",
        "2026-13-01T00:00:00Z",
        "2026-02-29T00:00:00Z",           /* not a leap year */
        "2026-04-31T00:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T13:60:00Z",
        "2026-11-30T13:02:61Z",
        "2026-11-30T13:02:07+24:00",
        "2026-11-30T13:02:07+01:60",
        "2026-11-30T13:02:07+1",
        "26-11-30T13:02:07Z",
        "2026/11/30T13:02:07Z",
        "2026-11-30X13:02:07Z",
        "1796043727",
        "<no value>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t t = 42;
        if (oci_parse_time(bad[i], &t) != -1)
            fail_msg("'%s' parsed as %lld", bad[i], (long long)t);
    }
}

static void test_templates(void **state)
{
    struct argv_buf a = {0};
    assert_int_equal(argv_from_template(&a, "mount -t nfs4 -o hard,noatime {source} {target}", "nfs:/x y",
                                        "/run/m/v-1"),
                     0);
    assert_int_equal(a.n, 7);
    assert_string_equal(a.v[5], "nfs:/x y"); /* a value is never split */
    assert_string_equal(a.v[6], "/run/m/v-1");
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "  helper --src={source}  --dst={target}/x ", "S", "T"), 0);
    assert_line(&a, "helper --src=S --dst=T/x");
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "umount {target}", NULL, "/t"), 0);
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "mount {source} {target}", NULL, "/t"), -1);
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "mount {src} {target}", "s", "/t"), -1);
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "   ", "s", "/t"), -1);
    argv_free(&a);

    char err[256];
    assert_int_equal(argv_template_check("mount --bind {source} {target}", 1, err, sizeof err), 0);
    assert_int_equal(argv_template_check("umount {target}", 0, err, sizeof err), 0);
    assert_int_equal(argv_template_check("mount {source}", 1, err, sizeof err), -1);
    assert_int_equal(argv_template_check("mount {target}", 1, err, sizeof err), -1);
    assert_int_equal(argv_template_check("umount {source} {target}", 0, err, sizeof err), -1);
    assert_int_equal(argv_template_check("{source} {target}", 1, err, sizeof err), -1);
    assert_int_equal(argv_template_check("mount {sourc} {target}", 1, err, sizeof err), -1);
}

/* {size_gb}: expanded inside a word for mount_command, refused by every
 * other template, and a clear refusal when a volume has no size. */
static void test_size_template(void **state)
{
    struct argv_buf a = {0};
    assert_int_equal(argv_from_template_sized(&a, "mount -t tmpfs -o size={size_gb}G,mode=0755 {source} {target}",
                                              "scratch", "/run/m/v-1", "50"),
                     0);
    assert_line(&a, "mount -t tmpfs -o size=50G,mode=0755 scratch /run/m/v-1");
    argv_free(&a);
    /* No value for a placeholder the template names: no command. */
    assert_int_equal(argv_from_template_sized(&a, "mount {source} {target} {size_gb}", "s", "/t", NULL), -1);
    argv_free(&a);
    assert_int_equal(argv_from_template(&a, "mount {source} {target} {size_gb}", "s", "/t"), -1);
    argv_free(&a);
    assert_int_equal(argv_from_template_sized(&a, "mount {source} {target} {size}", "s", "/t", "5"), -1);
    argv_free(&a);
    assert_true(argv_template_uses_size("mount -o size={size_gb}G {source} {target}"));
    assert_false(argv_template_uses_size("mount {source} {target} {size}"));

    char err[256];
    assert_int_equal(argv_template_check("/usr/local/sbin/mount-volume {source} {target} {size_gb}", 1, err,
                                         sizeof err),
                     0);
    assert_int_equal(argv_template_check("umount {target} {size_gb}", 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "only {target}"));
    assert_int_equal(argv_template_check("{size_gb} {source} {target}", 1, err, sizeof err), -1);
    assert_int_equal(argv_template_check("mount {size_gb} {target}", 1, err, sizeof err), -1);

    /* mount_argv: the volume's own size, in decimal. */
    char msg[512] = "";
    struct wl_spec s = spec_of("{\"image\": \"b\", \"volumes\": [{\"source\": \"nfs:/v\", \"target\": \"/shared\","
                               " \"size_gb\": 1048576}, {\"source\": \"nfs:/old\", \"target\": \"/old\"}]}");
    assert_int_equal(mount_argv(&a, "mount-volume {source} {target} {size_gb}", &s.volumes[0], "/run/m/v-2", msg,
                                sizeof msg),
                     0);
    assert_line(&a, "mount-volume nfs:/v /run/m/v-2 1048576");
    argv_free(&a);
    /* A volume without a size still mounts with a template that does not ask for one ... */
    assert_int_equal(mount_argv(&a, "mount --bind {source} {target}", &s.volumes[1], "/run/m/v-3", msg, sizeof msg),
                     0);
    assert_line(&a, "mount --bind nfs:/old /run/m/v-3");
    argv_free(&a);
    /* ... and is refused, saying why, by one that does. */
    assert_int_equal(mount_argv(&a, "mount-volume {source} {target} {size_gb}", &s.volumes[1], "/run/m/v-3", msg,
                                sizeof msg),
                     -1);
    assert_int_equal(a.n, 0);
    assert_non_null(strstr(msg, "mount nfs:/old: mount_command uses {size_gb}"));
    assert_non_null(strstr(msg, "no size_gb"));
    argv_free(&a);
    assert_int_equal(mount_argv(&a, "mount {source} {target} {nope}", &s.volumes[0], "/run/m/v-2", msg, sizeof msg),
                     -1);
    assert_string_equal(msg, "mount nfs:/v: bad mount_command template");
    argv_free(&a);
    spec_free(&s);
}

static void test_argv_bounds(void **state)
{
    struct argv_buf a = {0};
    for (int i = 0; i < ARGV_MAX; i++)
        argv_add(&a, "w");
    assert_int_equal(a.overflow, 0);
    argv_add(&a, "one too many");
    assert_int_equal(a.overflow, 1);
    assert_int_equal(a.n, ARGV_MAX);
    assert_null(a.v[a.n]);
    argv_free(&a);
    char line[8];
    argv_add(&a, "abcdef");
    argv_add(&a, "ghijkl");
    argv_join(&a, line, sizeof line);
    assert_string_equal(line, "abcdef ");
    argv_free(&a);
}

static void test_mount_points(void **state)
{
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/proc"), 1);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/dev/shm/"), 1);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/run/gpurent-agent/mounts/v-0123456789abcdef"), 1);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/mnt/with space"), 1);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/mnt/bind"), 1);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/mnt"), 0);
    assert_int_equal(mount_is_mount_point(MOUNTINFO, "/run/gpurent-agent/mounts/v-0123456789abcde"), 0);
    assert_int_equal(mount_is_mount_point("tests/data/agent/no-such-file", "/proc"), -1);
    /* The live table: /proc is a mount point here too, /proc/self is not. */
    assert_int_equal(mount_is_mount_point("/proc/self/mountinfo", "/proc"), 1);
    assert_int_equal(mount_is_mount_point("/proc/self/mountinfo", "/proc/self/fd"), 0);

    char s[] = "a\\040b\\011c\\134d\\0";
    mount_unescape(s);
    assert_string_equal(s, "a b\tc\\d\\0");

    char d1[256], d2[256], d3[256];
    assert_int_equal(mount_host_dir("/run/m", "nfs:/a", d1, sizeof d1), 0);
    assert_int_equal(mount_host_dir("/run/m", "nfs:/a", d2, sizeof d2), 0);
    assert_int_equal(mount_host_dir("/run/m", "nfs:/b", d3, sizeof d3), 0);
    assert_string_equal(d1, d2); /* one mount per source */
    assert_string_not_equal(d1, d3);
    assert_int_equal(strlen(d1), strlen("/run/m/v-") + 16);
    assert_int_equal(mount_host_dir("/run/m", "x", d1, 10), -1);
}

/* exec_run with a timeout in seconds from now, as the runtime calls it. */
static int run(char *const argv[], int timeout_s, atomic_int *cancel, struct exec_result *r)
{
    struct exec_opts o = {.deadline_ms = clock_mono_ms() + (int64_t)timeout_s * 1000, .cancel = cancel};
    return exec_run(argv, &o, r);
}

#define W(s) ((char *)(uintptr_t)(s))

static void test_exec(void **state)
{
    struct exec_result r;
    char *ok[] = {W("echo"), W("hello;"), W("$(id)"), NULL};
    assert_int_equal(run(ok, 10, NULL, &r), 0);
    assert_true(r.exited);
    assert_int_equal(r.status, 0);
    /* No shell: metacharacters are plain text. */
    assert_string_equal(r.output, "hello; $(id)\n");

    char *fail[] = {W("ls"), W("/no/such/dir"), NULL};
    assert_int_equal(run(fail, 10, NULL, &r), -1);
    assert_true(r.exited);
    assert_int_equal(r.status, 2);
    char why[512];
    exec_describe(&r, why, sizeof why);
    assert_non_null(strstr(why, "exit status 2: "));
    assert_non_null(strstr(why, "/no/such/dir"));

    char *missing[] = {W("gpurent-no-such-program"), NULL};
    assert_int_equal(run(missing, 10, NULL, &r), -1);
    assert_false(r.started);
    exec_describe(&r, why, sizeof why);
    assert_string_equal(why, "gpurent-no-such-program: not found in PATH");
    char *missing_path[] = {W("/no/such/program"), NULL};
    assert_int_equal(run(missing_path, 10, NULL, &r), -1);
    assert_string_equal(r.output, "/no/such/program: not found or not executable");

    /* Only the tail of a long output is kept. */
    char *yes[] = {W("seq"), W("1"), W("100000"), NULL};
    assert_int_equal(run(yes, 10, NULL, &r), 0);
    assert_int_equal(strlen(r.output), EXEC_OUTPUT_MAX - 1);
    assert_non_null(strstr(r.output, "\n100000\n"));

    int64_t t0 = clock_mono_ms();
    char *slow[] = {W("sleep"), W("30"), NULL};
    assert_int_equal(run(slow, 1, NULL, &r), -1);
    assert_true(r.timed_out);
    assert_true(clock_mono_ms() - t0 < 10000);

    atomic_int cancel = 1;
    t0 = clock_mono_ms();
    assert_int_equal(run(slow, 30, &cancel, &r), -1);
    assert_true(r.interrupted);
    assert_true(clock_mono_ms() - t0 < 10000);
    exec_describe(&r, why, sizeof why);
    assert_string_equal(why, "interrupted");

    /* A deadline already past starts nothing. */
    assert_int_equal(run(ok, 0, NULL, &r), -1);
    assert_false(r.started);
    assert_true(r.timed_out);

    char *killed[] = {W("sh"), W("-c"), W("kill -9 $$"), NULL};
    assert_int_equal(run(killed, 10, NULL, &r), -1);
    assert_false(r.exited);
    assert_int_equal(r.signal, 9);
}

/* What GPU discovery asks of the runner: stdout whole and apart from
 * stderr, a cap on it, and a directory searched after PATH. */
static void test_exec_capture(void **state)
{
    struct exec_result r;
    char buf[64];
    struct exec_capture cap = {.buf = buf, .cap = sizeof buf};
    struct exec_opts o = {.deadline_ms = clock_mono_ms() + 10000, .out = &cap};

    char *both[] = {W("sh"), W("-c"), W("echo out; echo err >&2; echo more"), NULL};
    assert_int_equal(exec_run(both, &o, &r), 0);
    assert_int_equal(cap.len, 9);
    assert_memory_equal(buf, "out\nmore\n", 9);
    assert_string_equal(r.output, "err\n");

    /* Appended after what is there; over the cap the command is killed. */
    char *more[] = {W("echo"), W("again"), NULL};
    assert_int_equal(exec_run(more, &o, &r), 0);
    assert_int_equal(cap.len, 15);
    assert_memory_equal(buf + 9, "again\n", 6);
    int64_t t0 = clock_mono_ms();
    char *flood[] = {W("yes"), NULL};
    assert_int_equal(exec_run(flood, &o, &r), -1);
    assert_true(r.overflowed);
    assert_true(cap.full); /* the stream that did not fit says so */
    assert_false(r.timed_out);
    assert_true(cap.len <= sizeof buf);
    assert_true(clock_mono_ms() - t0 < 5000);

    /* A program found only in also_path. */
    char dir[] = "/tmp/test_exec.XXXXXX", tool[64];
    assert_non_null(mkdtemp(dir));
    snprintf(tool, sizeof tool, "%s/gpurent-test-tool", dir);
    FILE *f = fopen(tool, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\necho found\n", f);
    fclose(f);
    assert_int_equal(chmod(tool, 0755), 0);
    char *bare[] = {W("gpurent-test-tool"), NULL};
    cap.len = 0;
    assert_int_equal(exec_run(bare, &o, &r), -1);
    assert_string_equal(r.output, "gpurent-test-tool: not found in PATH");
    o.also_path = dir;
    assert_int_equal(exec_run(bare, &o, &r), 0);
    assert_memory_equal(buf, "found\n", 6);
    o.also_path = "/nonexistent";
    assert_int_equal(exec_run(bare, &o, &r), -1);
    assert_string_equal(r.output, "gpurent-test-tool: not found in PATH or /nonexistent");
    unlink(tool);
    rmdir(dir);
}

/* The command starts with default signals whatever the agent ignores or
 * blocks (it ignores SIGPIPE and blocks its shutdown signals). */
static void test_exec_signals(void **state)
{
    struct exec_result r;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
    void (*pipe_was)(int) = signal(SIGPIPE, SIG_IGN);
    void (*int_was)(int) = signal(SIGINT, SIG_IGN);
    char *status[] = {W("grep"), W("-E"), W("^Sig(Blk|Ign)"), W("/proc/self/status"), NULL};
    int rc = run(status, 10, NULL, &r);
    signal(SIGPIPE, pipe_was);
    signal(SIGINT, int_was);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    assert_int_equal(rc, 0);
    unsigned long long blocked, ignored;
    assert_int_equal(sscanf(r.output, "SigBlk: %llx SigIgn: %llx", &blocked, &ignored), 2);
    assert_int_equal(blocked, 0);
    /* Only these: the signals this test was started with stay as they were. */
    static const int reset[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++)
        assert_int_equal(ignored & (1ull << (reset[i] - 1)), 0);
}

/* SSH sessions: podman exec with stdin open, a TTY when asked, the
 * session's variables. */
static void test_exec_argv(void **state)
{
    struct oci_cmd c = {.exe = "podman", .docker = 0, .stop_timeout_s = 30};
    struct argv_buf a = {0};
    const char *vars[] = {"SSH_CLIENT=192.0.2.7 50022 2222", "TERM=xterm-256color", NULL};
    assert_int_equal(oci_argv_exec(&c, "wl_abc", NULL, 1, vars, &a), 0);
    assert_line(&a,
                "podman exec -i -t -e SSH_CLIENT=192.0.2.7 50022 2222 -e TERM=xterm-256color gpurent-wl_abc /bin/sh");
    assert_string_equal(a.v[5], "SSH_CLIENT=192.0.2.7 50022 2222"); /* one word */
    argv_free(&a);
    memset(&a, 0, sizeof a);
    assert_int_equal(oci_argv_exec(&c, "wl_abc", "echo 'a b'; exit 3", 0, NULL, &a), 0);
    assert_line(&a, "podman exec -i gpurent-wl_abc /bin/sh -c echo 'a b'; exit 3");
    assert_int_equal(a.n, 7);
    assert_string_equal(a.v[6], "echo 'a b'; exit 3"); /* one word, never re-split */
    argv_free(&a);
    struct oci_cmd d = {.exe = "/usr/bin/docker", .docker = 1, .stop_timeout_s = 30};
    memset(&a, 0, sizeof a);
    assert_int_equal(oci_argv_exec(&d, "wl_x", "tty", 1, NULL, &a), 0);
    assert_line(&a, "/usr/bin/docker exec -i -t gpurent-wl_x /bin/sh -c tty");
    argv_free(&a);
    /* Forwards find the container's main process by its pid. */
    memset(&a, 0, sizeof a);
    assert_int_equal(oci_argv_inspect_pid(&c, "wl_abc", &a), 0);
    assert_line(&a, "podman container inspect --format {{.State.Pid}} gpurent-wl_abc");
    argv_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_podman_rocm), cmocka_unit_test(test_run_docker_rocm),
        cmocka_unit_test(test_run_podman_cuda), cmocka_unit_test(test_run_docker_cuda),
        cmocka_unit_test(test_run_without_gpus), cmocka_unit_test(test_run_published_ports), cmocka_unit_test(test_run_multi_node), cmocka_unit_test(test_render_nodes_from_the_kfd_topology), cmocka_unit_test(test_other_commands),
        cmocka_unit_test(test_parse_state),     cmocka_unit_test(test_parse_time),
        cmocka_unit_test(test_templates),
        cmocka_unit_test(test_size_template),
        cmocka_unit_test(test_argv_bounds),     cmocka_unit_test(test_mount_points),
        cmocka_unit_test(test_exec),
        cmocka_unit_test(test_exec_capture),
        cmocka_unit_test(test_exec_signals),
        cmocka_unit_test(test_exec_argv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
