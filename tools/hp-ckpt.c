/* hp-ckpt: inspect and convert checkpoints (one process; to-hf / from-hf also under mpirun).
 *   hp-ckpt inspect DIR                       DCP step dir (tensors, shapes, chunks, sizes; verifies shard
 *                                             sizes and checksums, exit 1 when bad) or HF dir
 *   hp-ckpt list FOLDER                       committed step-N dirs; a step with a missing or truncated
 *                                             shard is marked INCOMPLETE (exit 1)
 *   hp-ckpt consolidate DIR OUT.safetensors   every tensor (and blob, as U8) of a DCP dir, whole
 *   hp-ckpt to-hf DIR OUT --model M --flavor F [--dtype bf16] [--max-shard-bytes N] [--tokenizer T]
 *                                             [--model.KEY V ...]
 *   hp-ckpt from-hf HFDIR OUT [--model M] [--flavor F [--model.KEY V ...]]   the model from config.json;
 *                                             with --flavor it must agree with config.json
 *   hp-ckpt seed OUT --model M --flavor F --vocab V [--seed S] [--model.KEY V ...]   TorchTitan's seed checkpoint
 *   hp-ckpt merge-lora HFDIR ADAPTER OUT   a PEFT LoRA adapter merged into a plain HF folder (docs/finetune.md)
 * to-hf takes the model shape from the flavor with the model.* overrides of the config
 * (--model.dim 80 ...; hp_config_resolve_model) and the vocabulary from the checkpoint;
 * from-hf takes it from config.json (hp_hf_read_config). */
#define _GNU_SOURCE
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hyperparallel/checkpoint.h>
#include <hyperparallel/comm.h>
#include <hyperparallel/config.h>
#include <hyperparallel/model.h>
#include <hyperparallel/models.h>
#include <hyperparallel/parse.h>
#include <hyperparallel/safetensors.h>
#include <hyperparallel/tokenizer.h>

static int usage(void) {
    char fam[256];   /* the registry's families, as --model takes them */
    size_t l = 0;
    fam[0] = 0;
    for (int i = 0; i < hp_model_spec_count() && l < sizeof fam; i++)
        l += (size_t)snprintf(fam + l, sizeof fam - l, "%s%s", i ? "|" : "", hp_model_spec_at(i)->name);
    fprintf(stderr,
            "usage: hp-ckpt inspect DIR\n"
            "       hp-ckpt list FOLDER\n"
            "       hp-ckpt consolidate DIR OUT.safetensors\n"
            "       hp-ckpt to-hf DIR OUT --model %s --flavor F [--dtype f32|bf16] [--max-shard-bytes N]\n"
            "             [--tokenizer tokenizer.json]   (tokenizer files, generation_config.json, bos/eos/pad ids)\n"
            "       hp-ckpt from-hf HFDIR OUT [--model %s] [--flavor F]   (the model from config.json)\n"
            "       hp-ckpt seed OUT --model %s --flavor F --vocab V [--seed S]\n"
            "       hp-ckpt merge-lora HFDIR ADAPTER OUT   (W + (lora_alpha/r) B A of a PEFT adapter: a plain HF folder)\n"
            "  to-hf, from-hf and seed take the config's model.* overrides of the flavor as flags,\n"
            "  e.g. --model.dim 80 --model.n_heads=5 --model.qk_norm=true (docs/config.md)\n", fam, fam, fam);
    return 2;
}

/* MPI world of to-hf / from-hf (one rank without mpirun); NULL for the other commands */
static hp_comm_t world_;
static int rank_;

static int fail(hp_status_t s) {
    if (rank_ != 0) return 1;   /* every rank has the same agreed message */
    fprintf(stderr, "hp-ckpt: %s: %s\n", hp_status_string(s), hp_last_error());
    return 1;
}

static const char *shape_str(int nd, const int64_t *s, char *buf, size_t n) {
    size_t l = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < nd && l < n; d++) l += (size_t)snprintf(buf + l, n - l, "%s%lld", d ? ", " : "", (long long)s[d]);
    if (l < n) snprintf(buf + l, n - l, ")");
    return buf;
}

/* HF dir: the index through the hardened parser (every type checked), then each shard's
 * header; every weight_map name must be in the shard the index names. */
