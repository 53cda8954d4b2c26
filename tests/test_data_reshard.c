/* The data loader's rule for a resume with another data-parallel degree (an elastic restart
 * on fewer or more hosts; hp_dataloader_state_reshard, docs/data.md): no window of an
 * interrupted pass is repeated or skipped. Old dp ranks (4) read different amounts, their
 * states are resharded into 2 (and 3) new ranks, and each new rank's token stream must be
 * exactly the unread rest of the old ranks' passes it took (q, q + Q, ...) followed by a fresh
 * pass over its own new shard; resharded states (version 2, with carried ranges) reshard
 * again; text (documents, a buffer carried) and bin (token ranges, tails skipped) alike. Chat
 * (SFT) data is resharded by documents: every conversation an old rank had not placed in a row
 * (its pending one included) is placed once, in order, by the new rank that took it. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/chat_template.h"
#include "hyperparallel/data.h"

enum { NDOCS = 61, T = 7, W = T + 1, BIN_TOKENS = 1999, MAXS = 1 << 16 };

static char dir_[] = "/tmp/hp_test_data_reshard_XXXXXX";
static char docs_[NDOCS][96];

static void write_file(const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    FILE *f = fopen(path, "wb");
    HP_ASSERT(f && fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* The contiguous shard [b, e) of rank r of w over n items (hp_dataloader_create's rule). */
static void shard(int64_t n, int r, int w, int64_t *b, int64_t *e) {
    int64_t div = n / w, mod = n % w;
    *b = div * r + (r < mod ? r : mod);
    *e = *b + div + (r < mod ? 1 : 0);
}

/* The token stream of one pass over [b, e): BOS + bytes + EOS per document (text), or the
 * token ids themselves (bin: token i has id i), whole windows only per range for bin. */
static size_t pass_stream(int bin, int64_t b, int64_t e, int32_t *out) {
    size_t n = 0;
    if (bin) {
        for (int64_t i = b; i + W <= e; i += W)
            for (int64_t t = 0; t < W; t++) out[n++] = (int32_t)(i + t);
        return n;
    }
    for (int64_t d = b; d < e; d++) {
        out[n++] = 256;
        for (const char *c = docs_[d]; *c; c++) out[n++] = (unsigned char)*c;
        out[n++] = 257;
    }
    return n;
}

static hp_dataloader_t make(hp_dataset_t ds, int r, int w) {
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_options_t o = {HP_SPLIT_TRAIN, T, 1, r, w, true, 0};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create(ds, &enc, &o, &dl));
    return dl;
}

/* Reads k windows, appending them (W tokens each) to s[*n]. */
static void read_windows(hp_dataloader_t dl, int k, int32_t *s, size_t *n) {
    int32_t in[T], lab[T];
    for (int i = 0; i < k; i++) {
        bool got = false;
        HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
        HP_ASSERT(got);
        memcpy(s + *n, in, sizeof in);
        s[*n + T] = lab[T - 1];
        *n += W;
    }
}

static size_t save(hp_dataloader_t dl, unsigned char *blob) {
    size_t n = 0;
    HP_CHECK_OK(hp_dataloader_state_save(dl, blob, hp_dataloader_state_size(dl), &n));
    return n;
}

/* Compares the first n tokens of got with want. */
static void same(const int32_t *got, const int32_t *want, size_t n, const char *what) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want[i]) bad = i;
    HP_CHECK(bad == n, "%s: token %zu of %zu differs (got %d, expected %d)", what, bad, n, bad < n ? got[bad] : 0,
             bad < n ? want[bad] : 0);
}

/* The buffered-token count of a state blob (the documented layout: magic, version, split, dp
 * rank, dp world as u32, then seq_len, split size, position, epoch, samples, epoch tokens and
 * the buffered count as u64). */
static size_t nbuf_of(const unsigned char *blob) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)blob[4 + 4 * 4 + 8 * 6 + i] << (8 * i);
    return (size_t)v;
}

