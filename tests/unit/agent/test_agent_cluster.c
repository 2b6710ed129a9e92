/* test_agent_cluster.c: unit tests for a spec's cluster member (what a
 * valid one becomes, every refusal with its field, bounds, the identity
 * never quoted, equality and the JSON and record round trips) and the
 * files made from it (hostfiles, ssh config, known_hosts, their modes),
 * and for fabric.c: RDMA devices from a directory of stand-in nodes,
 * video/render gids from a stand-in group file, --shm-size values and the
 * data address chosen among interfaces. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

/* A throwaway key made by ssh-keygen -t ed25519 for these tests only. */
static const char KEY[] = "-----BEGIN OPENSSH PRIVATE KEY-----\n"
                          "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
                          "QyNTUxOQAAACA4h3lXiLw9DmQgpu4Qnu/0QiskU+ZNKsS0QALhK6C/RgAAAIjQ7WeU0O1n\n"
                          "lAAAAAtzc2gtZWQyNTUxOQAAACA4h3lXiLw9DmQgpu4Qnu/0QiskU+ZNKsS0QALhK6C/Rg\n"
                          "AAAEDaF9tTOV7RmcsDDZ3s3V87o3jkk4hu7t0NLicgZpXwNDiHeVeIvD0OZCCm7hCe7/RC\n"
                          "KyRT5k0qxLRAAuEroL9GAAAAAAECAwQF\n"
                          "-----END OPENSSH PRIVATE KEY-----\n";
static const char HOST_KEY[] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G";

static json_t *host_doc(int i, const char *address)
{
    char name[32], user[32];
    snprintf(name, sizeof name, "rank%d", i);
    snprintf(user, sizeof user, "ins_x-%d", i);
    return json_pack("{s:s, s:s, s:i, s:s, s:i, s:s}", "name", name, "address", address, "ssh_port", 2222 + i,
                     "user", user, "slots", 8, "host_key", HOST_KEY);
}

/* A spec whose cluster has n hosts at 10.0.0.(i+1), this node rank 1. */
static json_t *spec_doc(int n)
{
    json_t *hosts = json_array();
    for (int i = 0; i < n; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "10.0.%d.%d", i / 200, i % 200 + 1);
        json_array_append_new(hosts, host_doc(i, addr));
    }
    return json_pack("{s:s, s:{s:i, s:o, s:s}}", "image", "img", "cluster", "rank", n > 1 ? 1 : 0, "hosts", hosts,
                     "identity", KEY);
}

static int parse_doc(json_t *doc, struct wl_spec *s, char field[64], char err[512])
{
    field[0] = err[0] = '\0';
    int rc = spec_parse(doc, s, field, 64, err, 512);
    json_decref(doc);
    return rc;
}

static void expect_bad_doc(json_t *doc, const char *want_field)
{
    struct wl_spec s;
    char field[64], err[512];
    assert_int_equal(parse_doc(doc, &s, field, err), -1);
    assert_string_equal(field, want_field);
    assert_true(err[0] != '\0');
    /* The private key is never quoted, whatever was wrong. */
    assert_null(strstr(err, "b3BlbnNzaC1rZXkt"));
    assert_null(s.image);
    assert_int_equal(s.cluster.present, 0);
    assert_null(s.cluster.hosts);
    assert_null(s.cluster.identity);
}

static json_t *cluster_of(json_t *doc)
{
    return json_object_get(doc, "cluster");
}

static json_t *host_of(json_t *doc, size_t i)
{
    return json_array_get(json_object_get(cluster_of(doc), "hosts"), i);
}

static void test_valid_cluster(void **state)
{
    json_t *doc = spec_doc(3);
    json_object_set_new(host_of(doc, 1), "address", json_string("fd00::5"));
    json_object_set_new(host_of(doc, 2), "address", json_string("node-7.fabric.example"));
    json_object_set_new(host_of(doc, 2), "ssh_port", json_integer(22));
    struct wl_spec s;
    char field[64], err[512];
    assert_int_equal(parse_doc(doc, &s, field, err), 0);
    assert_true(s.cluster.present);
    assert_int_equal(s.cluster.rank, 1);
    assert_int_equal(s.cluster.n_hosts, 3);
    assert_string_equal(s.cluster.hosts[0].name, "rank0");
    assert_string_equal(s.cluster.hosts[0].address, "10.0.0.1");
    assert_int_equal(s.cluster.hosts[0].ssh_port, 2222);
    assert_string_equal(s.cluster.hosts[0].user, "ins_x-0");
    assert_int_equal(s.cluster.hosts[0].slots, 8);
    assert_string_equal(s.cluster.hosts[0].host_key, HOST_KEY);
    assert_string_equal(s.cluster.hosts[1].address, "fd00::5");
    assert_string_equal(s.cluster.identity, KEY);
    assert_true(cluster_multi_node(&s));
    spec_free(&s);
    assert_int_equal(s.cluster.present, 0);

    /* One host: a cluster, but none of the multi-node flags. */
    assert_int_equal(parse_doc(spec_doc(1), &s, field, err), 0);
    assert_true(s.cluster.present);
    assert_false(cluster_multi_node(&s));
    spec_free(&s);
    /* null is absent. */
    assert_int_equal(parse_doc(json_pack("{s:s, s:n}", "image", "img", "cluster"), &s, field, err), 0);
    assert_int_equal(s.cluster.present, 0);
    assert_false(cluster_multi_node(&s));
    spec_free(&s);
}

