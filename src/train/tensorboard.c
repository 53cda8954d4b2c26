/* TensorBoard event files without protobuf or TensorFlow: TFRecord framing
 *   uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
 * (all little-endian) around hand-encoded Event protobufs:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 * and a reader of the same that checks every CRC. */
#include "hyperparallel/metrics.h"
#include "hyperparallel/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- CRC-32C ------------------------------------------------------------------------------ */

static uint32_t crc_table_[256];
static int crc_ready_ = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;   /* reflected Castagnoli */
        crc_table_[i] = c;
    }
    __atomic_store_n(&crc_ready_, 1, __ATOMIC_RELEASE);
}

uint32_t hp_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!__atomic_load_n(&crc_ready_, __ATOMIC_ACQUIRE)) crc_init();   /* idempotent: a race writes the same table */
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table_[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t hp_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf encoding ------------------------------------------------------------------ */

typedef struct pb {
    unsigned char *p;
    size_t n, cap;
    bool overflow;
} pb_t;

static void pb_byte(pb_t *b, unsigned char c) {
    if (b->n < b->cap) b->p[b->n] = c;
    else b->overflow = true;
    b->n++;
}
static void pb_varint(pb_t *b, uint64_t v) {
    while (v >= 0x80) {
        pb_byte(b, (unsigned char)(v | 0x80));
        v >>= 7;
    }
    pb_byte(b, (unsigned char)v);
}
static void pb_fixed(pb_t *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) pb_byte(b, (unsigned char)(v >> (8 * i)));
}
static void pb_bytes(pb_t *b, int field, const void *s, size_t n) {
    pb_varint(b, (uint64_t)(field << 3 | 2));
    pb_varint(b, n);
    for (size_t i = 0; i < n; i++) pb_byte(b, ((const unsigned char *)s)[i]);
}
static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

/* Encodes an Event into buf; returns its size (> cap means it did not fit). */
static size_t encode_event(unsigned char *buf, size_t cap, double wall_time, int64_t step, const char *file_version,
                           const char *tag, float value) {
    pb_t b = {buf, 0, cap, false};
    uint64_t wt;
    memcpy(&wt, &wall_time, sizeof wt);
    pb_varint(&b, 1 << 3 | 1);
    pb_fixed(&b, wt, 8);
    if (step != 0) {
        pb_varint(&b, 2 << 3 | 0);
        pb_varint(&b, (uint64_t)step);
    }
    if (file_version) {
        pb_bytes(&b, 3, file_version, strlen(file_version));
    } else {
        size_t tl = strlen(tag);
        size_t value_len = 1 + varint_len(tl) + tl + 1 + 4;          /* Value{tag, simple_value} */
        size_t summary_len = 1 + varint_len(value_len) + value_len;   /* Summary{value} */
        pb_varint(&b, 5 << 3 | 2);
        pb_varint(&b, summary_len);
        pb_varint(&b, 1 << 3 | 2);
        pb_varint(&b, value_len);
        pb_bytes(&b, 1, tag, tl);
        uint32_t fv;
        memcpy(&fv, &value, sizeof fv);
        pb_varint(&b, 2 << 3 | 5);
        pb_fixed(&b, fv, 4);
    }
    return b.n;
}

/* ---- writer --------------------------------------------------------------------------- */

struct hp_tb_writer {
    FILE *f;
    char path[4096];
};

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static hp_status_t write_record(hp_tb_writer_t w, const unsigned char *data, size_t n) {
    unsigned char head[12], tail[4];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    uint32_t hc = hp_crc32c_mask(hp_crc32c(0, head, 8));
    uint32_t dc = hp_crc32c_mask(hp_crc32c(0, data, n));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(hc >> (8 * i)), tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(data, 1, n, w->f) != n || fwrite(tail, 1, 4, w->f) != 4)
        return hp_error(HP_ERR_IO, "TensorBoard file '%s': write failed (%s)", w->path, strerror(errno));
    return HP_OK;
}

