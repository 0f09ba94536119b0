/* ring_disk.c: the disk ring, the call directories of this process in call order: the newest
 * N stay, older ones are deleted once their calls are done writing them. */
#include "ring_disk.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dump_format.h"
struct fi_disk_entry {
    fi_disk_entry *prev, *next;
    int pinned; /* its call is writing it */
    char dir[];
};

struct fi_disk_ring {
    long long n, count;
    fi_disk_entry *oldest, *newest;
};

fi_disk_ring *fi_disk_ring_new(long long n)
{
    fi_disk_ring *r = calloc(1, sizeof(*r));
    if (r)
        r->n = n;
    return r;
}

void fi_disk_ring_forget(fi_disk_ring *r)
{
    while (r->oldest) {
        fi_disk_entry *e = r->oldest;
        r->oldest = e->next;
        free(e);
    }
    r->newest = NULL;
    r->count = 0;
}

void fi_disk_ring_free(fi_disk_ring *r)
{
    if (!r)
        return;
    fi_disk_ring_forget(r);
    free(r);
}

long long fi_disk_ring_count(const fi_disk_ring *r) { return r->count; }

/* Removes path and everything under it (best effort). */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t n = strlen(path) + strlen(e->d_name) + 2;
            char *child = malloc(n);
            if (!child)
                continue;
            snprintf(child, n, "%s/%s", path, e->d_name);
            if (unlink(child) < 0 && (errno == EISDIR || errno == EPERM))
                remove_tree(child); /* Linux: EISDIR, POSIX: EPERM */
            free(child);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Deletes a call directory: metadata.jsonl first, so that readers (which take a directory
 * with metadata.jsonl for a dump) never see a dump losing its files. 0 once it is gone, -1
 * when it is still on disk. */
static int delete_call_dir(const char *dir)
{
    size_t n = strlen(dir) + 32;
    char *meta = malloc(n);
    if (meta) {
        snprintf(meta, n, "%s/" FI_DUMP_METADATA_FILE, dir);
        unlink(meta);
        free(meta);
    }
    remove_tree(dir);
    return access(dir, F_OK) < 0 && errno == ENOENT ? 0 : -1;
}

static void unlink_entry(fi_disk_ring *r, fi_disk_entry *e)
{
    *(e->prev ? &e->prev->next : &r->oldest) = e->next;
    *(e->next ? &e->next->prev : &r->newest) = e->prev;
    r->count--;
    free(e);
}

/* Deletes the oldest unpinned directories while more than n are held. */
static void evict(fi_disk_ring *r)
{
    fi_disk_entry *e = r->oldest;
    while (e && r->count > r->n) {
        fi_disk_entry *next = e->next;
        if (!e->pinned && delete_call_dir(e->dir) == 0)
            unlink_entry(r, e);
        e = next;
    }
}

fi_disk_entry *fi_disk_ring_push(fi_disk_ring *r, const char *dir)
{
    size_t len = strlen(dir);
    fi_disk_entry *e = malloc(sizeof(*e) + len + 1);
    if (!e)
        return NULL;
    memcpy(e->dir, dir, len + 1);
    e->pinned = 1;
    e->next = NULL;
    e->prev = r->newest;
    *(r->newest ? &r->newest->next : &r->oldest) = e;
    r->newest = e;
    r->count++;
    evict(r);
    return e;
}

void fi_disk_ring_unpin(fi_disk_ring *r, fi_disk_entry *e)
{
    e->pinned = 0;
    evict(r);
}

void fi_disk_ring_drop(fi_disk_ring *r, fi_disk_entry *e)
{
    delete_call_dir(e->dir);
    unlink_entry(r, e);
}
