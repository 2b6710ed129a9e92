/* test_agent_config.c: unit tests for gpurent-agent's configuration: the
 * shipped conf/gpurent-agent.conf lists every option with its default,
 * bad values are refused with a reason, and the configured inventory turns
 * into the facts a sim node reports. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

static void test_shipped_file_is_the_defaults(void **state)
{
    static struct agent_conf defaults, file;
    char err[1024];
    assert_int_equal(conf_set_defaults(agent_options, &defaults, err, sizeof err), 0);
    memset(&file, 0x5a, sizeof file); /* anything the file does not set would show */
    assert_int_equal(conf_set_defaults(agent_options, &file, err, sizeof err), 0);
    assert_int_equal(conf_load_file(agent_options, &file, "conf/gpurent-agent.conf", err, sizeof err), 0);
    for (const struct conf_option *o = agent_options; o->name; o++) {
        const char *d = (const char *)&defaults + o->offset, *v = (const char *)&file + o->offset;
        if (o->type == CONF_STRING ? strcmp(d, v) != 0 : memcmp(d, v, o->size) != 0)
            fail_msg("conf/gpurent-agent.conf sets %s to something other than its default", o->name);
    }

    /* And every option is written out in it, not left implicit. */
    size_t len = 0;
    char *text = state_read_file("conf/gpurent-agent.conf", 1 << 20, &len);
    assert_non_null(text);
    for (const struct conf_option *o = agent_options; o->name; o++) {
        char key[80];
        snprintf(key, sizeof key, "\n%s =", o->name);
        if (!strstr(text, key))
            fail_msg("conf/gpurent-agent.conf does not list %s", o->name);
    }
    free(text);
}

static int set(struct agent_conf *c, const char *kv)
{
    char err[512];
    return conf_set_override(agent_options, c, kv, err, sizeof err);
}

static void test_values(void **state)
{
    static struct agent_conf c;
    char err[512];
    assert_int_equal(conf_set_defaults(agent_options, &c, err, sizeof err), 0);
    assert_int_equal(set(&c, "runtime=docker"), 0);
    assert_int_equal(set(&c, "runtime=lxc"), -1);
    assert_string_equal(c.runtime, "docker"); /* a refused value changes nothing */
    assert_int_equal(set(&c, "discovery=rocm-smi"), 0);
    assert_int_equal(set(&c, "discovery=lspci"), -1);
    assert_int_equal(set(&c, "node_name=gpu-07"), 0);
    assert_int_equal(set(&c, "node_name=GPU 07"), -1);
    assert_int_equal(set(&c, "mount_command=mount --bind {source} {target}"), 0);
    assert_int_equal(set(&c, "mount_command=mount {target}"), -1);
    assert_int_equal(set(&c, "umount_command=umount -l {target}"), 0);
    assert_int_equal(set(&c, "umount_command=umount {source}"), -1);
    /* The volume's quota is known to a mount only. */
    assert_int_equal(set(&c, "mount_command=/usr/local/sbin/mount-volume {source} {target} {size_gb}"), 0);
    assert_string_equal(c.mount_command, "/usr/local/sbin/mount-volume {source} {target} {size_gb}");
    assert_int_equal(set(&c, "umount_command=umount {target} {size_gb}"), -1);
    assert_int_equal(set(&c, "run_args=--shm-size={size_gb}g"), -1);
    assert_int_equal(set(&c, "inventory_failed_cards=0,7"), 0);
    assert_int_equal(set(&c, "inventory_failed_cards=0,x"), -1);
    assert_int_equal(set(&c, "inventory_failed_cards=64"), -1);
    assert_int_equal(set(&c, "run_args=--ipc=host --shm-size=8g"), 0);
    assert_int_equal(set(&c, "run_args=--name={target}"), -1);
    assert_int_equal(set(&c, "inventory_driver_version=6.8.0-45-generic"), 0);
    assert_int_equal(set(&c, "inventory_driver_version=6.8 beta"), -1);
    assert_int_equal(set(&c, "inventory_stack_version=12.4+local"), 0);
    assert_int_equal(set(&c, "inventory_stack_version=\"12.4\""), -1);
    assert_string_equal(c.inventory_stack_version, "12.4+local");
    assert_int_equal(set(&c, "inventory_cards=0"), -1);
    assert_int_equal(set(&c, "max_clock_skew_s=0"), -1);
    assert_int_equal(set(&c, "listen=localhost"), -1);
    assert_int_equal(set(&c, "publish_port_range=40000-40009"), 0);
    assert_int_equal(set(&c, "publish_port_range="), 0);
    assert_int_equal(set(&c, "publish_port_range=7-7"), 0);
    static const char *const bad_ranges[] = {"publish_port_range=40000", "publish_port_range=0-10",
                                             "publish_port_range=10-65536", "publish_port_range=20-10",
                                             "publish_port_range=a-b", "publish_port_range=10-20x",
                                             "publish_port_range=-10"};
    for (size_t i = 0; i < sizeof bad_ranges / sizeof bad_ranges[0]; i++)
        assert_int_equal(set(&c, bad_ranges[i]), -1);
    assert_string_equal(c.publish_port_range, "7-7");
    assert_int_equal(set(&c, "sim_publish_ports_per_node=0"), -1);
    assert_int_equal(agent_check_config(&c), 0);
    assert_int_equal(set(&c, "tls_cert=/x.pem"), 0);
    assert_int_equal(agent_check_config(&c), -1); /* tls_key missing */
}

