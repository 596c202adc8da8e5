/* The reference for the library's group-commit goal (scripts/bench_durability.py): the same
 * workload as memfs's library benchmark — THREADS threads each appending EVENTS 300-byte lines
 * to one file, every append returning only once an fdatasync covers it — with no Python, no
 * interpreter lock and no validation, and the same group commit as memfs/store/writer.py
 * (LogFile.sync_to): each thread write()s its line under a mutex (the file's order) and then
 * waits; one thread at a time runs fdatasync for everything written so far, and its end wakes
 * every thread it covered. The threads a sync covers, its own runner among them, are "owed":
 * the next sync waits until each of them has written its next line, and the last of them to
 * come runs it; the first to wait for them waits at most twice the last fdatasync's duration
 * (never over 2 ms), then runs it without whoever has not come. Without that wait the threads
 * fall into two groups that alternate and each sync covers about half of them. What this program
 * reaches on a machine is what that algorithm reaches there; memfs's library pays Python and
 * its interpreter lock on top.
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

#define MAX_THREADS 256
#define OWED_WAIT_MAX_NS 2000000L
#define OWED_WAIT_SYNCS 2  /* the bound in last fdatasyncs (memfs.store.writer.OWED_WAIT_SYNCS) */

static pthread_mutex_t order = PTHREAD_MUTEX_INITIALIZER;  /* the file's order */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;     /* the sync state */
static pthread_cond_t synced_cv = PTHREAD_COND_INITIALIZER;  /* a sync ended, or the owed came */
static int fd, syncing, threads;
static atomic_int failed;  /* an errno: every thread stops */
static long written, synced, syncs, events;
static long target_of[MAX_THREADS];  /* each thread's last line's end, 0 when none waits */
static char owes[MAX_THREADS];
static int owed;                /* threads the next sync waits for */
static int timing;              /* a thread times the wait for them */
static long last_sync_ns;
static char line[300];

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* The first thread to wait for the owed ones (mu held, no sync running) waits until a sync
 * begins or ends or none is owed, at most the bound; 1 when the bound ran out first. */
static int wait_owed(void)
{
    long limit = OWED_WAIT_SYNCS * last_sync_ns;
    if (limit > OWED_WAIT_MAX_NS)
        limit = OWED_WAIT_MAX_NS;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long ns = until.tv_nsec + limit;
    until.tv_sec += ns / 1000000000L;
    until.tv_nsec = ns % 1000000000L;
    long seen = syncs;
    int rc = 0;
    timing = 1;
    while (!syncing && syncs == seen && owed > 0 && !failed && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&synced_cv, &mu, &until);
    timing = 0;
    return rc == ETIMEDOUT && !syncing && syncs == seen && owed > 0;
}

static void sync_to(int me, long target)
{
    pthread_mutex_lock(&mu);
    target_of[me] = target;
    if (owes[me]) {
        owes[me] = 0;
        owed--;
    }
    int waited = 0;  /* this thread's wait for the owed ran out */
    while (synced < target && !failed) {
        if (syncing || (owed > 0 && !waited && timing)) {
            pthread_cond_wait(&synced_cv, &mu);
            continue;
        }
        if (owed > 0 && !waited) {
            waited = wait_owed();
            continue;
        }
        syncing = 1;
        if (owed > 0) {  /* the wait ran out: whoever has not come is owed no longer */
            memset(owes, 0, sizeof owes);
            owed = 0;
        }
        pthread_mutex_lock(&order);
        long goal = written;  /* every byte written so far: this sync covers it */
        pthread_mutex_unlock(&order);
        pthread_mutex_unlock(&mu);
        long start = now_ns();
        int rc = fdatasync(fd);
        long took = now_ns() - start;
        pthread_mutex_lock(&mu);
        syncing = 0;
        syncs++;
        last_sync_ns = took;
        if (rc != 0)
            failed = errno;
        else if (goal > synced)
            synced = goal;
        for (int k = 0; k < threads; k++)  /* the threads it covered owe the next sync a line */
            if (target_of[k] && target_of[k] <= synced && !owes[k]) {
                owes[k] = 1;
                owed++;
            }
        pthread_cond_broadcast(&synced_cv);
    }
    target_of[me] = 0;
    pthread_mutex_unlock(&mu);
}

static void *appender(void *arg)
{
    int me = (int)(long)arg;
    for (long i = 0; i < events && !failed; i++) {
        pthread_mutex_lock(&order);
        ssize_t n = write(fd, line, sizeof line);
        if (n != (ssize_t)sizeof line)
            failed = n < 0 ? errno : EIO;
        long target = written += sizeof line;
        pthread_mutex_unlock(&order);
        sync_to(me, target);
    }
    pthread_mutex_lock(&mu);  /* a thread that ends is owed nothing */
    if (owes[me]) {
        owes[me] = 0;
        if (--owed == 0)  /* the waiters run the sync now */
            pthread_cond_broadcast(&synced_cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PATH THREADS EVENTS\n", argv[0]);
        return 2;
    }
    threads = atoi(argv[2]);
    events = atol(argv[3]);
    if (threads < 1 || threads > MAX_THREADS || events < 1) {
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
    pthread_t pool[MAX_THREADS];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&pool[i], NULL, appender, (void *)(long)i) != 0) {
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