static void set_host(json_t *doc, size_t i, const char *key, json_t *v)
{
    json_object_set_new(host_of(doc, i), key, v);
}

static void test_refusals(void **state)
{
    json_t *d;
    expect_bad_doc(json_pack("{s:s, s:i}", "image", "img", "cluster", 1), "cluster");
    expect_bad_doc(json_pack("{s:s, s:[]}", "image", "img", "cluster"), "cluster");
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "extra", json_true());
    expect_bad_doc(d, "cluster.extra");
    d = spec_doc(2);
    set_host(d, 1, "mode", json_string("x"));
    expect_bad_doc(d, "cluster.hosts[1].mode");
    d = spec_doc(2);
    json_object_del(cluster_of(d), "hosts");
    expect_bad_doc(d, "cluster.hosts");
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "hosts", json_array());
    expect_bad_doc(d, "cluster.hosts");
    d = spec_doc(2);
    json_array_set_new(json_object_get(cluster_of(d), "hosts"), 1, json_string("rank1"));
    expect_bad_doc(d, "cluster.hosts[1]");

    /* rank: this node's entry. */
    static const char *const bad_ranks[] = {"-1", "2", "1.0", "\"1\"", "null", "true"};
    for (size_t i = 0; i < sizeof bad_ranks / sizeof bad_ranks[0]; i++) {
        d = spec_doc(2);
        json_object_set_new(cluster_of(d), "rank", json_loads(bad_ranks[i], JSON_DECODE_ANY, NULL));
        expect_bad_doc(d, "cluster.rank");
    }
    d = spec_doc(2);
    json_object_del(cluster_of(d), "rank");
    expect_bad_doc(d, "cluster.rank");

    /* Names: hostfile words and ssh Host patterns. */
    static const char *const bad_names[] = {"", "Rank0", "rank_0", "rank.0", "-rank", "a b", "rank*",
                                            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "name", json_string(bad_names[i]));
        expect_bad_doc(d, "cluster.hosts[1].name");
    }
    d = spec_doc(3);
    set_host(d, 2, "name", json_string("rank0"));
    expect_bad_doc(d, "cluster.hosts[2].name");
    d = spec_doc(2);
    set_host(d, 0, "name", json_integer(0));
    expect_bad_doc(d, "cluster.hosts[0].name");

    static const char *const bad_addresses[] = {"", "10.0.0", "10.0.0.256", "1.2.3.4.5", "[::1]", "fd00::5::1",
                                                "a b", "-x.example", "x..example", "x-.example", "10.0.0.1:22",
                                                "host_name", "example.", "x/y"};
    for (size_t i = 0; i < sizeof bad_addresses / sizeof bad_addresses[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "address", json_string(bad_addresses[i]));
        expect_bad_doc(d, "cluster.hosts[1].address");
    }
    char longname[300];
    memset(longname, 'a', sizeof longname);
    longname[299] = '\0';
    for (int i = 63; i < 299; i += 64)
        longname[i] = '.';
    d = spec_doc(2);
    set_host(d, 1, "address", json_string(longname));
    expect_bad_doc(d, "cluster.hosts[1].address");
    d = spec_doc(2);
    set_host(d, 1, "address", json_stringn("10.0.0.1\0x", 10));
    expect_bad_doc(d, "cluster.hosts[1].address");

    static const char *const bad_ports[] = {"0", "65536", "-22", "\"22\"", "22.5", "null"};
    for (size_t i = 0; i < sizeof bad_ports / sizeof bad_ports[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "ssh_port", json_loads(bad_ports[i], JSON_DECODE_ANY, NULL));
        expect_bad_doc(d, "cluster.hosts[1].ssh_port");
    }
    static const char *const bad_users[] = {"", "Root", "a b", "a;b",
                                            "uuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuu"};
    for (size_t i = 0; i < sizeof bad_users / sizeof bad_users[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "user", json_string(bad_users[i]));
        expect_bad_doc(d, "cluster.hosts[1].user");
    }
    static const char *const bad_slots[] = {"0", "65", "-1", "\"8\"", "8.0"};
    for (size_t i = 0; i < sizeof bad_slots / sizeof bad_slots[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "slots", json_loads(bad_slots[i], JSON_DECODE_ANY, NULL));
        expect_bad_doc(d, "cluster.hosts[1].slots");
    }
    static const char *const bad_keys[] = {"", "ssh-ed25519", "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G",
                                           "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDiHeVeIvD0OZCCm7hCe7/RCKyRT5k0qxLRAAuEroL9G host"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
        d = spec_doc(2);
        set_host(d, 1, "host_key", json_string(bad_keys[i]));
        expect_bad_doc(d, "cluster.hosts[1].host_key");
    }
    d = spec_doc(2);
    json_object_del(host_of(d, 1), "host_key");
    expect_bad_doc(d, "cluster.hosts[1].host_key");

    /* The identity: an OpenSSH ed25519 private key that parses. */
    d = spec_doc(2);
    json_object_del(cluster_of(d), "identity");
    expect_bad_doc(d, "cluster.identity");
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "identity", json_integer(1));
    expect_bad_doc(d, "cluster.identity");
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "identity", json_string(HOST_KEY));
    expect_bad_doc(d, "cluster.identity");
    char broken[sizeof KEY];
    memcpy(broken, KEY, sizeof KEY);
    broken[60] = broken[60] == 'A' ? 'B' : 'A';
    broken[100] = '*';
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "identity", json_string(broken));
    expect_bad_doc(d, "cluster.identity");
    d = spec_doc(2);
    json_object_set_new(cluster_of(d), "identity",
                        json_string("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"));
    expect_bad_doc(d, "cluster.identity");
}