/* What a rank that takes states 0..m-1 (rest[i][len[i]] each still owed, the first nbuf[i]
 * of them buffered) reads first: every buffered part in order, then every unread range. */
static size_t carried(int m, int32_t *const *rest, const size_t *len, const size_t *nbuf, int32_t *out) {
    size_t n = 0;
    for (int i = 0; i < m; i++) memcpy(out + n, rest[i], nbuf[i] * sizeof *out), n += nbuf[i];
    for (int i = 0; i < m; i++) memcpy(out + n, rest[i] + nbuf[i], (len[i] - nbuf[i]) * sizeof *out), n += len[i] - nbuf[i];
    return n;
}

static void run(const char *file, const char *format, int bin) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, file);
    hp_dataset_options_t opt = {path, format, "line", NULL, "uint32", 0};
    hp_dataset_t ds = NULL;
    HP_CHECK_OK(hp_dataset_open(&opt, &ds));
    int64_t n = hp_dataset_num_documents(ds, HP_SPLIT_TRAIN);
    enum { P = 4 };
    static int32_t rest[P][MAXS], tmp[MAXS];
    static unsigned char blobs[P][MAXS];
    size_t rlen[P], bsz[P], nb[P];
    /* old ranks read different amounts (rank 1 wraps into its second pass, rank 2 reads none) */
    int k[P] = {3, -1, 0, 7};   /* -1: a pass and 3 windows */
    int64_t max_epoch = 0;
    for (int r = 0; r < P; r++) {
        int64_t b, e;
        shard(n, r, P, &b, &e);
        static int32_t pass[MAXS];
        size_t plen = pass_stream(bin, b, e, pass);
        hp_dataloader_t dl = make(ds, r, P);
        if (k[r] < 0) k[r] = (int)(plen / W) + 3;
        size_t got = 0;
        read_windows(dl, k[r], tmp, &got);
        int64_t ep = hp_dataloader_epoch(dl);
        if (ep > max_epoch) max_epoch = ep;
        /* its passes are one stream, pass after pass: what it still owes of its current pass */
        size_t end = plen * (size_t)(ep + 1);
        HP_CHECK(got <= end, "%s: old rank %d consumed %zu tokens in pass %lld of %zu", format, r, got, (long long)ep, plen);
        rlen[r] = 0;
        for (size_t i = got; i < end; i++) rest[r][rlen[r]++] = pass[i % plen];
        bsz[r] = save(dl, blobs[r]);
        nb[r] = nbuf_of(blobs[r]);
        hp_dataloader_destroy(dl);
    }
    HP_CHECK(max_epoch == 1, "%s: old rank 1 should be in its second pass (max epoch %lld)", format, (long long)max_epoch);
    const void *bp[P] = {blobs[0], blobs[1], blobs[2], blobs[3]};

    for (int Q = 2; Q <= 3; Q++) {
        static unsigned char mid[3][MAXS];
        size_t msz[3], mlen[3], mnb[3];
        static int32_t mrest[3][MAXS];   /* what each new rank still owes of the carried passes */
        for (int q = 0; q < Q; q++) {
            hp_dataloader_t dl = make(ds, q, Q);
            HP_CHECK_OK(hp_dataloader_state_reshard(dl, bp, bsz, P));
            int32_t *rs[P];
            size_t ls[P], bs[P];
            int m = 0;
            int64_t expect_samples = 0;
            for (int r = q; r < P; r += Q) rs[m] = rest[r], ls[m] = rlen[r], bs[m] = nb[r], m++, expect_samples += k[r];
            static int32_t want[MAXS];
            size_t wl = carried(m, rs, ls, bs, want);
            int64_t b, e;
            shard(n, q, Q, &b, &e);
            size_t fl = pass_stream(bin, b, e, want + wl);   /* then a fresh pass over its new shard */
            HP_CHECK(hp_dataloader_samples(dl) == expect_samples, "%s Q=%d rank %d: samples %lld, expected %lld", format,
                     Q, q, (long long)hp_dataloader_samples(dl), (long long)expect_samples);
            /* half of the carried windows, a checkpoint (version 2), the rest */
            static int32_t s[MAXS];
            size_t sl = 0;
            int half = (int)(wl / W / 2), total = (int)((wl + fl) / W);
            read_windows(dl, half, s, &sl);
            msz[q] = save(dl, mid[q]);
            mnb[q] = nbuf_of(mid[q]);
            mlen[q] = wl - sl;
            memcpy(mrest[q], want + sl, mlen[q] * sizeof *want);
            HP_CHECK(hp_dataloader_epoch(dl) == max_epoch, "%s Q=%d rank %d: epoch %lld while carrying", format, Q, q,
                     (long long)hp_dataloader_epoch(dl));
            read_windows(dl, total - half, s, &sl);
            same(s, want, sl, format);
            HP_CHECK(fl == 0 || hp_dataloader_epoch(dl) == max_epoch + 1, "%s Q=%d rank %d: epoch %lld after the "
                     "carried ranges, expected %lld", format, Q, q, (long long)hp_dataloader_epoch(dl),
                     (long long)max_epoch + 1);
            /* the mid-carry checkpoint loads at the same degree and continues identically */
            hp_dataloader_t again = make(ds, q, Q);
            HP_CHECK_OK(hp_dataloader_state_load(again, mid[q], msz[q]));
            static int32_t s2[MAXS];
            size_t s2l = 0;
            read_windows(again, total - half, s2, &s2l);
            same(s2, s + (size_t)half * W, s2l, "reload of a carrying state");
            hp_dataloader_destroy(again);
            hp_dataloader_destroy(dl);
        }
        /* the mid-carry states resharded again, into one rank: it finishes them all */
        const void *mp[3] = {mid[0], mid[1], mid[2]};
        hp_dataloader_t one = make(ds, 0, 1);
        HP_CHECK_OK(hp_dataloader_state_reshard(one, mp, msz, Q));
        int32_t *rs[3] = {mrest[0], mrest[1], mrest[2]};
        static int32_t want1[MAXS], s1[MAXS];
        size_t wl1 = carried(Q, rs, mlen, mnb, want1), s1l = 0;
        read_windows(one, (int)(wl1 / W), s1, &s1l);
        same(s1, want1, s1l, "a resharded state resharded again");
        hp_dataloader_destroy(one);
    }

    /* refusals: states of mixed degrees, a state of another degree loaded plainly, another seq_len */
    hp_dataloader_t dl = make(ds, 0, 2);
    size_t two[2] = {bsz[0], bsz[1]};
    HP_CHECK_ERR(hp_dataloader_state_reshard(dl, bp, two, 2), HP_ERR_INVALID_ARG, "was saved by dp rank 0 of 4");
    HP_CHECK_ERR(hp_dataloader_state_load(dl, blobs[0], bsz[0]), HP_ERR_INVALID_ARG, "hp_dataloader_state_reshard");
    hp_dataloader_destroy(dl);
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_options_t o = {HP_SPLIT_TRAIN, T + 1, 1, 0, 2, true, 0};
    HP_CHECK_OK(hp_dataloader_create(ds, &enc, &o, &dl));
    HP_CHECK_ERR(hp_dataloader_state_reshard(dl, bp, bsz, P), HP_ERR_INVALID_ARG, "seq_len");
    hp_dataloader_destroy(dl);
    hp_dataset_close(ds);
    printf("%s: 4 old ranks resharded into 2 and 3, and again into 1: every carried token once, in order\n", format);
}

