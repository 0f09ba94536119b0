/* ring_disk.c: the disk ring, a FIFO of call directories: the newest N stay, the oldest
 * is deleted when a new one comes. */
#include "ring_disk.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dump_format.h"

struct fi_disk_ring {
    long long n;
    char **dirs;           /* ring buffer of the calls' directories */
    long long head, count; /* index of the oldest; directories held */
};

fi_disk_ring *fi_disk_ring_new(long long n)
{
    fi_disk_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->n = n;
    r->dirs = calloc((size_t)n, sizeof(char *));
    if (!r->dirs) {
        free(r);
        return NULL;
    }
    return r;
}

void fi_disk_ring_free(fi_disk_ring *r)
{
    if (!r)
        return;
    for (long long i = 0; i < r->n; i++)
        free(r->dirs[i]);
    free(r->dirs);
    free(r);
}

/* Removes path and everything under it; errors are ignored (best effort). */
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
 * with metadata.jsonl for a dump) never see a dump losing its files. */
static void delete_call_dir(const char *dir)
{
    size_t n = strlen(dir) + 32;
    char *meta = malloc(n);
    if (meta) {
        snprintf(meta, n, "%s/" FI_DUMP_METADATA_FILE, dir);
        unlink(meta);
        free(meta);
    }
    remove_tree(dir);
}

int fi_disk_ring_push(fi_disk_ring *r, const char *dir)
{
    char *copy = strdup(dir);
    if (!copy)
        return -1;
    if (r->count == r->n) {
        char *oldest = r->dirs[r->head];
        r->head = (r->head + 1) % r->n;
        r->count--;
        delete_call_dir(oldest);
        free(oldest);
    }
    r->dirs[(r->head + r->count) % r->n] = copy;
    r->count++;
    return 0;
}
