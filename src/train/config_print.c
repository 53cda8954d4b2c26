/* Printing a configuration: every value as YAML that loads back to the same config
 * (hp_config_print, hp_config_get_string) and the Markdown reference table of the keys. */
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "train/config-impl.h"

/* ---- printing ------------------------------------------------------------------------- */

static void format_float(double v, char *buf, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* Keep a float looking like a float in YAML ("1" -> "1.0"). */
    if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 < n) strcat(buf, ".0");
}

/* YAML-quotes a string when plain style would change its meaning. */
static void format_string(const char *s, char *buf, size_t n) {
    bool plain = *s != '\0';
    bool b;
    int64_t i;
    double d;
    if (plain && (hp_cfg_parse_bool(s, &b) || hp_cfg_parse_int(s, &i) || hp_cfg_parse_float(s, &d) || strcasecmp(s, "null") == 0 ||
                  strcmp(s, "~") == 0))
        plain = false;
    if (plain && (strchr("-?:,[]{}#&*!|>'\"%@` ", s[0]) || s[strlen(s) - 1] == ' ')) plain = false;
    if (plain && (strstr(s, ": ") || strstr(s, " #"))) plain = false;
    for (const char *p = s; plain && *p; p++)
        if ((unsigned char)*p < 0x20) plain = false;
    if (plain) {
        snprintf(buf, n, "%s", s);
        return;
    }
    size_t o = 0;
    if (o + 1 < n) buf[o++] = '"';
    for (const char *p = s; *p && o + 4 < n; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else if (c == '\t') {
            buf[o++] = '\\';
            buf[o++] = 't';
        } else if (c < 0x20) {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    if (o + 1 < n) buf[o++] = '"';
    buf[o < n ? o : n - 1] = '\0';
}

void hp_cfg_format_value(const hp_config_t *cfg, const hp_config_key_t *k, char *buf, size_t n) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case HP_CONFIG_INT: {
        int64_t v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%lld", (long long)v);
        break;
    }
    case HP_CONFIG_FLOAT: {
        double v;
        memcpy(&v, field, sizeof v);
        format_float(v, buf, n);
        break;
    }
    case HP_CONFIG_BOOL: {
        bool v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v ? "true" : "false");
        break;
    }
    case HP_CONFIG_TRISTATE: {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v < 0 ? "default" : v ? "true" : "false");
        break;
    }
    case HP_CONFIG_STRING:
    case HP_CONFIG_ENUM: format_string(field, buf, n); break;
    case HP_CONFIG_LIST: {
        const hp_config_list_t *l = (const hp_config_list_t *)field;
        size_t o = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->n && o < n; i++) {
            char item[HP_CONFIG_STR_MAX * 2];
            format_string(l->items[i], item, sizeof item);
            o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", item);
        }
        if (o < n) snprintf(buf + o, n - o, "]");
        break;
    }
    }
}

hp_status_t hp_config_get_string(const hp_config_t *cfg, const char *dotted, char *buf, size_t n) {
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return hp_cfg_unknown_key_error("hp_config_get_string", dotted, "");
    hp_cfg_format_value(cfg, k, buf, n);
    return HP_OK;
}

void hp_config_print(const hp_config_t *cfg, FILE *f) {
    char buf[HP_CONFIG_STR_MAX * HP_CONFIG_LIST_MAX * 2];
    for (size_t i = 0; i < hp_cfg_n_keys; i++) {
        if (i == 0 || strcmp(hp_cfg_keys[i].section, hp_cfg_keys[i - 1].section) != 0)
            fprintf(f, "%s:\n", hp_cfg_keys[i].section);
        hp_cfg_format_value(cfg, &hp_cfg_keys[i], buf, sizeof buf);
        fprintf(f, "  %s: %s\n", hp_cfg_keys[i].key, buf);
    }
}

void hp_config_write_markdown(FILE *f) {
    for (size_t i = 0; i < hp_cfg_n_keys; i++) {
        const hp_config_key_t *k = &hp_cfg_keys[i];
        if (i == 0 || strcmp(k->section, hp_cfg_keys[i - 1].section) != 0) {
            fprintf(f, "%s### %s\n\n", i ? "\n" : "", k->section);
            fprintf(f, "| key | type | default | meaning |\n|---|---|---|---|\n");
        }
        char type[512];
        if (k->type == HP_CONFIG_ENUM) {
            size_t o = (size_t)snprintf(type, sizeof type, "enum: ");
            for (const char *p = k->choices; *p && o + 8 < sizeof type; p++) {
                if (*p == '|') {
                    type[o++] = ',';
                    type[o++] = ' ';
                } else {
                    type[o++] = *p;
                }
            }
            type[o] = '\0';
        } else if (k->type == HP_CONFIG_INT && (k->int_min != INT64_MIN || k->int_max != INT64_MAX)) {
            char lo[32], hi[32];
            snprintf(lo, sizeof lo, "%lld", (long long)k->int_min);
            if (k->int_max == I64) snprintf(hi, sizeof hi, "2^63-1");
            else if (k->int_max == I32) snprintf(hi, sizeof hi, "2^31-1");
            else if (k->int_max == HP_MODEL_MAX_SEQ_LEN) snprintf(hi, sizeof hi, "2^20");
            else if (k->int_max == HP_MODEL_MAX_VOCAB || k->int_max == DEG) snprintf(hi, sizeof hi, "2^24");
            else snprintf(hi, sizeof hi, "%lld", (long long)k->int_max);
            snprintf(type, sizeof type, "int in [%s, %s]%s", lo, hi, k->flavor_default ? " or -1" : "");
        } else if (k->type == HP_CONFIG_FLOAT && isfinite(k->float_min)) {
            char lo[32], hi[32];
            if (k->float_min == FLT_MIN) snprintf(lo, sizeof lo, "(0");   /* > 0, and normal in float32 */
            else snprintf(lo, sizeof lo, "[%g", k->float_min);
            if (k->float_max == FLT_MAX) snprintf(hi, sizeof hi, "3.4e38]");
            else snprintf(hi, sizeof hi, "%g]", k->float_max);
            snprintf(type, sizeof type, "float in %s, %s%s%s", lo, hi, k->flavor_default ? " or -1" : "",
                     k->f32 ? " (used in float32)" : "");
        } else if (k->type == HP_CONFIG_FLOAT && k->f32) {
            snprintf(type, sizeof type, "float (used in float32)");
        } else {
            snprintf(type, sizeof type, "%s", hp_config_type_name(k->type));
        }
        const char *def = k->default_value;
        fprintf(f, "| `%s.%s` | %s | %s%s%s | %s", k->section, k->key, type, *def ? "`" : "",
                *def ? def : (k->type == HP_CONFIG_LIST ? "`[]`" : "`\"\"`"), *def ? "`" : "", k->doc);
        if (k->alias) fprintf(f, " Alias: `%s.%s`.", k->section, k->alias);
        fprintf(f, " |\n");
    }
}