hp_status_t hp_tb_writer_open(const char *dir, const char *tag, hp_tb_writer_t *out) {
    if (!dir || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_tb_writer_open: NULL argument");
    *out = NULL;
    HP_TRY(hp_file_mkdirs(dir));
    hp_tb_writer_t w = hp_calloc(1, sizeof *w);
    if (!w) return hp_error(HP_ERR_OOM, "TensorBoard writer: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d%s%s", dir, (long long)now_s(), host,
             (int)getpid(), tag && *tag ? "." : "", tag && *tag ? tag : "");
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        hp_status_t st = hp_error(HP_ERR_IO, "TensorBoard file '%s': cannot create (%s)", w->path, strerror(errno));
        free(w);
        return st;
    }
    unsigned char buf[128];
    size_t n = encode_event(buf, sizeof buf, now_s(), 0, "brain.Event:2", NULL, 0);
    hp_status_t st = write_record(w, buf, n);
    if (st == HP_OK) st = hp_tb_writer_flush(w);
    if (st != HP_OK) {
        hp_tb_writer_close(w);
        return st;
    }
    *out = w;
    return HP_OK;
}

hp_status_t hp_tb_writer_add_scalar(hp_tb_writer_t w, const char *tag, int64_t step, float value, double wall_time) {
    if (!w || !tag) return hp_error(HP_ERR_INVALID_ARG, "hp_tb_writer_add_scalar: NULL argument");
    if (strlen(tag) >= HP_TB_TAG_MAX)
        return hp_error(HP_ERR_INVALID_ARG, "TensorBoard tag '%.40s...' is longer than %d bytes", tag, HP_TB_TAG_MAX - 1);
    unsigned char buf[HP_TB_TAG_MAX + 64];
    size_t n = encode_event(buf, sizeof buf, wall_time < 0 ? now_s() : wall_time, step, NULL, tag, value);
    HP_ASSERT(n <= sizeof buf);
    return write_record(w, buf, n);
}

hp_status_t hp_tb_writer_flush(hp_tb_writer_t w) {
    if (fflush(w->f) != 0) return hp_error(HP_ERR_IO, "TensorBoard file '%s': flush failed (%s)", w->path, strerror(errno));
    return HP_OK;
}

const char *hp_tb_writer_path(hp_tb_writer_t w) { return w ? w->path : NULL; }

void hp_tb_writer_close(hp_tb_writer_t w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}

/* ---- reader --------------------------------------------------------------------------- */

typedef struct rd {
    const unsigned char *p, *end;
} rd_t;

static bool rd_varint(rd_t *r, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return false;
        unsigned char c = *r->p++;
        *v |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) return true;
    }
    return false;
}

/* Reads a field header and, for wire types 1/2/5, its payload span. */
static bool rd_field(rd_t *r, int *field, int *wire, uint64_t *v, rd_t *sub) {
    uint64_t key;
    if (!rd_varint(r, &key)) return false;
    *field = (int)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0: return rd_varint(r, v);
    case 1:
    case 5: {
        size_t n = *wire == 1 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return false;
        *v = 0;
        for (size_t i = 0; i < n; i++) *v |= (uint64_t)r->p[i] << (8 * i);
        r->p += n;
        return true;
    }
    case 2: {
        uint64_t n;
        if (!rd_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return false;
        sub->p = r->p;
        sub->end = r->p + n;
        r->p += n;
        return true;
    }
    default: return false;   /* groups (3, 4) are not used by Event */
    }
}

static bool decode_value(rd_t r, hp_tb_event_t *ev) {
    char tag[HP_TB_TAG_MAX] = "";
    bool has_simple = false;
    float value = 0;
    while (r.p < r.end) {
        int field, wire;
        uint64_t v = 0;
        rd_t sub = {0, 0};
        if (!rd_field(&r, &field, &wire, &v, &sub)) return false;
        if (field == 1 && wire == 2) {
            size_t n = (size_t)(sub.end - sub.p);
            if (n >= sizeof tag) n = sizeof tag - 1;
            memcpy(tag, sub.p, n);
            tag[n] = '\0';
        } else if (field == 2 && wire == 5) {
            uint32_t u = (uint32_t)v;
            memcpy(&value, &u, sizeof value);
            has_simple = true;
        }
    }
    if (has_simple && ev->n_values < HP_TB_MAX_VALUES) {
        snprintf(ev->values[ev->n_values].tag, HP_TB_TAG_MAX, "%s", tag);
        ev->values[ev->n_values].value = value;
        ev->n_values++;
    }
    return true;
}

