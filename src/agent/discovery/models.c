/* models.c: the catalog models the agent knows. Maps the marketing name a
 * GPU tool prints ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3") to the
 * catalog code gpurent sells it under, by whole words, so a product the
 * catalog does not sell (H100 PCIe, RTX 4090 D, MI325X) is never taken for
 * one it does; and gives each code's defaults (memory, vendor, stack, name)
 * for an inventory configured rather than discovered. */
#include "discovery/discovery.h"

#include <ctype.h>
#include <string.h>

#define MAX_TOKENS 16
#define TOKEN_LEN 16

struct tokens {
    size_t n;                      /* words in t */
    char t[MAX_TOKENS][TOKEN_LEN]; /* upper-cased words, NUL-terminated */
};

/* Splits a name into upper-case alphanumeric words, so "AMD Instinct
 * MI250X/MI250" and "[Instinct MI250X/MI250]" both yield MI250X and MI250,
 * and "MI300X" never matches inside "MI300XL". Over-long words are dropped. */
static void tokenize(const char *name, struct tokens *tk)
{
    size_t len = 0;
    int overlong = 0;

    tk->n = 0;
    for (const char *p = name;; p++) {
        if (*p != '\0' && isalnum((unsigned char)*p)) {
            if (len + 1 < TOKEN_LEN && tk->n < MAX_TOKENS)
                tk->t[tk->n][len++] = (char)toupper((unsigned char)*p);
            else
                overlong = 1;
            continue;
        }
        if (len > 0 && !overlong && tk->n < MAX_TOKENS) {
            tk->t[tk->n][len] = '\0';
            tk->n++;
        }
        len = 0;
        overlong = 0;
        if (*p == '\0')
            break;
    }
}

static long token_at(const struct tokens *tk, const char *word)
{
    for (size_t i = 0; i < tk->n; i++)
        if (strcmp(tk->t[i], word) == 0)
            return (long)i;
    return -1;
}

static int has_token(const struct tokens *tk, const char *word)
{
    return token_at(tk, word) >= 0;
}

const char *discovery_model_code(const char *name)
{
    struct tokens tk;
    long rtx;

    if (name == NULL)
        return NULL;
    tokenize(name, &tk);
    if (has_token(&tk, "MI450") || has_token(&tk, "MI450X"))
        return "MI450";
    if (has_token(&tk, "MI300X"))
        return "MI300X";
    if (has_token(&tk, "MI250") || has_token(&tk, "MI250X"))
        return "MI250";
    /* Older amdgpu FRU names call the MI250 OAM "MI200 (MCM) OAM ..."; the
     * single-die MI210 is a PCIe card and never says MCM. */
    if (has_token(&tk, "MI200") && has_token(&tk, "MCM"))
        return "MI250";
    if (has_token(&tk, "H100")) {
        /* "NVIDIA H100 80GB HBM3" is the SXM5 board; PCIe and NVL are
         * different products with their own price. */
        if (has_token(&tk, "PCIE") || has_token(&tk, "NVL"))
            return NULL;
        if (has_token(&tk, "HBM3") || has_token(&tk, "SXM") || has_token(&tk, "SXM5"))
            return "H100-SXM";
        return NULL;
    }
    /* "RTX 4090 D" (the cut-down China model) and laptop parts add words
     * after 4090, so the 4090 must end the name. */
    rtx = token_at(&tk, "RTX");
    if (rtx >= 0 && (size_t)rtx + 2 == tk.n && strcmp(tk.t[rtx + 1], "4090") == 0)
        return "RTX4090";
    return NULL;
}

static const struct model_info {
    const char *model;  /* catalog code */
    int memory_gb;      /* per card */
    const char *vendor; /* "AMD" or "NVIDIA" */
    const char *name;   /* as the vendor tool prints it */
} models[] = {
  /* Memory as the gpurent catalog seeds it, so a sim fleet matches it. */
    {"MI450",    192, "AMD",    "AMD Instinct MI450"       },
    {"MI300X",   96,  "AMD",    "AMD Instinct MI300X"      },
    {"MI250",    128, "AMD",    "AMD Instinct MI250X/MI250"},
    {"H100-SXM", 80,  "NVIDIA", "NVIDIA H100 80GB HBM3"    },
    {"RTX4090",  24,  "NVIDIA", "NVIDIA GeForce RTX 4090"  },
};

int discovery_model_defaults(const char *model, int *memory_gb, const char **vendor, const char **stack,
                             const char **name)
{
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        if (strcmp(models[i].model, model) == 0) {
            *memory_gb = models[i].memory_gb;
            *vendor = models[i].vendor;
            *stack = strcmp(models[i].vendor, "AMD") == 0 ? "ROCm" : "CUDA";
            *name = models[i].name;
            return 0;
        }
    }
    return -1;
}
