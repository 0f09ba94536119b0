/* config.c: environment -> fi_config. Bad values never fail: one warning each
 * (through the caller's callback) and the default applies. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "memory_limit.h"

int fi_config_round_level(long long level)
{
    if (level >= 10)
        return 10;
    if (level >= 5)
        return 5;
    if (level >= 3)
        return 3;
    if (level >= 1)
        return 1;
    return 0;
}

char *fi_config_subst_pid(const char *src, long pid)
{
    char pidtext[32];
    int pidlen = snprintf(pidtext, sizeof pidtext, "%ld", pid);
    size_t n = 0;
    for (const char *p = src; *p; p++, n++)
        if (p[0] == '%' && p[1] == 'i')
            n += (size_t)pidlen;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = src; *p; p++) {
        if (p[0] == '%' && p[1] == 'i') {
            memcpy(o, pidtext, (size_t)pidlen);
            o += pidlen;
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static int is_blank(const char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    return *s == '\0';
}

/* Parses a whole-string integer (surrounding spaces allowed). */
static int parse_ll(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || !is_blank(end))
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !is_blank(end) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Splits "a, b,,c" into trimmed non-empty malloc'd items. */
static int split_patterns(const char *s, char **items, int *count)
{
    *count = 0;
    while (s && *s) {
        const char *comma = strchr(s, ',');
        const char *end = comma ? comma : s + strlen(s);
        const char *b = s, *e = end;
        while (b < e && isspace((unsigned char)*b))
            b++;
        while (e > b && isspace((unsigned char)e[-1]))
            e--;
        if (e > b && *count < FI_MAX_PATTERNS) {
            char *item = strndup(b, (size_t)(e - b));
            if (!item)
                return -1;
            items[(*count)++] = item;
        }
        s = comma ? comma + 1 : NULL;
    }
    return 0;
}

static const struct {
    const char *name;
    unsigned bit;
} trigger_names[] = {
    {"exception", FI_TRIGGER_EXCEPTION}, {"nan", FI_TRIGGER_NAN},       {"inf", FI_TRIGGER_INF},
    {"nan_input", FI_TRIGGER_NAN_INPUT}, {"signal", FI_TRIGGER_SIGNAL}, {"exit", FI_TRIGGER_EXIT},
};

/* FLASHINFER_DUMP_ON: known names become bits; each unknown one warns, naming the
 * triggers that stay in effect (the rest still count). */
static int parse_triggers(fi_config *cfg, const char *value, fi_config_warn_fn warn, void *ctx)
{
    char *items[FI_MAX_PATTERNS];
    int n;
    if (split_patterns(value, items, &n) < 0)
        return -1;
    const size_t n_names = sizeof trigger_names / sizeof trigger_names[0];
    int unknown[FI_MAX_PATTERNS];
    for (int i = 0; i < n; i++) {
        unsigned bit = 0;
        for (size_t k = 0; k < n_names; k++)
            if (strcmp(items[i], trigger_names[k].name) == 0)
                bit = trigger_names[k].bit;
        unknown[i] = !bit;
        cfg->dump_on |= bit;
    }
    char in_effect[128] = "";
    for (size_t k = 0; k < n_names; k++)
        if (cfg->dump_on & trigger_names[k].bit) {
            if (in_effect[0])
                strcat(in_effect, ", ");
            strcat(in_effect, trigger_names[k].name);
        }
    for (int i = 0; i < n; i++) {
        if (unknown[i]) {
            char message[640];
            snprintf(message, sizeof message,
                     "'%.256s' is not a trigger (known: exception, nan, inf, nan_input, signal, "
                     "exit) and is ignored; %s%s",
                     items[i],
                     in_effect[0] ? "the triggers in effect: " : "no trigger is in effect",
                     in_effect);
            warn(ctx, "FLASHINFER_DUMP_ON", message, NULL);
        }
        free(items[i]);
    }
    return 0;
}

/* var, when set, as an integer in [lo, hi] into *out; any other value warns (naming
 * default_text) and leaves *out alone. */
static void env_ll(const char *var, long long lo, long long hi, const char *default_text,
                   long long *out, fi_config_warn_fn warn, void *ctx)
{
    const char *v = env_or_null(var);
    long long n;
    if (v && parse_ll(v, &n) == 0 && n >= lo && n <= hi)
        *out = n;
    else if (v)
        warn(ctx, var, v, default_text);
}

/* var, when set, as a finite number >= 0 into *out, like env_ll. */
static void env_size_gb(const char *var, const char *default_text, double *out,
                        fi_config_warn_fn warn, void *ctx)
{
    const char *v = env_or_null(var);
    double d;
    if (v && parse_double(v, &d) == 0 && d >= 0)
        *out = d;
    else if (v)
        warn(ctx, var, v, default_text);
}

