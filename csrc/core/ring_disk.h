/* ring_disk.h: the disk ring (FLASHINFER_DUMP_RING without FLASHINFER_DUMP_ON): the call
 * directories of the newest N calls, the oldest deleted as new ones come (docs/ring.md). */
#ifndef FI_RING_DISK_H
#define FI_RING_DISK_H

typedef struct fi_disk_ring fi_disk_ring;

/* A ring of n call directories; NULL when out of memory. */
fi_disk_ring *fi_disk_ring_new(long long n);
void fi_disk_ring_free(fi_disk_ring *r);

/* dir (copied) is the newest call; the oldest beyond n is deleted, its metadata.jsonl
 * first so readers never see a partial dump. -1 when out of memory. */
int fi_disk_ring_push(fi_disk_ring *r, const char *dir);

#endif