static int inspect_hf(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    hp_hf_index_t ix = NULL;
    if (access(path, F_OK) == 0) {
        hp_status_t s = hp_hf_index_read(path, &ix);
        if (s != HP_OK) return fail(s);
    }
    int nf = ix ? hp_hf_index_n_files(ix) : 1;
    printf("HF checkpoint %s: %d file(s)\n", dir, nf);
    int rc = 0;
    for (int i = 0; i < nf && rc == 0; i++) {
        const char *fn = ix ? hp_hf_index_file(ix, i) : "model.safetensors";
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        hp_safetensors_t st;
        hp_status_t s = hp_safetensors_open(path, &st);
        if (s != HP_OK) {
            rc = fail(s);
            break;
        }
        printf("%s: %d tensors\n", fn, hp_safetensors_count(st));
        for (int t = 0; t < hp_safetensors_count(st); t++) {
            const hp_st_info_t *in = hp_safetensors_info(st, t);
            char sb[128];
            printf("  %-56s %-5s %-18s %llu bytes\n", in->name, hp_st_dtype_name(in->dtype),
                   shape_str(in->ndim, in->shape, sb, sizeof sb), (unsigned long long)(in->end - in->begin));
        }
        for (int k = 0; ix && k < hp_hf_index_count(ix) && rc == 0; k++) {
            const char *name, *file;
            const hp_st_info_t *info;
            hp_hf_index_at(ix, k, &name, &file);
            if (!strcmp(file, fn) && hp_safetensors_find(st, name, &info) != HP_OK)
                rc = fail(hp_error(HP_ERR_FORMAT, "%s/model.safetensors.index.json: weight_map[\"%s\"] names %s, which "
                                   "does not hold that tensor", dir, name, fn));
        }
        hp_safetensors_close(st);
    }
    hp_hf_index_free(ix);
    return rc;
}

static int inspect(const char *dir) {
    if (hp_hf_is_hf_dir(dir)) return inspect_hf(dir);
    hp_dcp_metadata_t md;
    hp_status_t s = hp_dcp_metadata_read(dir, &md);
    if (s != HP_OK) return fail(s);
    int n = hp_dcp_metadata_count(md);
    printf("DCP checkpoint %s: step %lld, saved by %d rank(s), %d entries\n", dir, (long long)hp_dcp_metadata_step(md),
           hp_dcp_metadata_world_size(md), n);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        char sb[128];
        if (e->is_blob) {
            printf("  %-48s blob %s, %lld bytes\n", e->name, e->per_rank ? "per rank" : "shared", (long long)e->shape[0]);
            total += (uint64_t)e->shape[0];
            for (int c = 0; c < e->n_chunks; c++)
                printf("      rank %d: %lld bytes in %s\n", e->chunks[c].rank, (long long)e->chunks[c].sizes[0],
                       e->chunks[c].file);
            continue;
        }
        int64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) numel *= e->shape[d];
        uint64_t bytes = (uint64_t)numel * hp_dtype_size(e->dtype);
        total += bytes;
        printf("  %-48s %-5s %-18s %llu bytes, %d chunk(s)\n", e->name, hp_dtype_name(e->dtype),
               shape_str(e->ndim, e->shape, sb, sizeof sb), (unsigned long long)bytes, e->n_chunks);
        for (int c = 0; c < e->n_chunks; c++) {
            char ob[128], zb[128];
            printf("      offsets %s sizes %s in %s\n", shape_str(e->ndim, e->chunks[c].offsets, ob, sizeof ob),
                   shape_str(e->ndim, e->chunks[c].sizes, zb, sizeof zb), e->chunks[c].file);
        }
    }
    printf("total %llu bytes\n", (unsigned long long)total);
    int with = 0, chunks = 0;
    for (int i = 0; i < n; i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        for (int c = 0; c < e->n_chunks; c++) with += e->chunks[c].has_xxh3, chunks++;
    }
    hp_dcp_metadata_free(md);
    /* integrity: every shard present and as long as its header says; checksums when recorded */
    s = hp_dcp_verify(dir, 1);
    if (s != HP_OK) {
        printf("integrity: FAILED\n");
        return fail(s);
    }
    if (with == chunks) printf("integrity: OK (shard sizes and %d chunk checksums verified)\n", with);
    else printf("integrity: OK (shard sizes verified; %d of %d chunks have no checksum: written before checksums)\n",
                chunks - with, chunks);
    return 0;
}

