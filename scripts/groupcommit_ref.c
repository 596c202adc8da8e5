/* The reference for the library's group-commit goal (scripts/bench_durability.py): the same
 * workload as memfs's library benchmark — THREADS threads each appending EVENTS 300-byte lines
 * to one file, every append returning only once an fdatasync covers it — with no Python, no
 * interpreter lock and no validation, in the classic form of group commit: each thread
 * write()s its line under a mutex (the file's order) and then waits; one waiting thread at a
 * time runs fdatasync for everything written so far, and its end wakes every thread it covered
 * and elects the next syncer.  What this program reaches on a machine is what that algorithm
 * reaches there; memfs's library runs the same algorithm (memfs/store/writer.py) and pays
 * Python and its interpreter lock on top.
 *
 * Built by bench_durability.py with the C compiler Python was built with; a benchmark tool,
 * not part of memfs.
 *
 * Usage: groupcommit_ref PATH THREADS EVENTS  ->  prints "<events per second> <fdatasyncs>"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t order = PTHREAD_MUTEX_INITIALIZER;  /* the file's order */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;     /* the sync state */
static pthread_cond_t synced_cv = PTHREAD_COND_INITIALIZER;
static int fd, syncing;
static atomic_int failed;  /* an errno: every thread stops */
static long written, synced, syncs, events;
static char line[300];

static void sync_to(long target)
{
    pthread_mutex_lock(&mu);
    while (synced < target && !failed) {
        if (syncing) {
            pthread_cond_wait(&synced_cv, &mu);
            continue;
        }
        syncing = 1;
        pthread_mutex_lock(&order);
        long goal = written;  /* every byte written so far: this sync covers it */
        pthread_mutex_unlock(&order);
        pthread_mutex_unlock(&mu);
        int rc = fdatasync(fd);
        pthread_mutex_lock(&mu);
        syncing = 0;
        syncs++;
        if (rc != 0)
            failed = errno;
        else if (goal > synced)
            synced = goal;
        pthread_cond_broadcast(&synced_cv);
    }
    pthread_mutex_unlock(&mu);
}

static void *appender(void *arg)
{
    (void)arg;
    for (long i = 0; i < events && !failed; i++) {
        pthread_mutex_lock(&order);
        ssize_t n = write(fd, line, sizeof line);
        if (n != (ssize_t)sizeof line)
            failed = n < 0 ? errno : EIO;
        long target = written += sizeof line;
        pthread_mutex_unlock(&order);
        sync_to(target);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PATH THREADS EVENTS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]);
    events = atol(argv[3]);
    if (threads < 1 || threads > 256 || events < 1) {
        fprintf(stderr, "THREADS must be 1..256 and EVENTS at least 1\n");
        return 2;
    }
    memset(line, 'x', sizeof line - 1);
    line[sizeof line - 1] = '\n';
    fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    pthread_t pool[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&pool[i], NULL, appender, NULL) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < threads; i++)
        pthread_join(pool[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    if (failed) {
        fprintf(stderr, "%s: %s\n", argv[1], strerror(failed));
        return 1;
    }
    double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.1f %ld\n", threads * events / secs, syncs);
    return 0;
}
