/* discovery/discovery.h: GPU discovery for gpurent-agent. Turns what
 * amd-smi, rocm-smi or nvidia-smi print into one struct gpu_facts: the
 * cards, their catalog model, memory, and whether each one looks healthy.
 * This is what the rest of the agent sees of src/agent/discovery, grouped
 * by the file that implements it; the helpers the files share are in
 * private.h (text.c, cards.c).
 *
 * The parsers are pure (no I/O, no allocation that outlives the call) so
 * they can be tested on recorded output in tests/data/discovery/;
 * discovery_run() is the only function that starts a process.
 *
 * Health: a card is reported unhealthy (healthy = 0, with health_reason)
 * when the tool says it failed, not when the output is malformed. Signals
 * used: amd-smi uncorrectable ECC errors, RAS bad-page threshold exceeded,
 * "N/A" where a name or VRAM size must be; rocm-smi "N/A" VRAM size;
 * nvidia-smi bracketed error values ("[GPU requires reset]", "[Unknown
 * Error]" ...), uncorrected volatile ECC errors, pages pending retirement,
 * and the "Unable to determine the device handle for GPU ..." line for a
 * card that fell off the bus. Malformed output (truncated, wrong types,
 * missing fields, garbage) makes the parser fail with -1 instead.
 *
 * Each parser reads len bytes of text (need not be NUL-terminated), fills
 * *out and returns 0; or returns -1 with *out zeroed and a one-line message
 * in err, e.g. "amd-smi output: card 3 has no vram size". A node with mixed
 * models is not an error: each card carries its own model. */
#ifndef GPURENT_DISCOVERY_H
#define GPURENT_DISCOVERY_H

#include <stddef.h>

#define DISCOVERY_MAX_CARDS 64
/* Largest tool output read or parsed; amd-smi static on 64 partitions is
 * a few hundred KiB, so this only stops a runaway tool. */
#define DISCOVERY_MAX_OUTPUT (4u * 1024 * 1024)

struct gpu_card {
    int index;              /* the tool's GPU index; -1 if the tool could not number it */
    char model[32];         /* catalog code ("MI300X"), "" if not in the catalog */
    char name[96];          /* the model name as the tool printed it */
    int memory_gb;          /* VRAM in GiB, rounded to nearest; 0 if unknown */
    int healthy;            /* 1 ok, 0 failed */
    char health_reason[96]; /* why healthy is 0; "" when healthy */
    char bus_id[32];        /* PCI address as printed ("0000:05:00.0"), may be "" */
    char serial[64];        /* board serial, else the ASIC serial or UUID; may be "" */
};

struct gpu_facts {
    char vendor[16];                            /* "AMD" or "NVIDIA" */
    char stack[8];                              /* "ROCm" or "CUDA" */
    char driver_version[48];                    /* amdgpu or NVIDIA driver version, may be "" */
    char stack_version[48];                     /* ROCm or CUDA version when the tools tell it, else "" */
    size_t n_cards;                             /* entries used in cards[], at least 1 on success */
    struct gpu_card cards[DISCOVERY_MAX_CARDS]; /* sorted by index, -1 last */
};

/* amd_smi.c: amd-smi (preferred on AMD; ROCm 6.1 and later). discovery_run
 * runs three commands and concatenates their stdout:
 *     amd-smi version --json                 ROCm version (optional)
 *     amd-smi static --asic --bus --vram --driver --board --ras --json
 *                                            cards, names, VRAM, driver
 *     amd-smi metric --ecc --json            uncorrectable ECC counts (optional)
 * Both shapes amd-smi has used are read: a top-level array of per-GPU
 * objects (ROCm 6.x) and {"gpu_data": [...]} (ROCm 7.x). VRAM size may be
 * {"value": N, "unit": "MB"} or a string "N MB". */
int discovery_parse_amd_smi(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen);

/* rocm_smi.c: rocm-smi (deprecated, for older nodes), one command:
 *     rocm-smi --showproductname --showmeminfo vram --showdriverversion
 *              --showserial --showbus --json
 * rocm-smi prints the driver version but not ROCm's, which discovery_run
 * reads from $ROCM_PATH/.info/version (default /opt/rocm), as it does when
 * amd-smi's optional version command failed. */
int discovery_parse_rocm_smi(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen);

/* nvidia_smi.c: nvidia-smi, two commands whose stdout is concatenated, CSV
 * first:
 *     nvidia-smi --query-gpu=DISCOVERY_NVIDIA_SMI_FIELDS
 *                --format=csv,noheader,nounits
 *     nvidia-smi -q -d COMPUTE               CUDA version (optional): no
 *                                            --query-gpu field has it, the
 *                                            header of -q output does
 * The parser reads the CSV rows, optionally followed by the -q output (from
 * its "==============NVSMI LOG==============" banner on), whose header gives
 * the CUDA version and, if the rows had none, the driver version. */
/* The nvidia-smi --query-gpu fields, in the order the CSV parser expects. */
#define DISCOVERY_NVIDIA_SMI_FIELDS                                  \
    "index,name,memory.total,driver_version,serial,uuid,pci.bus_id," \
    "ecc.errors.uncorrected.volatile.total,retired_pages.pending"
int discovery_parse_nvidia_smi_csv(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen);

/* models.c: the catalog's models. */
/* Maps a marketing name ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3",
 * "NVIDIA GeForce RTX 4090", "AMD Instinct MI450", "AMD Instinct MI250X/MI250")
 * to its catalog code (MI300X, H100-SXM, RTX4090, MI450, MI250), or NULL for a
 * model the catalog does not sell (H100 PCIe, RTX 4090 D, MI325X ...). */
const char *discovery_model_code(const char *name);
/* The default card memory (GB, as the catalog seeds it), vendor, stack and
 * marketing name (which discovery_model_code maps back to the code) of a
 * catalog model, for an inventory configured rather than discovered; -1
 * for a model the agent does not know. */
int discovery_model_defaults(const char *model, int *memory_gb, const char **vendor, const char **stack,
                             const char **name);

/* discovery.c: running the tools. */
/* The ROCm release at the start of a $ROCM_PATH/.info/version file
 * ("6.0.2-115" gives "6.0.2") into out; -1 with out "" when the text does
 * not start with one or it does not fit in cap. */
int discovery_parse_rocm_version(const char *text, size_t len, char *out, size_t cap);
/* Runs a discovery command through exec.c (no shell), reads its stdout (at
 * most DISCOVERY_MAX_OUTPUT bytes, over every command together) and parses
 * it with the parser for tool ("amd-smi", "rocm-smi" or "nvidia-smi"). argv
 * NULL runs the commands listed above for the tool; otherwise argv[0] is run
 * (looked up in PATH, then /opt/rocm/bin) with argv, NULL-terminated. The
 * whole call is bounded by timeout_s seconds: a command still running then
 * is killed with its process group (SIGTERM, SIGKILL two seconds later). A
 * command that exits non-zero fails the call, with the last line it printed
 * (stderr first) in err, except the optional amd-smi version and metric and
 * nvidia-smi -q commands, which are logged and skipped. The caller must not
 * set SIGCHLD to SIG_IGN (exec.c reaps the child). */
int discovery_run(const char *tool, char *const argv[], int timeout_s, struct gpu_facts *out, char *err, size_t errlen);

#endif