static int consolidate(const char *dir, const char *out) {
    hp_dcp_metadata_t md;
    hp_status_t s = hp_dcp_metadata_read(dir, &md);
    if (s != HP_OK) return fail(s);
    int n = hp_dcp_metadata_count(md), nt = 0, nb = 0;
    hp_dcp_tensor_t *ts = calloc((size_t)n + 1, sizeof *ts);
    hp_dtensor_t *dts = calloc((size_t)n + 1, sizeof *dts);
    hp_dcp_blob_t *bl = calloc((size_t)n + 1, sizeof *bl);
    hp_st_entry_t *ents = calloc((size_t)n + 1, sizeof *ents);
    int64_t *bshape = calloc((size_t)n + 1, sizeof *bshape);
    if (!ts || !dts || !bl || !ents || !bshape) return fail(HP_ERR_OOM);
    for (int i = 0; s == HP_OK && i < n; i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        if (e->is_blob) {
            if (e->per_rank) {
                fprintf(stderr, "hp-ckpt: skipping per-rank blob '%s' (one per saving rank)\n", e->name);
                continue;
            }
            bl[nb] = (hp_dcp_blob_t){e->name, malloc((size_t)e->shape[0] + 1), 0, (size_t)e->shape[0], 0, 0};
            nb++;
            continue;
        }
        s = hp_tensor_malloc(&dts[nt].local, e->dtype, e->ndim, e->shape);
        ts[nt] = (hp_dcp_tensor_t){e->name, &dts[nt], -1, 0};
        nt++;
    }
    hp_dcp_state_t st = {ts, nt, bl, nb};
    hp_dcp_load_options_t o = {0, 0, NULL, 0, 0};
    if (s == HP_OK) s = hp_dcp_load(dir, &st, NULL, &o);
    int k = 0;
    for (int i = 0; i < nt; i++) ents[k++] = (hp_st_entry_t){ts[i].name, &dts[i].local, HP_ST_AUTO, NULL, 0, NULL};
    for (int i = 0; i < nb; i++) {
        bshape[i] = (int64_t)bl[i].size;
        ents[k++] = (hp_st_entry_t){bl[i].name, NULL, HP_ST_U8, bl[i].data, 1, &bshape[i]};
    }
    const char *meta[2] = {"format", "pt"};
    if (s == HP_OK) s = hp_safetensors_write(out, ents, k, meta, 1);
    if (s == HP_OK) printf("wrote %s: %d tensors, %d blobs\n", out, nt, nb);
    for (int i = 0; i < nt; i++) hp_tensor_free_data(&dts[i].local);
    for (int i = 0; i < nb; i++) free(bl[i].data);
    free(ts);
    free(dts);
    free(bl);
    free(ents);
    free(bshape);
    hp_dcp_metadata_free(md);
    return s == HP_OK ? 0 : fail(s);
}

/* --model, --flavor and the --model.KEY overrides, parsed as the config's keys. */
static hp_config_t model_cfg_;

/* The model of --model/--flavor and the --model.* flags with the checkpoint's vocabulary;
 * `vocab_from` names where the vocabulary came from. */
static hp_status_t resolve(const char *name, const char *flavor, int vocab, const char *vocab_from,
                           hp_model_config_t *mc) {
    snprintf(model_cfg_.model.name, sizeof model_cfg_.model.name, "%s", name);
    snprintf(model_cfg_.model.flavor, sizeof model_cfg_.model.flavor, "%s", flavor);
    return hp_config_resolve_model(&model_cfg_, vocab, vocab_from, 0, mc);   /* names the model.* key */
}

/* resolve, then the model itself (seed) */
static hp_status_t make_model(const char *name, const char *flavor, int vocab, const char *vocab_from,
                              hp_model_config_t *mc, hp_model_t *m) {
    HP_TRY(resolve(name, flavor, vocab, vocab_from, mc));
    hp_status_t s = hp_model_create(mc, 1, 1, m);
    if (s != HP_OK)
        return hp_error(s, "%s (vocabulary %d from %s, model %s/%s); hint: check %s", hp_last_error(), vocab,
                        vocab_from, name, flavor, vocab_from);
    return HP_OK;
}

static void print_stats(const char *what, const hp_hf_convert_stats_t *st) {
    fprintf(stderr, "hp-ckpt %s: rank 0 converted %lld tensors, read %lld bytes, wrote %lld bytes; largest tensor "
            "%lld bytes\n", what, (long long)st->tensors, (long long)st->bytes_read, (long long)st->bytes_written,
            (long long)st->largest_tensor_bytes);
}