static void test_bounds(void **state)
{
    struct wl_spec s;
    char field[64], err[512];
    assert_int_equal(parse_doc(spec_doc(SPEC_CLUSTER_MAX_HOSTS), &s, field, err), 0);
    assert_int_equal(s.cluster.n_hosts, SPEC_CLUSTER_MAX_HOSTS);
    assert_string_equal(s.cluster.hosts[255].name, "rank255");
    spec_free(&s);
    expect_bad_doc(spec_doc(SPEC_CLUSTER_MAX_HOSTS + 1), "cluster.hosts");

    /* 63-byte names, 65535 ports, 64 slots, a 253-byte host name pass. */
    json_t *d = spec_doc(2);
    set_host(d, 1, "name", json_string("nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"));
    set_host(d, 1, "ssh_port", json_integer(65535));
    set_host(d, 1, "slots", json_integer(SPEC_CLUSTER_SLOTS_MAX));
    char dns[254];
    memset(dns, 'a', 253);
    dns[253] = '\0';
    for (int i = 63; i < 253; i += 64)
        dns[i] = '.';
    set_host(d, 0, "address", json_string(dns));
    assert_int_equal(parse_doc(d, &s, field, err), 0);
    assert_int_equal(s.cluster.hosts[1].slots, 64);
    assert_string_equal(s.cluster.hosts[0].address, dns);
    spec_free(&s);
    assert_true(cluster_address_valid("127.0.0.1"));
    assert_true(cluster_address_valid("::1"));
    assert_true(cluster_address_valid("gpu-1"));
    assert_false(cluster_address_valid("999"));
    assert_true(cluster_address_is_ip("::1"));
    assert_false(cluster_address_is_ip("gpu-1"));
}

