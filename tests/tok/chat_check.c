/* chat_check: accumd's side of the mask test on real tokenizers.
 *   chat_check MODEL_DIR TEMPLATE CONVERSATIONS.jsonl
 * For each conversation ({"messages": [...]}) one line: {"text", "ids",
 * "mask", "runs": [decoded text of each run of loss-carrying tokens],
 * "bos_id"} or {"error"}; chat_mask.py checks them against Hugging Face's
 * tokenizers and the conversation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat.h"

static json_t *runs_of(const tok_tokenizer *tk, const chat_sample *s)
{
    json_t *runs = json_array();
    for (size_t k = 0; k < s->ids.n;) {
        if (!s->mask[k]) {
            k++;
            continue;
        }
        size_t e = k;
        while (e < s->ids.n && s->mask[e])
            e++;
        char *text;
        size_t len;
        acc_err err = {0};
        if (tok_decode(tk, s->ids.v + k, e - k, 0, &text, &len, &err) == 0) {
            json_array_append_new(runs, json_stringn(text, len));
            free(text);
        }
        k = e;
    }
    return runs;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: chat_check MODEL_DIR TEMPLATE CONVERSATIONS.jsonl\n");
        return 2;
    }
    tok_tokenizer *tk;
    tok_encoder *enc;
    jinja_template *t;
    acc_err err = {0};
    if (tok_load_dir(argv[1], &tk, &err) || tok_encoder_new(tk, &enc, &err) ||
        chat_template_load(argv[2], tk, "data.chat_template", &t, &err)) {
        fprintf(stderr, "chat_check: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[3], "r");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *c = json_loadb(line, (size_t)n, 0, NULL);
        if (!c)
            return 1;
        chat_sample s;
        json_t *out;
        if (chat_encode(t, tk, enc, json_object_get(c, "messages"), CHAT_TRAIN_ASSISTANT, &s, &err)) {
            out = json_pack("{ss}", "error", err.msg);
        } else {
            json_t *ids = json_array(), *mask = json_array();
            for (size_t k = 0; k < s.ids.n; k++) {
                json_array_append_new(ids, json_integer(s.ids.v[k]));
                json_array_append_new(mask, json_integer(s.mask[k]));
            }
            out = json_pack("{ss% so so so si}", "text", s.text, s.len, "ids", ids, "mask", mask, "runs",
                            runs_of(tk, &s), "bos_id", tok_get_config(tk)->bos_id);
            chat_sample_free(&s);
        }
        char *js = json_dumps(out, JSON_COMPACT);
        if (!js)
            return 1;
        printf("%s\n", js);
        free(js);
        json_decref(out);
        json_decref(c);
    }
    free(line);
    fclose(f);
    jinja_free(t);
    tok_encoder_free(enc);
    tok_free(tk);
    return 0;
}