/* to-hf --tokenizer: what transformers needs beside the weights (its AutoTokenizer and
 * generate): tokenizer.json (its TemplateProcessing, or none, replaced by BOS + text, as Llama
 * 3's tokenizer.json and hp-generate's prompts), tokenizer_config.json,
 * generation_config.json, the bos/eos/pad ids in config.json, and a README.md. */
static const char *tokenizer_;

static hp_status_t put_json(const char *dir, const char *name, json_object *o) {
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    hp_status_t s = json_object_to_file_ext(p, o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                      JSON_C_TO_STRING_NOSLASHESCAPE) == 0
                        ? HP_OK
                        : hp_error(HP_ERR_IO, "%s: cannot write: %s", p, json_util_get_last_err());
    json_object_put(o);
    return s;
}

static json_object *id_or_null(int32_t id) { return id >= 0 ? json_object_new_int(id) : NULL; }

static hp_status_t export_tokenizer(const char *out, const char *src_dir, const hp_model_config_t *mc) {
    hp_tokenizer_t tok = NULL;
    HP_TRY(hp_tokenizer_load(&tok, tokenizer_));
    hp_status_t s = HP_OK;
    if (hp_tokenizer_vocab_size(tok) > mc->vocab_size)
        s = hp_error(HP_ERR_INVALID_ARG, "hp-ckpt to-hf: --tokenizer %s has %d ids but the model's vocabulary is %d; "
                     "hint: give the tokenizer the model was trained with", tokenizer_, hp_tokenizer_vocab_size(tok),
                     mc->vocab_size);
    int32_t bos = hp_tokenizer_bos_id(tok), eos = hp_tokenizer_eos_id(tok), pad = -1;
    const char *pads[] = {"<pad>", "<|pad|>", "<|finetune_right_pad_id|>", "[PAD]"};
    for (size_t i = 0; pad < 0 && i < sizeof pads / sizeof pads[0]; i++) pad = hp_tokenizer_token_to_id(tok, pads[i]);
    if (pad < 0) pad = eos;   /* generate pads finished rows with it; Llama 3 does the same */
    char bos_s[256] = "", eos_s[256] = "", pad_s[256] = "";
    if (bos >= 0) snprintf(bos_s, sizeof bos_s, "%s", hp_tokenizer_id_to_token(tok, bos));
    if (eos >= 0) snprintf(eos_s, sizeof eos_s, "%s", hp_tokenizer_id_to_token(tok, eos));
    if (pad >= 0) snprintf(pad_s, sizeof pad_s, "%s", hp_tokenizer_id_to_token(tok, pad));
    hp_tokenizer_free(tok);
    if (s != HP_OK) return s;
    /* tokenizer.json, with BOS prepended by HF as by us */
    json_object *tj = json_object_from_file(tokenizer_), *pp = NULL;
    if (!tj) return hp_error(HP_ERR_FORMAT, "%s: not readable as JSON: %s", tokenizer_, json_util_get_last_err());
    /* the post-processor: BOS then the text, as Llama 3's tokenizer.json and hp-generate's
     * prompt; a training template that also appends EOS would end every prompt */
    int has_pp = json_object_object_get_ex(tj, "post_processor", &pp) && pp;
    const char *pp_type = "";
    json_object *ppt = NULL;
    if (has_pp && json_object_object_get_ex(pp, "type", &ppt) && json_object_is_type(ppt, json_type_string))
        pp_type = json_object_get_string(ppt);
    if (bos >= 0 && has_pp && strcmp(pp_type, "TemplateProcessing") != 0)
        fprintf(stderr, "hp-ckpt to-hf: warning: %s has a %s post-processor, kept; transformers will not prepend BOS "
                "to prompts as hp-generate does\n", tokenizer_, pp_type[0] ? pp_type : "non-template");
    if (bos >= 0 && (!has_pp || !strcmp(pp_type, "TemplateProcessing"))) {
        json_object *tp = json_object_new_object(), *single = json_object_new_array(), *pair = json_object_new_array();
        json_object *sb = json_object_new_object(), *sa = json_object_new_object(), *bt = json_object_new_object();
        json_object_object_add(bt, "id", json_object_new_string(bos_s));
        json_object_object_add(bt, "type_id", json_object_new_int(0));
        json_object_object_add(sb, "SpecialToken", bt);
        json_object *seq = json_object_new_object();
        json_object_object_add(seq, "id", json_object_new_string("A"));
        json_object_object_add(seq, "type_id", json_object_new_int(0));
        json_object_object_add(sa, "Sequence", seq);
        json_object_array_add(single, sb);
        json_object_array_add(single, sa);
        json_object_array_add(pair, json_object_get(sb));
        json_object_array_add(pair, json_object_get(sa));
        json_object *seqb = json_object_new_object(), *sbb = json_object_new_object();
        json_object_object_add(seqb, "id", json_object_new_string("B"));
        json_object_object_add(seqb, "type_id", json_object_new_int(1));
        json_object_object_add(sbb, "Sequence", seqb);
        json_object_array_add(pair, sbb);
        json_object *sp = json_object_new_object(), *one = json_object_new_object(), *ids = json_object_new_array(),
                    *toks = json_object_new_array();
        json_object_object_add(one, "id", json_object_new_string(bos_s));
        json_object_array_add(ids, json_object_new_int(bos));
        json_object_array_add(toks, json_object_new_string(bos_s));
        json_object_object_add(one, "ids", ids);
        json_object_object_add(one, "tokens", toks);
        json_object_object_add(sp, bos_s, one);
        json_object_object_add(tp, "type", json_object_new_string("TemplateProcessing"));
        json_object_object_add(tp, "single", single);
        json_object_object_add(tp, "pair", pair);
        json_object_object_add(tp, "special_tokens", sp);
        json_object_object_add(tj, "post_processor", tp);
    }
    HP_TRY(put_json(out, "tokenizer.json", tj));
    json_object *tc = json_object_new_object();
    json_object_object_add(tc, "tokenizer_class", json_object_new_string("PreTrainedTokenizerFast"));
    if (bos >= 0) json_object_object_add(tc, "bos_token", json_object_new_string(bos_s));
    if (eos >= 0) json_object_object_add(tc, "eos_token", json_object_new_string(eos_s));
    if (pad >= 0) json_object_object_add(tc, "pad_token", json_object_new_string(pad_s));
    json_object_object_add(tc, "model_max_length", json_object_new_int(mc->max_seq_len));
    json_object_object_add(tc, "clean_up_tokenization_spaces", json_object_new_boolean(0));
    HP_TRY(put_json(out, "tokenizer_config.json", tc));
    json_object *gc = json_object_new_object();
    json_object_object_add(gc, "bos_token_id", id_or_null(bos));
    json_object_object_add(gc, "eos_token_id", id_or_null(eos));
    json_object_object_add(gc, "pad_token_id", id_or_null(pad));
    json_object_object_add(gc, "do_sample", json_object_new_boolean(0));   /* greedy, as hp-generate's default */
    HP_TRY(put_json(out, "generation_config.json", gc));
    char p[4300];
    snprintf(p, sizeof p, "%s/config.json", out);
    json_object *cj = json_object_from_file(p);
    if (!cj) return hp_error(HP_ERR_FORMAT, "%s: cannot read back: %s", p, json_util_get_last_err());
    json_object_object_add(cj, "bos_token_id", id_or_null(bos));
    json_object_object_add(cj, "eos_token_id", id_or_null(eos));
    json_object_object_add(cj, "pad_token_id", id_or_null(pad));
    char arch[96] = "?";   /* what hp_hf_write_config named (architectures[0]) */
    json_object *ar = NULL;
    if (json_object_object_get_ex(cj, "architectures", &ar) && json_object_is_type(ar, json_type_array) &&
        json_object_array_length(ar) > 0)
        snprintf(arch, sizeof arch, "%s", json_object_get_string(json_object_array_get_idx(ar, 0)));
    HP_TRY(put_json(out, "config.json", cj));
    snprintf(p, sizeof p, "%s/README.md", out);
    FILE *f = fopen(p, "w");
    if (!f) return hp_error(HP_ERR_IO, "%s: cannot write: %s", p, strerror(errno));
    char dims[1024];
    hp_config_describe_model(mc, dims, sizeof dims);
    hp_dcp_metadata_t md = NULL;
    long long step = -1;
    if (hp_dcp_metadata_read(src_dir, &md) == HP_OK) step = (long long)hp_dcp_metadata_step(md);
    hp_dcp_metadata_free(md);
    char stepb[64] = "";
    if (step >= 0) snprintf(stepb, sizeof stepb, " (training step %lld)", step);
    fprintf(f, "# %s model exported by hyperparallel\n\nConverted by `hp-ckpt to-hf` from the checkpoint `%s`%s.\n\n"
               "- model: %s/%s (%s in transformers)\n- dims: %s\n- tokenizer: `%s` (bos %d, eos %d, pad %d)\n\n"
               "Load it with `transformers.pipeline(\"text-generation\", model=\"<this folder>\")`; generation is greedy "
               "by default (generation_config.json).\n", mc->name, src_dir, stepb, mc->name, mc->flavor,
            arch, dims, tokenizer_, bos, eos, pad);
    if (fclose(f) != 0) return hp_error(HP_ERR_IO, "%s: write failed", p);
    return HP_OK;
}