static void test_equality_and_round_trips(void **state)
{
    struct wl_spec a, b;
    char field[64], err[512];
    assert_int_equal(parse_doc(spec_doc(3), &a, field, err), 0);
    /* The canonical JSON (the record's) reads back as the same spec. */
    json_t *j = spec_to_json(&a);
    assert_non_null(json_object_get(j, "cluster"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "cluster"), "identity")), KEY);
    assert_int_equal(spec_parse(j, &b, field, sizeof field, err, sizeof err), 0);
    json_decref(j);
    assert_true(spec_equal(&a, &b));
    spec_free(&b);

    /* So does a workload record. */
    struct workload w = {0}, back = {0};
    snprintf(w.id, sizeof w.id, "wl_c");
    w.spec = a;
    w.created_at = w.updated_at = 1700000000;
    j = record_to_json(&w);
    assert_int_equal(record_from_json(j, &back, err, sizeof err), 0);
    json_decref(j);
    assert_true(spec_equal(&a, &back.spec));
    spec_free(&back.spec);

    /* Each part counts. */
    static const char *const keys[] = {"name", "address", "ssh_port", "user", "slots", "host_key"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        json_t *d = spec_doc(3);
        json_t *v = !strcmp(keys[k], "ssh_port") || !strcmp(keys[k], "slots")   ? json_integer(7)
                    : !strcmp(keys[k], "address")                               ? json_string("10.9.9.9")
                    : !strcmp(keys[k], "host_key")
                        ? json_string("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFkma+OvHj0d9fo69rwQ7f6t2uhDHYerhW60gVk8qZjC")
                        : json_string("other");
        set_host(d, 2, keys[k], v);
        int rc = parse_doc(d, &b, field, err);
        if (rc < 0)
            fail_msg("%s: %s: %s", keys[k], field, err);
        assert_false(spec_equal(&a, &b));
        spec_free(&b);
    }
    json_t *d = spec_doc(3);
    json_object_set_new(cluster_of(d), "rank", json_integer(2));
    assert_int_equal(parse_doc(d, &b, field, err), 0);
    assert_false(spec_equal(&a, &b));
    spec_free(&b);
    d = spec_doc(3);
    json_object_del(d, "cluster");
    assert_int_equal(parse_doc(d, &b, field, err), 0);
    assert_false(spec_equal(&a, &b));
    assert_false(spec_equal(&b, &a));
    spec_free(&b);
    spec_free(&a);
}

