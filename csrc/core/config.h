/* config.h: the FLASHINFER_* environment variables parsed into a plain struct.
 * Pure C (getenv + strtol), so the rules of docs/logging.md#environment-variables live in one
 * place. */
#ifndef FI_CONFIG_H
#define FI_CONFIG_H

#include <stddef.h>

#define FI_MAX_PATTERNS 64

typedef enum { FI_LOG_TEXT = 0, FI_LOG_JSON = 1 } fi_log_format;

/* FLASHINFER_DUMP_ON trigger names as bits. */
enum {
    FI_TRIGGER_EXCEPTION = 1,
    FI_TRIGGER_NAN = 2,
    FI_TRIGGER_INF = 4,
    FI_TRIGGER_NAN_INPUT = 8, /* also check the inputs for the nan / inf triggers */
    FI_TRIGGER_SIGNAL = 16,
    FI_TRIGGER_EXIT = 32,
};

/* How level 10 stores a call's tensors (docs/dump-format.md): FlashInfer's layout, each
 * call's files standing alone, or the compact one, chunks stored once by content. Unset,
 * plain level 10 writes FlashInfer's and the rings the compact one. */
typedef enum { FI_LAYOUT_DEFAULT, FI_LAYOUT_FLASHINFER, FI_LAYOUT_COMPACT } fi_dump_layout;

typedef struct {
    int level;                /* 0, 1, 3, 5 or 10 after rounding down */
    fi_log_format log_format; /* FLASHINFER_LOGFORMAT: text (default) or json */
    char *logdest;            /* "stdout", "stderr" or a path with %i substituted */
    char *dump_dir;           /* %i substituted */
    double max_size_gb;
    long long max_count;
    int safetensors;
    int dump_scratch;       /* FLASHINFER_DUMP_SCRATCH=1: scratch tensors recorded whole */
    long long ring;         /* FLASHINFER_DUMP_RING: calls kept (0: no ring) */
    unsigned dump_on;       /* FLASHINFER_DUMP_ON: FI_TRIGGER_* bits (0: the ring is on disk) */
    double ring_max_gb;     /* FLASHINFER_DUMP_RING_MAX_GB: the in-memory ring's budget, by
                               default fi_config_default_ring_gb() */
    long long max_triggers; /* FLASHINFER_DUMP_MAX_TRIGGERS */
    fi_dump_layout layout;  /* FLASHINFER_DUMP_LAYOUT (FI_LAYOUT_DEFAULT: unset) */
    char *include[FI_MAX_PATTERNS];
    int n_include;
    char *exclude[FI_MAX_PATTERNS];
    int n_exclude;
} fi_config;

/* Called once per rejected variable: the variable, the bad value and the default used;
 * or, with default_text NULL, the variable and a whole sentence saying what happened. */
typedef void (*fi_config_warn_fn)(void *ctx, const char *var, const char *value,
                                  const char *default_text);

/* Reads the environment into cfg. Never fails on bad values (warns and uses the
 * default); returns -1 only when memory runs out. */
int fi_config_from_env(fi_config *cfg, fi_config_warn_fn warn, void *ctx);
void fi_config_free(fi_config *cfg);

/* The in-memory ring's budget when FLASHINFER_DUMP_RING_MAX_GB is unset: the smaller of
 * 4 GB and a quarter of the memory the process may use (fi_memory_limit). */
double fi_config_default_ring_gb(void);

/* Rounds a requested level down to a named one (0, 1, 3, 5, 10). */
int fi_config_round_level(long long level);

/* Include/exclude filters (docs/logging.md#environment-variables): include first (if any), then
 * exclude. */
int fi_config_name_passes(const fi_config *cfg, const char *api_name);

/* Replaces every %i in src by pid; returns a malloc'd string or NULL. */
char *fi_config_subst_pid(const char *src, long pid);

#endif
