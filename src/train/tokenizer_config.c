/* A Hugging Face model folder's tokenizer files besides tokenizer.json: tokenizer_config.json
 * (bos / eos / pad tokens, add_bos_token / add_eos_token, chat templates),
 * special_tokens_map.json and chat_template.jinja. docs/tokenizer.md, "Model folders". */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hyperparallel/file.h"
#include "train/tokenizer-impl.h"

/* A small JSON or template file of the folder, read whole (core/file.c). */
static hp_status_t slurp(const char *path, char **out, size_t *len) {
    return hp_file_read_all(path, "tokenizer file", (size_t)64 << 20, out, len);
}

/* A token field: "<s>", {"content": "<s>", ...} (transformers' AddedToken), or null.
 * *id = -2 when the key is absent (keep what tokenizer.json gave), -1 for null. */
static hp_status_t token_field(hp_tokenizer_t t, const char *path, json_object *root,
                               const char *key, int32_t *id) {
    json_object *v;
    *id = -2;
    if (!json_object_object_get_ex(root, key, &v)) return HP_OK;
    if (!v) {
        *id = -1;
        return HP_OK;
    }
    if (json_object_is_type(v, json_type_object)) {
        json_object *c;
        if (!json_object_object_get_ex(v, "content", &c) || !json_object_is_type(c, json_type_string))
            return hp_error(HP_ERR_FORMAT, "%s: %s: expected a token string or an object with a "
                            "string \"content\"", path, key);
        v = c;
    }
    if (!json_object_is_type(v, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s: %s: is %s, expected a token string (or null)", path,
                        key, json_type_to_name(json_object_get_type(v)));
    const char *s = json_object_get_string(v);
    *id = hp_tokenizer_token_to_id(t, s);
    if (*id < 0)
        return hp_error(HP_ERR_FORMAT, "%s: %s: token \"%.200s\" is not in %s (neither an added "
                        "token nor in model.vocab); expected a token of that tokenizer",
                        path, key, s, t->name);
    return HP_OK;
}

static hp_status_t add_template(hp_tokenizer_t t, const char *name, const char *text) {
    char **n = realloc(t->template_names, (t->n_templates + 1) * sizeof(char *));
    if (!n) return HP_ERR_OOM;
    t->template_names = n;
    char **x = realloc(t->templates, (t->n_templates + 1) * sizeof(char *));
    if (!x) return HP_ERR_OOM;
    t->templates = x;
    n[t->n_templates] = strdup(name);
    x[t->n_templates] = strdup(text);
    if (!n[t->n_templates] || !x[t->n_templates]) {
        free(n[t->n_templates]);
        free(x[t->n_templates]);
        return HP_ERR_OOM;
    }
    t->n_templates++;
    return HP_OK;
}

static hp_status_t apply_doc(hp_tokenizer_t t, const char *path, json_object *root) {
    if (!json_object_is_type(root, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: expected a JSON object (a tokenizer_config.json)", path);
    int32_t bos, eos, pad;
    HP_TRY(token_field(t, path, root, "bos_token", &bos));
    HP_TRY(token_field(t, path, root, "eos_token", &eos));
    HP_TRY(token_field(t, path, root, "pad_token", &pad));
    if (bos != -2) t->bos = bos;
    if (eos != -2) t->eos = eos;
    if (pad != -2) t->pad = pad;
    static const char *flags[] = {"add_bos_token", "add_eos_token"};
    for (int k = 0; k < 2; k++) {
        json_object *v;
        if (!json_object_object_get_ex(root, flags[k], &v) || !v) continue;
        if (!json_object_is_type(v, json_type_boolean))
            return hp_error(HP_ERR_FORMAT, "%s: %s: is %s, expected true or false", path, flags[k],
                            json_type_to_name(json_object_get_type(v)));
        *(k ? &t->add_eos : &t->add_bos) = json_object_get_boolean(v);
    }
    json_object *ct;
    if (json_object_object_get_ex(root, "chat_template", &ct) && ct) {
        if (json_object_is_type(ct, json_type_string)) {
            HP_TRY(add_template(t, "default", json_object_get_string(ct)));
        } else if (json_object_is_type(ct, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(ct); i++) {
                json_object *e = json_object_array_get_idx(ct, i), *n, *x;
                if (!json_object_is_type(e, json_type_object) ||
                    !json_object_object_get_ex(e, "name", &n) || !json_object_is_type(n, json_type_string) ||
                    !json_object_object_get_ex(e, "template", &x) || !json_object_is_type(x, json_type_string))
                    return hp_error(HP_ERR_FORMAT, "%s: chat_template[%zu]: expected {\"name\": "
                                    "string, \"template\": string}", path, i);
                HP_TRY(add_template(t, json_object_get_string(n), json_object_get_string(x)));
            }
        } else {
            return hp_error(HP_ERR_FORMAT, "%s: chat_template: is %s, expected a string or a list "
                            "of {name, template}", path, json_type_to_name(json_object_get_type(ct)));
        }
    }
    return HP_OK;
}

hp_status_t hp_tokenizer_apply_config(hp_tokenizer_t t, const char *path) {
    char *text;
    size_t len;
    HP_TRY(slurp(path, &text, &len));
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        free(text);
        return hp_error(HP_ERR_OOM, "%s: cannot create a JSON parser", path);
    }
    json_object *root = len <= INT32_MAX ? json_tokener_parse_ex(tk, text, (int)len) : NULL;
    enum json_tokener_error e = json_tokener_get_error(tk);
    json_tokener_free(tk);
    free(text);
    if (!root || e != json_tokener_success) {
        if (root) json_object_put(root);
        return hp_error(HP_ERR_FORMAT, "%s: not valid JSON (%s)", path,
                        e == json_tokener_continue ? "unexpected end of input" : json_tokener_error_desc(e));
    }
    hp_status_t st = apply_doc(t, path, root);
    json_object_put(root);
    return st;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

hp_status_t hp_tokenizer_load_dir(hp_tokenizer_t *out, const char *dir) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (!exists(path))
        return hp_error(HP_ERR_IO, "%s: no tokenizer.json in this folder (expected a Hugging Face "
                        "model folder with tokenizer.json; tokenizer.model alone is not supported)",
                        dir);
    hp_tokenizer_t t;
    HP_TRY(hp_tokenizer_load(&t, path));
    hp_status_t st = HP_OK;
    snprintf(path, sizeof(path), "%s/special_tokens_map.json", dir);
    if (exists(path)) st = hp_tokenizer_apply_config(t, path);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (st == HP_OK && exists(path)) st = hp_tokenizer_apply_config(t, path);
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    if (st == HP_OK && exists(path)) {
        char *text;
        size_t len;
        st = slurp(path, &text, &len);
        if (st == HP_OK) {
            st = add_template(t, "default", text);
            free(text);
        }
    }
    if (st != HP_OK) {
        hp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}

unsigned hp_tokenizer_config_flags(hp_tokenizer_t t) {
    return (t->add_bos == 1 ? HP_TOKENIZE_ADD_BOS : 0u) | (t->add_eos == 1 ? HP_TOKENIZE_ADD_EOS : 0u);
}

const char *hp_tokenizer_chat_template(hp_tokenizer_t t, const char *name) {
    /* the last one given wins (chat_template.jinja over tokenizer_config.json) */
    for (size_t i = t->n_templates; i-- > 0;)
        if (name ? strcmp(t->template_names[i], name) == 0
                 : (t->n_templates == 1 || strcmp(t->template_names[i], "default") == 0))
            return t->templates[i];
    return NULL;
}

size_t hp_tokenizer_added_count(hp_tokenizer_t t) { return t->n_added; }

int32_t hp_tokenizer_added_id(hp_tokenizer_t t, size_t i) {
    return i < t->n_added ? t->added[i].id : -1;
}