static void test_files(void **state)
{
    struct wl_spec s;
    char field[64], err[512];
    json_t *doc = spec_doc(3);
    json_object_set_new(host_of(doc, 1), "address", json_string("fd00::5"));
    json_object_set_new(host_of(doc, 2), "ssh_port", json_integer(22));
    json_object_set_new(host_of(doc, 2), "slots", json_integer(4));
    assert_int_equal(parse_doc(doc, &s, field, err), 0);
    char *t = cluster_hostfile(&s.cluster, 0);
    assert_string_equal(t, "rank0 slots=8\nrank1 slots=8\nrank2 slots=4\n");
    free(t);
    t = cluster_hostfile(&s.cluster, 1);
    assert_string_equal(t, "rank0:8\nrank1:8\nrank2:4\n");
    free(t);
    t = cluster_known_hosts(&s.cluster);
    char want[1024];
    snprintf(want, sizeof want, "[10.0.0.1]:2222 %s\n[fd00::5]:2223 %s\n10.0.0.3 %s\n", HOST_KEY, HOST_KEY, HOST_KEY);
    assert_string_equal(t, want);
    free(t);
    t = cluster_ssh_config(&s.cluster, "~/.ssh");
    assert_non_null(strstr(t, "Host rank1\n    HostName fd00::5\n    Port 2223\n    User ins_x-1\n"
                              "    IdentityFile ~/.ssh/id_ed25519\n    IdentitiesOnly yes\n"
                              "    StrictHostKeyChecking yes\n    UserKnownHostsFile ~/.ssh/known_hosts\n"));
    assert_non_null(strstr(t, "Host rank2\n    HostName 10.0.0.3\n    Port 22\n"));
    free(t);
    /* A home with a blank is quoted; one ssh would expand is refused. */
    t = cluster_ssh_config(&s.cluster, "/a b/.ssh");
    assert_non_null(strstr(t, "    IdentityFile \"/a b/.ssh/id_ed25519\"\n"));
    free(t);
    assert_null(cluster_ssh_config(&s.cluster, "/a%d/.ssh"));
    assert_null(cluster_ssh_config(&s.cluster, "/a\"/.ssh"));

    char dir[] = "/tmp/gpurent-cluster-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char etc[256], ssh[256], path[512];
    snprintf(etc, sizeof etc, "%s/w/etc/gpurent", dir);
    snprintf(ssh, sizeof ssh, "%s/w/.ssh", dir);
    char msg[256] = "";
    assert_int_equal(cluster_write_files(&s.cluster, etc, ssh, ssh, msg, sizeof msg), 0);
    struct stat st;
    static const struct {
        const char *dir, *name;
        unsigned mode;
    } files[] = {{"etc", "hostfile", 0644}, {"etc", "hostfile.mpi", 0644}, {"ssh", "config", 0600},
                 {"ssh", "known_hosts", 0644}, {"ssh", "id_ed25519", 0600}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", files[i].dir[0] == 'e' ? etc : ssh, files[i].name);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, files[i].mode);
    }
    assert_int_equal(stat(ssh, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    snprintf(path, sizeof path, "%s/id_ed25519", ssh);
    size_t len = 0;
    char *key = state_read_file(path, 65536, &len);
    assert_string_equal(key, KEY);
    free(key);
    snprintf(path, sizeof path, "%s/config", ssh);
    char *config = state_read_file(path, 65536, &len);
    snprintf(want, sizeof want, "    IdentityFile %s/id_ed25519\n", ssh);
    assert_non_null(strstr(config, want));
    free(config);
    snprintf(path, sizeof path, "%s/w", dir);
    cluster_remove_dir(path);
    assert_int_equal(access(path, F_OK), -1);
    cluster_remove_dir(path); /* a missing one is fine */
    rmdir(dir);
    spec_free(&s);
}

static void touch(const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
}

static void test_fabric(void **state)
{
    char dir[] = "/tmp/gpurent-fabric-XXXXXX", path[512], sub[600];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/infiniband", dir);
    char **devs = NULL;
    int n = -1;
    /* No directory: a host without RDMA. */
    assert_int_equal(fabric_rdma_devices(path, &devs, &n), 0);
    assert_int_equal(n, 0);
    assert_null(devs);
    assert_int_equal(mkdir(path, 0700), 0);
    touch(path, "uverbs1");
    touch(path, "uverbs0");
    touch(path, "rdma_cm");
    touch(path, "umad0");
    touch(path, ".hidden");
    touch(path, "bad:name");
    snprintf(sub, sizeof sub, "%s/by-path", path);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(sub, sizeof sub, "%s/link0", path);
    assert_int_equal(symlink("uverbs0", sub), 0);
    assert_int_equal(fabric_rdma_devices(path, &devs, &n), 0);
    assert_int_equal(n, 4);
    static const char *const want[] = {"rdma_cm", "umad0", "uverbs0", "uverbs1"};
    for (int i = 0; i < 4; i++) {
        snprintf(sub, sizeof sub, "%s/%s", path, want[i]);
        assert_string_equal(devs[i], sub);
    }
    fabric_free_devices(devs, n);

    snprintf(path, sizeof path, "%s/group", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("root:x:0:\nvideos:x:7:\nvideo:x:44:gpurent\nrender:x:109:\nbroken:x:abc:\n", f);
    fclose(f);
    long gid = 0;
    assert_int_equal(fabric_group_gid(path, "video", &gid), 0);
    assert_int_equal(gid, 44);
    assert_int_equal(fabric_group_gid(path, "render", &gid), 0);
    assert_int_equal(gid, 109);
    assert_int_equal(fabric_group_gid(path, "vide", &gid), 1);
    assert_int_equal(gid, -1);
    assert_int_equal(fabric_group_gid(path, "broken", &gid), 1);
    snprintf(sub, sizeof sub, "%s/none", dir);
    assert_int_equal(fabric_group_gid(sub, "video", &gid), -1);
    /* The host's own: root is gid 0 everywhere. */
    assert_int_equal(fabric_group_gid("", "root", &gid), 0);
    assert_int_equal(gid, 0);
    assert_int_equal(fabric_group_gid("", "no-such-group-gpurent", &gid), 1);

    static const char *const good[] = {"64g", "1", "512m", "100000000000b", "2G", "8k"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_true(fabric_shm_size_valid(good[i]));
    static const char *const bad[] = {"", "0", "0g", "g", "64gb", "64 g", "-1g", "1.5g", "064g", "64t",
                                      "9999999999999g"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (fabric_shm_size_valid(bad[i]))
            fail_msg("'%s' accepted", bad[i]);

    struct fabric_iface ifs[] = {{"127.0.0.1", 1, 1, 0}, {"192.168.1.5", 0, 0, 1}, {"10.1.0.2", 0, 1, 0},
                                 {"10.2.0.2", 0, 1, 1}};
    char addr[64];
    assert_int_equal(fabric_pick_address(ifs, 4, addr, sizeof addr), 0);
    assert_string_equal(addr, "10.2.0.2"); /* up and on the RDMA fabric */
    assert_int_equal(fabric_pick_address(ifs, 3, addr, sizeof addr), 0);
    assert_string_equal(addr, "10.1.0.2"); /* the RDMA one is down */
    assert_int_equal(fabric_pick_address(ifs, 1, addr, sizeof addr), -1);
    assert_string_equal(addr, "");

    snprintf(path, sizeof path, "%s/infiniband", dir);
    cluster_remove_dir(path);
    snprintf(path, sizeof path, "%s/group", dir);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_cluster), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bounds),        cmocka_unit_test(test_equality_and_round_trips),
        cmocka_unit_test(test_files),         cmocka_unit_test(test_fabric),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