/* MoE layers: each one's expert_bias is a DCP tensor of its own. */
static int moe_layers(const hp_model_config_t *mc) {
    int n = 0;
    for (int l = 0; l < mc->n_layers; l++) n += hp_model_layer_is_moe(mc, l);
    return n;
}

/* Streaming (hp_hf_convert_from_dcp): one tensor in memory at a time; under mpirun each rank
 * writes its share of the HF shards. */
static int to_hf(const char *dir, const char *out, const char *model, const char *flavor, hp_dtype_t dt, size_t shard) {
    hp_dcp_metadata_t md;
    hp_status_t s = hp_dcp_metadata_read(dir, &md);
    if (s != HP_OK) return fail(s);
    const hp_dcp_entry_t *emb = hp_dcp_metadata_find(md, "tok_embeddings.weight");
    if (!emb || emb->ndim != 2) {
        hp_dcp_metadata_free(md);
        fprintf(stderr, "hp-ckpt: %s has no 2-d tok_embeddings.weight; not a model checkpoint\n", dir);
        return 1;
    }
    char what[4300];
    snprintf(what, sizeof what, "%s: tok_embeddings.weight rows (the vocabulary)", dir);
    s = hp_check_i64(what, emb->shape[0], 1, HP_MODEL_MAX_VOCAB, "at most HP_MODEL_MAX_VOCAB = 2^24 token ids");
    int vocab = (int)emb->shape[0];
    hp_dcp_metadata_free(md);
    hp_model_config_t mc;
    if (s == HP_OK) s = resolve(model, flavor, vocab, "the checkpoint's tok_embeddings.weight", &mc);
    hp_hf_convert_stats_t stats;
    if (s == HP_OK) s = hp_hf_convert_from_dcp(dir, hp_model_hf_adapter(&mc), &mc, out, dt, shard, world_, &stats);
    if (s == HP_OK && rank_ == 0 && tokenizer_) s = export_tokenizer(out, dir, &mc);
    if (s == HP_OK && rank_ == 0) {
        char dims[1024];
        hp_config_describe_model(&mc, dims, sizeof dims);
        printf("wrote HF checkpoint %s (%s %s, vocab %d, %s; %s)\n", out, model, flavor, vocab, hp_dtype_name(dt), dims);
        print_stats("to-hf", &stats);
    }
    return s == HP_OK ? 0 : fail(s);
}

