/* Checkpoint bench: DCP save and load throughput against the raw write bandwidth of the same
 * disk measured in the same run (write() + fsync of the same byte count per rank), and how
 * long training is blocked by an async save (staging + commit polls) vs a sync save.
 *   mpirun -np 2 bench_checkpoint [--dir /tmp] [--mib 64] [--reps 3] [--step-ms 50]
 * Loads read files the save just wrote, so they come mostly from the page cache (said in the
 * output); the raw write and the save both fsync. The "training" step is a busy loop
 * followed by a barrier (standing in for the gradient all-reduce), then the commit poll. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hyperparallel/checkpoint.h>
#include <hyperparallel/comm.h>
#include <hyperparallel/mesh.h>

/* the slowest rank's time (int64 microseconds through the comm layer) */
static double max_us(hp_comm_t w, double seconds) {
    int64_t us = (int64_t)(seconds * 1e6), r = us;
    hp_all_reduce(&us, &r, 1, HP_I64, HP_MAX, w, NULL);
    return (double)r * 1e-6;
}

/* "training": a busy loop of about ms milliseconds of arithmetic */
static volatile double sink;
static void compute(double ms) {
    double t0 = hp_clock_now_seconds(), x = 1.0;
    while ((hp_clock_now_seconds() - t0) * 1e3 < ms)
        for (int i = 0; i < 10000; i++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

int main(int argc, char **argv) {
    hp_comm_t w;
    if (hp_comm_init(&argc, &argv, &w) != HP_OK) return 1;
    int rank = hp_comm_rank(w), ws = hp_comm_size(w);
    const char *base = "/tmp";
    int mib = 64, reps = 3;
    double step_ms = 50;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--dir")) base = argv[++i];
        else if (!strcmp(argv[i], "--mib")) mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--step-ms")) step_ms = atof(argv[++i]);
    }
    char root[512];
    snprintf(root, sizeof root, "%s/hp_bench_ckpt_%d", base, 0);
    if (rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
        if (system(cmd) != 0) return 1;
    }
    hp_barrier(w, NULL);
    /* state: 8 tensors, Shard(0) over all ranks, mib MiB per rank in total */
    enum { NT = 8 };
    int64_t cols = 1024, rows = (int64_t)mib * 1024 * 1024 / 4 / cols / NT * ws;
    hp_mesh_t m;
    hp_mesh_from_comm(w, "dp", &m);
    hp_dtensor_t d[NT];
    hp_dcp_tensor_t ts[NT];
    char names[NT][32];
    hp_placement_t s0 = hp_shard(0);
    size_t local_bytes = 0;
    for (int k = 0; k < NT; k++) {
        int64_t sh[2] = {rows, cols};
        int64_t ls[2], off[2];
        hp_dtensor_compute_local_shape_and_offset(ls, off, 2, sh, m, 1, &s0);
        hp_tensor_t loc;
        hp_tensor_malloc(&loc, HP_F32, 2, ls);
        float *p = loc.data;
        for (int64_t i = 0; i < ls[0] * ls[1]; i++) p[i] = (float)(i % 977) * 0.25f + (float)k;
        hp_dtensor_from_local(&d[k], &loc, m, 1, &s0, sh);
        snprintf(names[k], sizeof names[k], "layers.%d.weight", k);
        ts[k] = (hp_dcp_tensor_t){names[k], &d[k], -1, 0};
        local_bytes += hp_tensor_nbytes(&loc);
    }
    hp_dcp_state_t st = {ts, NT, NULL, 0};
    double total_mb = (double)local_bytes * ws / 1e6;
    if (rank == 0)
        printf("checkpoint bench: %d rank(s), %.1f MB per rank (%.1f MB total), dir %s, %d reps\n", ws,
               local_bytes / 1e6, total_mb, base, reps);
    double best_raw = 1e30, best_save = 1e30, best_load = 1e30;
    char path[700];
    for (int r = 0; r < reps; r++) {
        snprintf(path, sizeof path, "%s/raw_%d.bin", root, rank);
        /* raw write of the same byte count (all tensors back to back) */
        hp_barrier(w, NULL);
        double t0 = hp_clock_now_seconds();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            perror(path);
            return 1;
        }
        for (int k = 0; k < NT; k++) {
            size_t n = hp_tensor_nbytes(&d[k].local), done = 0;
            while (done < n) {
                ssize_t wr = write(fd, (const char *)d[k].local.data + done, n - done);
                if (wr <= 0) break;
                done += (size_t)wr;
            }
        }
        if (fsync(fd) != 0) perror("fsync");
        close(fd);
        double raw = max_us(w, hp_clock_now_seconds() - t0);
        unlink(path);
        if (raw < best_raw) best_raw = raw;
        /* sync save */
        char dir[700];
        snprintf(dir, sizeof dir, "%s/step-%d", root, r + 1);
        hp_barrier(w, NULL);
        t0 = hp_clock_now_seconds();
        if (hp_dcp_save(dir, &st, w) != HP_OK) {
            fprintf(stderr, "save: %s\n", hp_last_error());
            return 1;
        }
        double sv = max_us(w, hp_clock_now_seconds() - t0);
        if (sv < best_save) best_save = sv;
        /* load */
        hp_barrier(w, NULL);
        t0 = hp_clock_now_seconds();
        if (hp_dcp_load(dir, &st, w, NULL) != HP_OK) {
            fprintf(stderr, "load: %s\n", hp_last_error());
            return 1;
        }
        double ld = max_us(w, hp_clock_now_seconds() - t0);
        if (ld < best_load) best_load = ld;
        if (rank == 0) {
            char cmd[1600];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            if (system(cmd) != 0) return 1;
        }
    }
    if (rank == 0) {
        printf("raw write+fsync : %8.1f MB/s aggregate (%.3f s)\n", total_mb / best_raw, best_raw);
        printf("dcp save (sync) : %8.1f MB/s aggregate (%.3f s) = %.0f%% of raw\n", total_mb / best_save, best_save,
               100.0 * best_raw / best_save);
        printf("dcp load        : %8.1f MB/s aggregate (%.3f s) (files just written: page cache)\n", total_mb / best_load,
               best_load);
    }
    /* blocked time: sync save vs async save (staging + per-step commit polls) while steps run */
    hp_dcp_saver_t sv;
    hp_dcp_saver_create(w, &sv);
    double sync_block = 1e30, async_block = 1e30, async_commit = 0, async_stage = 0, async_last = 0;
    int steps_overlapped = 0;
    for (int r = 0; r < reps; r++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/sync-%d", root, r);
        hp_barrier(w, NULL);
        double t0 = hp_clock_now_seconds();
        hp_dcp_save(dir, &st, w);
        double sb = max_us(w, hp_clock_now_seconds() - t0);
        if (sb < sync_block) sync_block = sb;
        snprintf(dir, sizeof dir, "%s/async-%d", root, r);
        hp_barrier(w, NULL);
        double blocked = 0, start = hp_clock_now_seconds();
        t0 = hp_clock_now_seconds();
        if (hp_dcp_saver_save(sv, dir, &st) != HP_OK) {
            fprintf(stderr, "async save: %s\n", hp_last_error());
            return 1;
        }
        double stage = hp_clock_now_seconds() - t0, last_poll = 0;
        blocked += stage;
        int committed = 0, n = 0;
        while (!committed) {
            compute(step_ms);
            n++;
            hp_barrier(w, NULL);   /* a real step ends with the gradient all-reduce: ranks are in step */
            t0 = hp_clock_now_seconds();
            hp_dcp_saver_poll(sv, &committed);
            last_poll = hp_clock_now_seconds() - t0;
            blocked += last_poll;
        }
        double ab = max_us(w, blocked), commit = max_us(w, hp_clock_now_seconds() - start);
        stage = max_us(w, stage);
        last_poll = max_us(w, last_poll);
        if (ab < async_block) {
            async_block = ab;
            async_stage = stage;
            async_last = last_poll;
            async_commit = commit;
            steps_overlapped = n;
        }
        if (rank == 0) {
            char cmd[3200];
            snprintf(cmd, sizeof cmd, "rm -rf %s/sync-%d %s/async-%d", root, r, root, r);
            if (system(cmd) != 0) return 1;
        }
    }
    hp_dcp_saver_destroy(sv);
    if (rank == 0) {
        printf("training blocked: sync save %.3f s; async save %.3f s (staging %.3f s + polls, the committing "
               "one %.3f s), committed after %d steps of %.0f ms (%.3f s)\n", sync_block, async_block, async_stage,
               async_last, steps_overlapped, step_ms, async_commit);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        if (system(cmd) != 0) return 1;
    }
    for (int k = 0; k < NT; k++) free(d[k].local.data);
    hp_mesh_destroy(m);
    hp_comm_finalize();
    return 0;
}
