/* tok_dump: encode and decode each line of a JSONL file ({"text": ...})
 * with a tokenizer.json, printing one JSON object a line:
 *   {"ids": [...], "ids_special": [...], "decoded": "..."}
 * -- the same shape tok_ref.mjs prints from Hugging Face's tokenizers, so
 * that test_tok_ref.py compares the two line by line. Usage:
 *   tok_dump TOKENIZER_DIR INPUT.jsonl > OUT.jsonl
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok.h"

static json_t *ids_json(const tok_ids *ids)
{
    json_t *a = json_array();
    for (size_t i = 0; i < ids->n; i++)
        json_array_append_new(a, json_integer(ids->v[i]));
    return a;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tok_dump TOKENIZER_DIR INPUT.jsonl\n");
        return 2;
    }
    acc_err err = {0};
    tok_tokenizer *t;
    tok_encoder *e;
    if (tok_load_dir(argv[1], &t, &err) != 0 || tok_encoder_new(t, &e, &err) != 0) {
        fprintf(stderr, "tok_dump: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "r");
    if (f == NULL) {
        perror(argv[2]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        json_t *tx = json_object_get(j, "text");
        if (!json_is_string(tx)) {
            fprintf(stderr, "tok_dump: bad input line: %s\n", je.text);
            return 1;
        }
        tok_ids a = {0}, b = {0};
        char *dec = NULL;
        size_t dlen = 0;
        if (tok_encode(e, json_string_value(tx), json_string_length(tx), 0, &a, &err) != 0 ||
            tok_encode(e, json_string_value(tx), json_string_length(tx), TOK_ADD_SPECIAL, &b,
                       &err) != 0 ||
            tok_decode(t, a.v, a.n, 0, &dec, &dlen, &err) != 0) {
            fprintf(stderr, "tok_dump: %s\n", err.msg);
            rc = 1;
            break;
        }
        json_t *o = json_object();
        json_object_set_new(o, "ids", ids_json(&a));
        json_object_set_new(o, "ids_special", ids_json(&b));
        json_object_set_new(o, "decoded", json_stringn(dec, dlen));
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(s);
        free(s);
        free(dec);
        json_decref(o);
        json_decref(j);
        tok_ids_free(&a);
        tok_ids_free(&b);
    }
    free(line);
    fclose(f);
    tok_encoder_free(e);
    tok_free(t);
    return rc;
}
