/* embedded.h: files compiled into gpurentd by scripts/embed.sh. */
#ifndef GPURENT_EMBEDDED_H
#define GPURENT_EMBEDDED_H

struct embedded_migration {
    int version;      /* NNNN from the file name */
    const char *name; /* file name without .sql */
    const char *sql;  /* the file's text */
};

/* docs/openapi.json */
extern const char embedded_openapi_json[];
/* migrations/NNNN_*.sql in order; ends with a {0, NULL, NULL} row. */
extern const struct embedded_migration embedded_migrations[];

#endif