/* ---- chat (SFT) data: rows of whole samples, resharded by documents ---------------------- */

enum { NCHAT = 37, CT = 200, CB = 2, PAD = 0 };   /* CT fits two short samples a row, not three */

static hp_chat_template_t tm_;
static int32_t chat_in_[NCHAT][CT];   /* each conversation's standalone inputs (ids[:-1]) */
static size_t chat_n_[NCHAT];

static hp_dataloader_t make_chat(hp_dataset_t ds, int r, int w) {
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_options_t o = {HP_SPLIT_TRAIN, CT, CB, r, w, true, 0};
    hp_sft_options_t so = {tm_, PAD, true, HP_SFT_TRUNCATE};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create_sft(ds, &enc, &o, &so, &dl));
    return dl;
}

/* One batch as the documents it placed, in order (positions restart at 0 with each sample; the
 * padding, id PAD, which no rendered byte is, ends a row). Appends to docs[*nd]. Returns false
 * when the loader had no further batch. */
static bool chat_batch(hp_dataloader_t dl, int *docs, size_t *nd, int32_t *rows) {
    static int32_t lab[CB * CT], pos[CB * CT];
    bool got = false;
    HP_CHECK_OK(hp_dataloader_next_docs(dl, rows, lab, pos, &got));
    if (!got) return false;
    for (int b = 0; b < CB; b++) {
        const int32_t *in = rows + b * CT, *ps = pos + b * CT;
        for (int t = 0; t < CT && in[t] != PAD;) {
            int e = t + 1;
            while (e < CT && ps[e] != 0) e++;
            int d = -1;
            for (int k = 0; k < NCHAT && d < 0; k++)
                if (chat_n_[k] == (size_t)(e - t) && memcmp(chat_in_[k], in + t, chat_n_[k] * sizeof *in) == 0) d = k;
            HP_CHECK(ps[t] == 0 && d >= 0, "chat: row %d holds a sample at %d..%d that is no conversation of the file",
                     b, t, e);
            if (d < 0) return false;
            docs[(*nd)++] = d;
            t = e;
        }
    }
    return true;
}