/* The model comes from config.json (hp_hf_read_config); with --flavor, the flavor and the
 * --model.* flags must describe the same model, or the command is refused listing the fields. */
static int from_hf(const char *dir, const char *out, const char *model, const char *flavor) {
    hp_model_config_t hf, mc;
    hp_status_t s = hp_hf_read_config(dir, &hf);
    if (s != HP_OK) return fail(s);
    char ov[1024];
    hp_config_model_overrides(&model_cfg_, ov, sizeof ov);
    if (!flavor && ov[0])
        return fail(hp_error(HP_ERR_INVALID_ARG, "hp-ckpt from-hf: %s given without --flavor; the model comes from "
                             "%s/config.json; hint: drop the --model.* flags, or add --flavor to check config.json "
                             "against the flavor with them", ov, dir));
    if (model && strcmp(model, hf.name) != 0)
        return fail(hp_error(HP_ERR_INVALID_ARG, "hp-ckpt from-hf: --model %s, but %s/config.json describes a %s model "
                             "(model_type '%s'); hint: use --model %s or leave --model out", model, dir, hf.name,
                             hp_model_hf_adapter(&hf)->model_type, hf.name));
    char what[4300];
    snprintf(what, sizeof what, "%s/config.json: 'vocab_size'", dir);
    if (flavor) {
        s = resolve(model ? model : hf.name, flavor, hf.vocab_size, what, &mc);
        /* every field and the whole hint: printed here, as it can outgrow hp_last_error's 2 KiB
         * (a deepseek_v3 folder against a flavor differs in some 25 fields) */
        static char msg[8192], flags[4096];
        int n = s == HP_OK ? hp_hf_config_diff(&hf, &mc, msg, sizeof msg, flags, sizeof flags) : 0;
        if (n) {
            if (rank_ == 0)
                fprintf(stderr, "hp-ckpt: invalid argument: hp-ckpt from-hf: %s/config.json disagrees with --flavor "
                        "%s%s%s in %d field(s): %s; hint: leave --flavor out to take the model from config.json, or "
                        "describe it with %s\n", dir, flavor, ov[0] ? " and " : "", ov, n, msg, flags);
            return 1;
        }
    } else {
        mc = hf;
    }
    hp_hf_convert_stats_t stats;
    if (s == HP_OK) s = hp_hf_convert_to_dcp(dir, hp_model_hf_adapter(&mc), &mc, out, world_, &stats);
    if (s == HP_OK && rank_ == 0) {
        char dims[1024];
        hp_config_describe_model(&mc, dims, sizeof dims);
        printf("wrote DCP checkpoint %s (%d tensors; %s %s; %s; use it as checkpoint.initial_load_path)\n", out,
               hp_model_describe_params(&mc, 0, mc.n_layers + 2, NULL, 0) + moe_layers(&mc), mc.name,
               flavor ? flavor : "from config.json", dims);
        print_stats("from-hf", &stats);
    }
    return s == HP_OK ? 0 : fail(s);
}

