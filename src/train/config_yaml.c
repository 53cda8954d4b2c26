/* Loading a YAML config file (libyaml's document API): sections of keys, lists, null and
 * -1 values, line numbers in every message, and refusing a second document. */
#include "hyperparallel/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "train/config-impl.h"

/* ---- YAML ------------------------------------------------------------------------------ */

static const char *node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

static bool is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || strcmp(v, "~") == 0 || strcasecmp(v, "null") == 0;
}

/* Applies one `key: value` pair whose dotted name is known. */
static hp_status_t apply_yaml_value(hp_config_t *cfg, yaml_document_t *doc, const char *path, const char *dotted,
                                    const yaml_node_t *key_node, yaml_node_t *val, size_t *seen_line) {
    char origin[HP_CONFIG_STR_MAX + 32];
    snprintf(origin, sizeof origin, "%s:%zu", path, key_node->start_mark.line + 1);
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return hp_cfg_unknown_key_error(origin, dotted, "");
    /* A key given twice (also through an alias) is an error rather than "last one wins". */
    size_t row = (size_t)(k - hp_cfg_keys);
    if (seen_line[row])
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s' is given twice (first at line %zu)", origin, k->section,
                        k->key, seen_line[row]);
    seen_line[row] = key_node->start_mark.line + 1;
    if (k->type == HP_CONFIG_LIST) {
        hp_config_list_t *l = (hp_config_list_t *)((char *)cfg + k->offset);
        if (val->type == YAML_SEQUENCE_NODE) {
            l->n = 0;
            for (yaml_node_item_t *it = val->data.sequence.items.start; it < val->data.sequence.items.top; it++) {
                yaml_node_t *item = yaml_document_get_node(doc, *it);
                if (!item || item->type != YAML_SCALAR_NODE)
                    return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects a list of strings, got an item that is %s",
                                    origin, dotted, item ? node_kind(item) : "empty");
                if (l->n >= HP_CONFIG_LIST_MAX)
                    return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s': more than %d items", origin, dotted,
                                    HP_CONFIG_LIST_MAX);
                HP_TRY(hp_cfg_copy_str(l->items[l->n], (const char *)item->data.scalar.value, origin, k));
                l->n++;
            }
            return HP_OK;
        }
        if (is_null_scalar(val)) {
            l->n = 0;
            return HP_OK;
        }
    }
    if (val->type != YAML_SCALAR_NODE) {
        if (k->type == HP_CONFIG_ENUM)
            return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects one of %s, got %s", origin, dotted, k->choices,
                            node_kind(val));
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects %s, got %s", origin, dotted, hp_cfg_type_words(k->type),
                        node_kind(val));
    }
    const char *text = (const char *)val->data.scalar.value;
    if (k->type == HP_CONFIG_STRING && is_null_scalar(val)) text = "";
    return hp_cfg_set_from_text(cfg, k, text, origin);
}

static hp_status_t apply_yaml(hp_config_t *cfg, yaml_document_t *doc, const char *path) {
    size_t seen_line[HP_CFG_MAX_KEYS] = {0};   // by key index
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || is_null_scalar(root)) return HP_OK;   /* empty file: nothing to set */
    if (root->type != YAML_MAPPING_NODE)
        return hp_error(HP_ERR_FORMAT, "%s:%zu: expected a mapping of sections (e.g. 'training:'), got %s", path,
                        root->start_mark.line + 1, node_kind(root));
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        if (kn->type != YAML_SCALAR_NODE)
            return hp_error(HP_ERR_FORMAT, "%s:%zu: a section name must be a scalar", path, kn->start_mark.line + 1);
        const char *section = (const char *)kn->data.scalar.value;
        if (strchr(section, '.')) {   /* flat "training.steps: 20" is accepted too */
            HP_TRY(apply_yaml_value(cfg, doc, path, section, kn, vn, seen_line));
            continue;
        }
        if (is_null_scalar(vn)) continue;   /* "training:" with nothing below */
        bool known = false;
        for (size_t i = 0; i < hp_cfg_n_keys; i++) known |= strcmp(hp_cfg_keys[i].section, section) == 0;
        if (!known && vn->type == YAML_MAPPING_NODE && vn->data.mapping.pairs.start < vn->data.mapping.pairs.top) {
            /* Name the section's line and its first key: "trainig.steps" -> "training.steps". */
            yaml_node_t *k2 = yaml_document_get_node(doc, vn->data.mapping.pairs.start->key);
            char dotted[256], origin[HP_CONFIG_STR_MAX + 32];
            snprintf(dotted, sizeof dotted, "%s.%s", section,
                     k2->type == YAML_SCALAR_NODE ? (const char *)k2->data.scalar.value : "?");
            snprintf(origin, sizeof origin, "%s:%zu", path, kn->start_mark.line + 1);
            return hp_cfg_unknown_key_error(origin, dotted, "");
        }
        if (vn->type != YAML_MAPPING_NODE) {
            if (!known) {
                char origin[HP_CONFIG_STR_MAX + 32];
                snprintf(origin, sizeof origin, "%s:%zu", path, kn->start_mark.line + 1);
                return hp_cfg_unknown_key_error(origin, section, "");
            }
            return hp_error(HP_ERR_INVALID_ARG, "%s:%zu: section '%s' must be a mapping of keys, got %s", path,
                            kn->start_mark.line + 1, section, node_kind(vn));
        }
        for (yaml_node_pair_t *q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top; q++) {
            yaml_node_t *k2 = yaml_document_get_node(doc, q->key);
            yaml_node_t *v2 = yaml_document_get_node(doc, q->value);
            if (k2->type != YAML_SCALAR_NODE)
                return hp_error(HP_ERR_FORMAT, "%s:%zu: a key must be a scalar", path, k2->start_mark.line + 1);
            char dotted[256];
            snprintf(dotted, sizeof dotted, "%s.%s", section, (const char *)k2->data.scalar.value);
            HP_TRY(apply_yaml_value(cfg, doc, path, dotted, k2, v2, seen_line));
        }
    }
    return HP_OK;
}

hp_status_t hp_config_load_file(hp_config_t *cfg, const char *path) {
    if (!cfg || !path) return hp_error(HP_ERR_INVALID_ARG, "hp_config_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return hp_error(HP_ERR_IO, "config file '%s': cannot open (%s); hint: check the --config path", path,
                        strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return hp_error(HP_ERR_OOM, "config file '%s': cannot initialise the YAML parser", path);
    }
    yaml_parser_set_input_file(&parser, f);
    hp_status_t st = HP_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        st = hp_error(HP_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path, parser.problem_mark.line + 1,
                      parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
                      parser.context ? " " : "", parser.context ? parser.context : "");
    } else {
        st = apply_yaml(cfg, &doc, path);
        yaml_document_delete(&doc);
        /* A second document after '---' would be silently ignored: refuse it. */
        yaml_document_t doc2;
        if (st == HP_OK && !yaml_parser_load(&parser, &doc2)) {
            st = hp_error(HP_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path, parser.problem_mark.line + 1,
                          parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
                          parser.context ? " " : "", parser.context ? parser.context : "");
        } else if (st == HP_OK) {
            if (yaml_document_get_root_node(&doc2))
                st = hp_error(HP_ERR_FORMAT,
                              "%s:%zu: a second YAML document starts here ('---'); a config file holds one "
                              "document; hint: merge it into the first or pass it as its own --config file",
                              path, doc2.start_mark.line + 1);
            yaml_document_delete(&doc2);
        }
        if (st == HP_OK) st = hp_cfg_copy_str(cfg->job.config_file, path, path, hp_config_find_key("job.config_file"));
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}