static void same_docs(const int *got, const int *want, size_t n, const char *what) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want[i]) bad = i;
    HP_CHECK(bad == n, "chat %s: sample %zu of %zu is conversation %d, expected %d", what, bad, n, bad < n ? got[bad] : 0,
             bad < n ? want[bad] : 0);
}

static void run_chat(void) {
    static char text[NCHAT * 200];
    size_t tl = 0;
    for (int d = 0; d < NCHAT; d++) {
        tl += (size_t)snprintf(text + tl, sizeof text - tl,
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"question %d%.*s\"}, "
                               "{\"role\": \"assistant\", \"content\": \"answer %d\"}]}\n",
                               d, 3 * (d % 5), " xx xx xx xx xx", d);
    }
    write_file("chat.jsonl", text, tl);
    HP_CHECK_OK(hp_chat_template_create("chatml", NULL, NULL, &tm_));
    char path[512];
    snprintf(path, sizeof path, "%s/chat.jsonl", dir_);
    hp_dataset_options_t opt = {path, "chat", NULL, NULL, NULL, 0};
    hp_dataset_t ds = NULL;
    HP_CHECK_OK(hp_dataset_open(&opt, &ds));
    HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_TRAIN) == NCHAT, "chat: %lld conversations",
             (long long)hp_dataset_num_documents(ds, HP_SPLIT_TRAIN));
    /* each conversation's standalone inputs: what its copy in a row must equal */
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_chat_sample_t smp = {0};
    hp_chat_render_t rnd = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t cap = 0;
    for (int d = 0; d < NCHAT; d++) {
        const char *line;
        size_t len, n = 0;
        HP_CHECK_OK(hp_dataset_document(ds, HP_SPLIT_TRAIN, d, &line, &len));
        HP_CHECK_OK(hp_chat_sample_parse(line, len, "", true, &smp));
        HP_CHECK_OK(hp_chat_template_render(tm_, smp.m, smp.n, smp.first_trained, false, &rnd));
        HP_CHECK_OK(hp_chat_tokenize(&rnd, &enc, &ids, &mask, &n, &cap));
        HP_ASSERT(n >= 2 && 2 * (n - 1) <= CT && 3 * (n - 1) > CT);   /* two a row, never three: rows leave samples pending */
        chat_n_[d] = n - 1;
        for (size_t j = 0; j + 1 < n; j++) chat_in_[d][j] = ids[j];
    }
    hp_chat_sample_free(&smp);
    hp_chat_render_free(&rnd);
    free(ids);
    free(mask);

    enum { P = 4, MAXD = 4 * NCHAT };
    static int32_t rows[CB * CT], rows2[CB * CT];
    static unsigned char blobs[P][MAXS];
    static int owed[P][NCHAT];
    size_t nowed[P], bsz[P];
    int kb[P] = {1, -1, 0, 2};   /* batches read; -1: into its second pass */
    int64_t max_epoch = 0, samples[P];
    int pending_seen = 0;
    for (int r = 0; r < P; r++) {
        int64_t b, e;
        shard(NCHAT, r, P, &b, &e);
        hp_dataloader_t dl = make_chat(ds, r, P);
        static int placed[MAXD];
        size_t np = 0;
        for (int i = 0; kb[r] < 0 ? hp_dataloader_epoch(dl) < 1 : i < kb[r]; i++) HP_ASSERT(chat_batch(dl, placed, &np, rows));
        int64_t ep = hp_dataloader_epoch(dl), len = e - b;
        if (ep > max_epoch) max_epoch = ep;
        for (size_t i = 0; i < np; i++)
            HP_CHECK(placed[i] == b + (int64_t)i % len, "chat: old rank %d placed %d as its sample %zu", r, placed[i], i);
        /* what it owes of its current pass: the documents after the last one placed (a pending
         * sample, read but not placed, is owed) */
        int64_t from = (int64_t)np - ep * len;
        HP_CHECK(from >= 0 && from <= len, "chat: old rank %d placed %zu samples in pass %lld of %lld", r, np,
                 (long long)ep, (long long)len);
        nowed[r] = 0;
        for (int64_t d = b + from; d < e; d++) owed[r][nowed[r]++] = (int)d;
        bsz[r] = save(dl, blobs[r]);
        samples[r] = hp_dataloader_samples(dl);
        /* the state reloads to the rows the live loader goes on with: a row of two samples is
         * closed by reading a third that does not fit, so every rank that read a batch saved
         * with that sample pending, and the reload must read it again */
        hp_dataloader_t probe = make_chat(ds, r, P);
        HP_CHECK_OK(hp_dataloader_state_load(probe, blobs[r], bsz[r]));
        static int next1[MAXD], next2[MAXD];
        size_t n1 = 0, n2 = 0;
        HP_ASSERT(chat_batch(probe, next1, &n1, rows));
        HP_ASSERT(chat_batch(dl, next2, &n2, rows2));
        HP_CHECK(n1 > 0 && next1[0] == (nowed[r] ? owed[r][0] : b) && memcmp(rows, rows2, sizeof rows) == 0,
                 "chat: old rank %d's state resumes at %d, not as the live loader", r, n1 ? next1[0] : -1);
        pending_seen += kb[r] != 0;
        hp_dataloader_destroy(probe);
        hp_dataloader_destroy(dl);
    }
    HP_CHECK(max_epoch == 1 && pending_seen > 0, "chat: max epoch %lld (expected 1), %d old ranks with a pending sample",
             (long long)max_epoch, pending_seen);
    const void *bp[P] = {blobs[0], blobs[1], blobs[2], blobs[3]};

    for (int Q = 2; Q <= 3; Q++) {
        static unsigned char mid[3][MAXS];
        size_t msz[3];
        static int mowed[3][MAXD];
        size_t nmowed[3];
        for (int q = 0; q < Q; q++) {
            hp_dataloader_t dl = make_chat(ds, q, Q);
            HP_CHECK_OK(hp_dataloader_state_reshard(dl, bp, bsz, P));
            static int want[MAXD], got[MAXD];
            size_t wl = 0, gl = 0;
            int64_t expect_samples = 0;
            for (int r = q; r < P; r += Q) {
                memcpy(want + wl, owed[r], nowed[r] * sizeof *want);
                wl += nowed[r];
                expect_samples += samples[r];
            }
            size_t carried_n = wl;
            int64_t b, e;
            shard(NCHAT, q, Q, &b, &e);
            for (int64_t d = b; d < e; d++) want[wl++] = (int)d;   /* then a fresh pass over its new shard */
            HP_CHECK(hp_dataloader_samples(dl) == expect_samples, "chat Q=%d rank %d: samples %lld, expected %lld", Q, q,
                     (long long)hp_dataloader_samples(dl), (long long)expect_samples);
            /* about half the carried samples, a checkpoint, the rest; the checkpoint reloads to
             * the same rows */
            while (gl < carried_n / 2) HP_ASSERT(chat_batch(dl, got, &gl, rows));
            msz[q] = save(dl, mid[q]);
            nmowed[q] = 0;
            for (size_t i = gl; i < carried_n; i++) mowed[q][nmowed[q]++] = want[i];
            hp_dataloader_t again = make_chat(ds, q, Q);
            HP_CHECK_OK(hp_dataloader_state_load(again, mid[q], msz[q]));
            while (gl < wl) {
                static int g2[MAXD];
                size_t g2l = 0;
                HP_ASSERT(chat_batch(dl, got, &gl, rows));
                HP_ASSERT(chat_batch(again, g2, &g2l, rows2));
                HP_CHECK(memcmp(rows, rows2, sizeof rows) == 0, "chat Q=%d rank %d: a reloaded carrying state gives "
                         "other rows", Q, q);
            }
            same_docs(got, want, wl, "resharded");
            HP_CHECK(hp_dataloader_epoch(dl) >= max_epoch + 1, "chat Q=%d rank %d: epoch %lld after the carried "
                     "ranges, expected %lld", Q, q, (long long)hp_dataloader_epoch(dl), (long long)max_epoch + 1);
            hp_dataloader_destroy(again);
            hp_dataloader_destroy(dl);
        }
        /* the mid-carry states (each with a sample pending or not) resharded again into one rank */
        const void *mp[3] = {mid[0], mid[1], mid[2]};
        hp_dataloader_t one = make_chat(ds, 0, 1);
        HP_CHECK_OK(hp_dataloader_state_reshard(one, mp, msz, Q));
        static int want1[MAXD], got1[MAXD];
        size_t wl1 = 0, gl1 = 0;
        for (int q = 0; q < Q; q++) memcpy(want1 + wl1, mowed[q], nmowed[q] * sizeof *want1), wl1 += nmowed[q];
        while (gl1 < wl1) HP_ASSERT(chat_batch(one, got1, &gl1, rows));
        same_docs(got1, want1, wl1, "resharded again");
        hp_dataloader_destroy(one);
    }
    hp_dataset_close(ds);
    hp_chat_template_free(tm_);
    printf("chat: 4 old ranks (pending samples among them) resharded into 2 and 3, and again into 1: every "
           "unplaced conversation once, in order\n");
}

int main(void) {
    HP_ASSERT(mkdtemp(dir_));
    static const char *words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"};
    static char text[NDOCS * 100];
    size_t tl = 0;
    for (int d = 0; d < NDOCS; d++) {
        int l = snprintf(docs_[d], sizeof docs_[d], "doc %d", d);
        for (int w = 0; w < d % 7; w++) l += snprintf(docs_[d] + l, sizeof docs_[d] - (size_t)l, " %s", words[(d + w) % 6]);
        tl += (size_t)snprintf(text + tl, sizeof text - tl, "%s\n", docs_[d]);
    }
    write_file("corpus.txt", text, tl);
    static uint32_t ids[BIN_TOKENS];
    for (int i = 0; i < BIN_TOKENS; i++) ids[i] = (uint32_t)i;
    write_file("corpus.bin", ids, sizeof ids);
    run("corpus.txt", "text", 0);
    run("corpus.bin", "bin", 1);
    run_chat();
    hp_test_remove_dir(dir_);
    return hp_test_finish("test_data_reshard");
}
