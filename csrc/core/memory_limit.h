/* memory_limit.h: how much memory this process may use, for the in-memory ring's default
 * budget (docs/ring.md). */
#ifndef FI_MEMORY_LIMIT_H
#define FI_MEMORY_LIMIT_H

#include <stdint.h>

/* The smallest of: the memory limit of the process's cgroup (v2 memory.max, v1
 * memory.limit_in_bytes, at its cgroup and every cgroup above it that is visible), what the
 * soft RLIMIT_AS leaves beside the address space mapped now, and the physical memory.
 * UINT64_MAX when none is known. */
uint64_t fi_memory_limit(void);

#endif