static bool decode_event(rd_t r, hp_tb_event_t *ev) {
    memset(ev, 0, sizeof *ev);
    while (r.p < r.end) {
        int field, wire;
        uint64_t v = 0;
        rd_t sub = {0, 0};
        if (!rd_field(&r, &field, &wire, &v, &sub)) return false;
        if (field == 1 && wire == 1) {
            memcpy(&ev->wall_time, &v, sizeof ev->wall_time);
        } else if (field == 2 && wire == 0) {
            ev->step = (int64_t)v;
        } else if (field == 3 && wire == 2) {
            size_t n = (size_t)(sub.end - sub.p);
            if (n >= sizeof ev->file_version) n = sizeof ev->file_version - 1;
            memcpy(ev->file_version, sub.p, n);
            ev->file_version[n] = '\0';
        } else if (field == 5 && wire == 2) {
            while (sub.p < sub.end) {
                int f2, w2;
                uint64_t v2;
                rd_t val = {0, 0};
                if (!rd_field(&sub, &f2, &w2, &v2, &val)) return false;
                if (f2 == 1 && w2 == 2 && !decode_value(val, ev)) return false;
            }
        }
    }
    return true;
}

hp_status_t hp_tb_read_file(const char *path, hp_tb_event_fn fn, void *ctx) {
    FILE *f = fopen(path, "rb");
    if (!f) return hp_error(HP_ERR_IO, "TensorBoard file '%s': cannot open (%s)", path, strerror(errno));
    hp_status_t st = HP_OK;
    unsigned char *data = NULL;
    size_t cap = 0;
    long offset = 0;
    for (int64_t rec = 0;; rec++) {
        unsigned char head[12];
        size_t got = fread(head, 1, 12, f);
        if (got == 0 && feof(f)) break;
        if (got != 12) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: truncated header (%zu of 12 bytes)",
                          path, (long long)rec, offset, got);
            break;
        }
        uint64_t len = 0;
        uint32_t hc = 0, dc = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
        for (int i = 0; i < 4; i++) hc |= (uint32_t)head[8 + i] << (8 * i);
        if (hp_crc32c_mask(hp_crc32c(0, head, 8)) != hc) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: length CRC mismatch", path,
                          (long long)rec, offset);
            break;
        }
        if (len > (1u << 30)) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: length %llu is implausible", path,
                          (long long)rec, offset, (unsigned long long)len);
            break;
        }
        if (len + 4 > cap) {
            cap = (size_t)len + 4;
            unsigned char *nd = realloc(data, cap);
            if (!nd) {
                st = hp_error(HP_ERR_OOM, "TensorBoard reader: out of memory for a %llu-byte record", (unsigned long long)len);
                break;
            }
            data = nd;
        }
        if (fread(data, 1, (size_t)len + 4, f) != (size_t)len + 4) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: truncated data (%llu bytes expected)",
                          path, (long long)rec, offset, (unsigned long long)len + 4);
            break;
        }
        for (int i = 0; i < 4; i++) dc |= (uint32_t)data[len + (uint64_t)i] << (8 * i);
        if (hp_crc32c_mask(hp_crc32c(0, data, (size_t)len)) != dc) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: data CRC mismatch", path,
                          (long long)rec, offset);
            break;
        }
        hp_tb_event_t ev;
        if (!decode_event((rd_t){data, data + len}, &ev)) {
            st = hp_error(HP_ERR_FORMAT, "TensorBoard file '%s': record %lld at offset %ld: malformed Event protobuf", path,
                          (long long)rec, offset);
            break;
        }
        if (fn) {
            st = fn(ctx, &ev);
            if (st != HP_OK) break;
        }
        offset += (long)(12 + len + 4);
    }
    free(data);
    fclose(f);
    return st;
}
