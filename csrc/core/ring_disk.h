/* ring_disk.h: the disk ring (FLASHINFER_DUMP_RING without FLASHINFER_DUMP_ON): the call
 * directories of this process's newest N calls, the oldest deleted as new ones come
 * (docs/ring.md). */
#ifndef FI_RING_DISK_H
#define FI_RING_DISK_H

typedef struct fi_disk_ring fi_disk_ring;
typedef struct fi_disk_entry fi_disk_entry;

/* A ring of n call directories; NULL when out of memory. */
fi_disk_ring *fi_disk_ring_new(long long n);
void fi_disk_ring_free(fi_disk_ring *r);

/* dir (copied) is the newest call. It is pinned while its call writes it: no eviction
 * deletes it before fi_disk_ring_unpin. The oldest unpinned directories beyond n are
 * deleted, each metadata.jsonl first so readers never see a partial dump; one that cannot be
 * deleted stays counted. NULL when out of memory. */
fi_disk_entry *fi_disk_ring_push(fi_disk_ring *r, const char *dir);

/* e's call is whole: its directory may go, and directories beyond n do. */
void fi_disk_ring_unpin(fi_disk_ring *r, fi_disk_entry *e);

/* e's call could not be written: its directory is deleted and leaves the ring. */
void fi_disk_ring_drop(fi_disk_ring *r, fi_disk_entry *e);

/* The directories the ring holds (pinned ones included). */
long long fi_disk_ring_count(const fi_disk_ring *r);

/* In a forked child: forgets the parent's directories without deleting them. */
void fi_disk_ring_forget(fi_disk_ring *r);

#endif
