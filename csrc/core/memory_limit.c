/* memory_limit.c: the memory this process may use, from the places Linux keeps limits:
 * cgroups (v2 and v1), RLIMIT_AS and the physical memory. */
#include "memory_limit.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The number in a cgroup limit file; UINT64_MAX for "max", a missing file or junk. */
static uint64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return UINT64_MAX;
    char text[64] = {0};
    char *ok = fgets(text, sizeof text, f);
    fclose(f);
    char *end;
    unsigned long long v = ok ? strtoull(text, &end, 10) : 0;
    return ok && end != text ? (uint64_t)v : UINT64_MAX;
}

/* The smallest limit in base/<prefix>/file over every prefix of the cgroup path cg (a path
 * visible from this cgroup namespace may start below the root of base, so every prefix is
 * tried, the root included). */
static uint64_t limit_along(const char *base, const char *cg, const char *file)
{
    uint64_t best = UINT64_MAX;
    char prefix[PATH_MAX], path[PATH_MAX];
    if (snprintf(prefix, sizeof prefix, "%s", cg) >= (int)sizeof prefix)
        return best;
    for (;;) {
        size_t n = strlen(prefix);
        while (n > 0 && prefix[n - 1] == '/')
            prefix[--n] = '\0';
        if (snprintf(path, sizeof path, "%s%s/%s", base, prefix, file) < (int)sizeof path) {
            uint64_t v = read_limit(path);
            if (v < best)
                best = v;
        }
        char *slash = strrchr(prefix, '/');
        if (n == 0 || !slash)
            return best;
        *slash = '\0';
    }
}

/* The cgroup limits named by /proc/self/cgroup: "0::/path" (v2) and "N:...memory...:/path"
 * (v1). */
static uint64_t cgroup_limit(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return UINT64_MAX;
    uint64_t best = UINT64_MAX;
    char line[PATH_MAX + 64];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1, *cg = c2 + 1;
        uint64_t v = UINT64_MAX;
        if (!strcmp(line, "0") && !controllers[0]) {
            v = limit_along("/sys/fs/cgroup", cg, "memory.max");
            uint64_t u = limit_along("/sys/fs/cgroup/unified", cg, "memory.max");
            v = u < v ? u : v;
        } else if (strstr(controllers, "memory")) {
            v = limit_along("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes");
        }
        if (v < best)
            best = v;
    }
    fclose(f);
    return best;
}

/* The address space this process has mapped: /proc/self/statm's first field, in pages. */
static uint64_t mapped_now(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGE_SIZE);
    return page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

uint64_t fi_memory_limit(void)
{
    uint64_t best = cgroup_limit();
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        /* the address space counts what is mapped already (libraries, reservations) */
        uint64_t used = mapped_now(), cap = (uint64_t)rl.rlim_cur;
        uint64_t left = cap > used ? cap - used : 0;
        if (left < best)
            best = left;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0 && (uint64_t)pages * (uint64_t)page < best)
        best = (uint64_t)pages * (uint64_t)page;
    return best;
}