static void test_inventory(void **state)
{
    static struct agent_conf c;
    static struct gpu_facts f;
    char err[512];
    assert_int_equal(conf_set_defaults(agent_options, &c, err, sizeof err), 0);
    assert_int_equal(set(&c, "inventory_model=MI300X"), 0);
    assert_int_equal(set(&c, "inventory_cards=4"), 0);
    assert_int_equal(set(&c, "inventory_failed_cards=2"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), 0);
    assert_string_equal(f.vendor, "AMD");
    assert_string_equal(f.stack, "ROCm");
    assert_int_equal(f.n_cards, 4);
    assert_int_equal(f.cards[3].index, 3);
    assert_string_equal(f.cards[0].model, "MI300X");
    assert_string_equal(f.cards[0].name, "AMD Instinct MI300X");
    assert_int_equal(f.cards[0].memory_gb, 96);
    assert_true(f.cards[1].healthy);
    assert_false(f.cards[2].healthy);
    assert_true(f.cards[2].health_reason[0] != '\0');
    /* Versions: the vendor's defaults unless configured. */
    assert_string_equal(f.driver_version, "6.8.5");
    assert_string_equal(f.stack_version, "6.2.0");
    assert_int_equal(set(&c, "inventory_driver_version=6.10.5"), 0);
    assert_int_equal(set(&c, "inventory_stack_version=7.0.2"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), 0);
    assert_string_equal(f.driver_version, "6.10.5");
    assert_string_equal(f.stack_version, "7.0.2");
    assert_int_equal(set(&c, "inventory_driver_version="), 0);
    assert_int_equal(set(&c, "inventory_stack_version="), 0);
    /* The name maps back to the model through the discovery module. */
    assert_string_equal(discovery_model_code(f.cards[0].name), "MI300X");

    assert_int_equal(set(&c, "inventory_model=H100-SXM"), 0);
    assert_int_equal(set(&c, "inventory_memory_gb=94"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), 0);
    assert_string_equal(f.vendor, "NVIDIA");
    assert_string_equal(f.stack, "CUDA");
    assert_string_equal(f.driver_version, "550.54.15");
    assert_string_equal(f.stack_version, "12.4");
    assert_int_equal(f.cards[0].memory_gb, 94);
    assert_string_equal(discovery_model_code(f.cards[0].name), "H100-SXM");

    /* A model the agent does not know needs its memory stated. */
    assert_int_equal(set(&c, "discovery=config"), 0);
    assert_int_equal(set(&c, "inventory_model=MI355X"), 0);
    assert_int_equal(set(&c, "inventory_memory_gb=0"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), -1);
    assert_int_equal(agent_check_config(&c), -1);
    assert_int_equal(set(&c, "inventory_memory_gb=288"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), 0);
    assert_string_equal(f.stack, "ROCm");
    assert_int_equal(set(&c, "inventory_model=MI 355"), 0);
    assert_int_equal(agent_inventory_from_config(&c, &f, err, sizeof err), -1);

    int mem;
    const char *vendor, *stack, *name;
    assert_int_equal(discovery_model_defaults("MI450", &mem, &vendor, &stack, &name), 0);
    assert_int_equal(mem, 192);
    assert_string_equal(discovery_model_code(name), "MI450");
    assert_int_equal(discovery_model_defaults("RTX4090", &mem, &vendor, &stack, &name), 0);
    assert_string_equal(discovery_model_code(name), "RTX4090");
    assert_int_equal(discovery_model_defaults("MI250", &mem, &vendor, &stack, &name), 0);
    assert_string_equal(discovery_model_code(name), "MI250");
    assert_int_equal(discovery_model_defaults("A100", &mem, &vendor, &stack, &name), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_file_is_the_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_inventory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