double fi_config_default_ring_gb(void)
{
    /* a ring that took what the process may use would make its own calls fail */
    double quarter = (double)fi_memory_limit() / 4.0 / (1024.0 * 1024.0 * 1024.0);
    return quarter < 4.0 ? quarter : 4.0;
}

/* The flight recorder's variables (FLASHINFER_DUMP_RING and what goes with it). */
static int ring_from_env(fi_config *cfg, fi_config_warn_fn warn, void *ctx)
{
    cfg->max_triggers = 1;
    env_ll("FLASHINFER_DUMP_RING", 1, LLONG_MAX, "0 (no ring)", &cfg->ring, warn, ctx);
    cfg->ring_max_gb = cfg->ring > 0 ? fi_config_default_ring_gb() : 4.0;
    char budget[32];
    snprintf(budget, sizeof budget, "%g", cfg->ring_max_gb);
    env_size_gb("FLASHINFER_DUMP_RING_MAX_GB", budget, &cfg->ring_max_gb, warn, ctx);
    env_ll("FLASHINFER_DUMP_MAX_TRIGGERS", 0, LLONG_MAX, "1", &cfg->max_triggers, warn, ctx);
    const char *v = env_or_null("FLASHINFER_DUMP_LAYOUT");
    if (v && strcasecmp(v, "flashinfer") == 0)
        cfg->layout = FI_LAYOUT_FLASHINFER;
    else if (v && strcasecmp(v, "compact") == 0)
        cfg->layout = FI_LAYOUT_COMPACT;
    else if (v)
        warn(ctx, "FLASHINFER_DUMP_LAYOUT", v,
             "flashinfer for plain level 10, compact for the rings");
    v = env_or_null("FLASHINFER_DUMP_ON");
    return v ? parse_triggers(cfg, v, warn, ctx) : 0;
}

int fi_config_from_env(fi_config *cfg, fi_config_warn_fn warn, void *ctx)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_size_gb = 20.0;
    cfg->max_count = 1000;
    long pid = (long)getpid();
    const char *v;
    long long n;

    if ((v = env_or_null("FLASHINFER_LOGLEVEL"))) {
        /* A negative level means 0 (docs/logging.md#environment-variables), like the default, and
         * is warned about as every other bad value is. */
        if (parse_ll(v, &n) == 0 && n >= 0)
            cfg->level = fi_config_round_level(n);
        else
            warn(ctx, "FLASHINFER_LOGLEVEL", v, "0");
    }
    if ((v = env_or_null("FLASHINFER_LOGFORMAT"))) {
        if (strcasecmp(v, "json") == 0)
            cfg->log_format = FI_LOG_JSON;
        else if (strcasecmp(v, "text") != 0)
            warn(ctx, "FLASHINFER_LOGFORMAT", v, "text");
    }
    v = env_or_null("FLASHINFER_LOGDEST");
    cfg->logdest = fi_config_subst_pid(v ? v : "stdout", pid);
    v = env_or_null("FLASHINFER_DUMP_DIR");
    cfg->dump_dir = fi_config_subst_pid(v ? v : "flashinfer_dumps", pid);
    if (!cfg->logdest || !cfg->dump_dir)
        return -1;
    env_size_gb("FLASHINFER_DUMP_MAX_SIZE_GB", "20", &cfg->max_size_gb, warn, ctx);
    env_ll("FLASHINFER_DUMP_MAX_COUNT", 0, LLONG_MAX, "1000", &cfg->max_count, warn, ctx);
    long long safetensors = 0;
    env_ll("FLASHINFER_DUMP_SAFETENSORS", 0, 1, "0", &safetensors, warn, ctx);
    cfg->safetensors = (int)safetensors;
    long long scratch = 0;
    env_ll("FLASHINFER_DUMP_SCRATCH", 0, 1, "0", &scratch, warn, ctx);
    cfg->dump_scratch = (int)scratch;
    if (split_patterns(getenv("FLASHINFER_DUMP_INCLUDE"), cfg->include, &cfg->n_include) < 0 ||
        split_patterns(getenv("FLASHINFER_DUMP_EXCLUDE"), cfg->exclude, &cfg->n_exclude) < 0)
        return -1;
    return ring_from_env(cfg, warn, ctx);
}

void fi_config_free(fi_config *cfg)
{
    free(cfg->logdest);
    free(cfg->dump_dir);
    for (int i = 0; i < cfg->n_include; i++)
        free(cfg->include[i]);
    for (int i = 0; i < cfg->n_exclude; i++)
        free(cfg->exclude[i]);
    memset(cfg, 0, sizeof(*cfg));
}

static int matches_any(char *const *patterns, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (fnmatch(patterns[i], name, FNM_NOESCAPE) == 0)
            return 1;
    return 0;
}

int fi_config_name_passes(const fi_config *cfg, const char *api_name)
{
    if (cfg->n_include && !matches_any(cfg->include, cfg->n_include, api_name))
        return 0;
    return !matches_any(cfg->exclude, cfg->n_exclude, api_name);
}