/* TorchTitan's seed checkpoint: the initialised model (counter RNG keyed by seed, name and
 * element index, so identical to what any layout would draw), saved model-only as step-0. */
static int seed(const char *out, const char *model, const char *flavor, int vocab, unsigned long long sd) {
    hp_model_config_t mc;
    hp_model_t m = NULL;
    hp_status_t s = make_model(model, flavor, vocab, "--vocab", &mc, &m);
    if (s == HP_OK) s = hp_model_init_weights(m, (uint64_t)sd);
    int np = m ? hp_model_num_params(m) : 0;
    hp_dcp_tensor_t *ts = calloc((size_t)np + 1, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(m)[i].name, &hp_model_params(m)[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    if (s == HP_OK) s = hp_dcp_save(out, &st, NULL);
    if (s == HP_OK) printf("wrote seed checkpoint %s (%s %s, vocab %d, seed %llu)\n", out, model, flavor, vocab, sd);
    free(ts);
    hp_model_destroy(m);
    return s == HP_OK ? 0 : fail(s);
}

static const char *const ckpt_flags[] = {"--model", "--flavor", "--dtype", "--max-shard-bytes", "--vocab", "--seed",
                                         "--tokenizer"};
#define N_CKPT_FLAGS (sizeof ckpt_flags / sizeof ckpt_flags[0])

static int bad_args(void) {
    fprintf(stderr, "%s\n", hp_last_error());
    usage();
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    const char *cmd = argv[1];
    const char *model = NULL, *flavor = NULL;
    hp_dtype_t dt = HP_F32;
    size_t shard = 0;
    int vocab = 0;
    unsigned long long sd = 0;
    const char *pos[3];
    int npos = 0;
    hp_config_defaults(&model_cfg_);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strncmp(a, "--model.", 8)) {   /* a config key: --model.dim 80 or --model.dim=80 */
            char key[128];
            const char *eq = strchr(a, '=');
            size_t kn = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            snprintf(key, sizeof key, "%.*s", (int)(kn < sizeof key ? kn : sizeof key - 1), a + 2);
            if (!eq && i + 1 >= argc) {
                hp_error(HP_ERR_INVALID_ARG, "hp-ckpt: --%s needs a value (--%s=VALUE)", key, key);
                return bad_args();
            }
            if (hp_config_set(&model_cfg_, key, eq ? eq + 1 : argv[++i], "hp-ckpt") != HP_OK) return bad_args();
            continue;
        }
        if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--model", &v))) {
            if (r < 0) return bad_args();
            model = v;
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--flavor", &v))) {
            if (r < 0) return bad_args();
            flavor = v;
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--dtype", &v))) {
            if (r < 0) return bad_args();
            if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) dt = HP_BF16;
            else if (!strcmp(v, "f32") || !strcmp(v, "float32")) dt = HP_F32;
            else {
                fprintf(stderr, "hp-ckpt: --dtype '%s': expected f32 (float32) or bf16 (bfloat16)\n", v);
                return 2;
            }
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--max-shard-bytes", &v))) {
            uint64_t b = 0;
            if (r < 0 || hp_parse_u64("hp-ckpt: --max-shard-bytes", v, (uint64_t)INT64_MAX,
                                      "bytes per safetensors shard, e.g. 5368709120; 0 = the 5 GiB default",
                                      &b) != HP_OK)
                return bad_args();
            shard = (size_t)b;
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--vocab", &v))) {
            int32_t x = 0;
            if (r < 0 || hp_parse_i32("hp-ckpt: --vocab", v, 1, HP_MODEL_MAX_VOCAB,
                                      "the tokenizer's vocabulary size (hp-tokenizer info); at most "
                                      "HP_MODEL_MAX_VOCAB = 2^24", &x) != HP_OK)
                return bad_args();
            vocab = x;
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--tokenizer", &v))) {
            if (r < 0) return bad_args();
            tokenizer_ = v;
        } else if ((r = hp_flag_value("hp-ckpt", argc, argv, &i, "--seed", &v))) {
            uint64_t x = 0;
            if (r < 0 || hp_parse_u64("hp-ckpt: --seed", v, UINT64_MAX, NULL, &x) != HP_OK) return bad_args();
            sd = (unsigned long long)x;
        } else if (a[0] == '-' && a[1]) {   /* -x or --x: a flag, never a path */
            hp_flag_unknown_error("hp-ckpt", a, ckpt_flags, N_CKPT_FLAGS);
            return bad_args();
        } else if (npos < (strcmp(cmd, "merge-lora") ? 2 : 3)) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "hp-ckpt %s: unexpected argument '%s'\n", cmd, a);
            return usage();
        }
    }
    int want = !strcmp(cmd, "merge-lora") ? 3
               : !strcmp(cmd, "consolidate") || !strcmp(cmd, "to-hf") || !strcmp(cmd, "from-hf") ? 2 : 1;
    if (npos != want) {
        fprintf(stderr, "hp-ckpt %s: expected %d path argument(s), got %d\n", cmd, want, npos);
        return usage();
    }
    if (!strcmp(cmd, "inspect")) return inspect(pos[0]);
    if (!strcmp(cmd, "list")) {
        int64_t steps[1024];
        int n = 0;
        hp_status_t s = hp_dcp_list_steps(pos[0], steps, 1024, &n);
        if (s != HP_OK) return fail(s);
        int bad = 0;
        for (int i = 0; i < n && i < 1024; i++) {
            char d[4200];
            snprintf(d, sizeof d, "%s/step-%lld", pos[0], (long long)steps[i]);
            if (hp_dcp_verify(d, 0) == HP_OK) {   /* sizes only; inspect verifies checksums */
                printf("step-%lld\n", (long long)steps[i]);
            } else {
                printf("step-%lld INCOMPLETE: %s\n", (long long)steps[i], hp_last_error());
                bad++;
            }
        }
        return bad ? 1 : 0;
    }
    if (!strcmp(cmd, "seed")) {
        if (!model || !flavor || vocab <= 0) {
            fprintf(stderr, "hp-ckpt seed: --model, --flavor and --vocab (> 0) are required\n");
            return 2;
        }
        return seed(pos[0], model, flavor, vocab, sd);
    }
    if (!strcmp(cmd, "consolidate")) return consolidate(pos[0], pos[1]);
    if (!strcmp(cmd, "merge-lora")) {   /* docs/finetune.md "LoRA": PEFT's merge_and_unload on the files */
        hp_status_t s = hp_hf_merge_lora(pos[0], pos[1], pos[2]);
        if (s != HP_OK) return fail(s);
        printf("merged the LoRA adapter %s into %s: %s\n", pos[1], pos[0], pos[2]);
        return 0;
    }
    if (!strcmp(cmd, "from-hf") || !strcmp(cmd, "to-hf")) {
        if (!strcmp(cmd, "to-hf") && (!model || !flavor)) {
            fprintf(stderr, "hp-ckpt %s: --model and --flavor are required\n", cmd);
            return 2;
        }
        /* under mpirun every rank converts its share; alone, one process without MPI (a
         * singleton MPI start costs a second or more) */
        int under_mpirun = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
        if (under_mpirun) {
            if (hp_comm_init(&argc, &argv, &world_) != HP_OK) return fail(HP_ERR_STATE);
            rank_ = hp_comm_rank(world_);
        }
        int rc = !strcmp(cmd, "from-hf") ? from_hf(pos[0], pos[1], model, flavor)
                                         : to_hf(pos[0], pos[1], model, flavor, dt, shard);
        if (world_) hp_comm_finalize();
        return rc;
    }
    return usage();
}
