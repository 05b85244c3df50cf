/* chat: conversations to token ids and loss masks (chat.h). */
#include <stdlib.h>
#include <string.h>

#include "chat.h"

int chat_train_on_from_name(const char *name)
{
    if (!strcmp(name, "assistant"))
        return CHAT_TRAIN_ASSISTANT;
    if (!strcmp(name, "all"))
        return CHAT_TRAIN_ALL;
    return -1;
}

int chat_template_load(const char *spec, const tok_tokenizer *tok, const char *field,
                       jinja_template **out, acc_err *err)
{
    const char *src;
    if (!strcmp(spec, "auto")) {
        src = tok ? tok_get_config(tok)->chat_template : NULL;
        if (!src)
            return acc_err_set(err, ACC_EINVAL, field,
                               "\"auto\": the tokenizer has no chat_template in tokenizer_config.json; "
                               "name one of accumd's (llama-2, llama-3, chatml, mistral, tulu)");
    } else {
        src = chat_named_template(spec);
        if (!src)
            return acc_err_set(err, ACC_EINVAL, field,
                               "\"%s\" is not a chat template (\"auto\", llama-2, llama-3, chatml, "
                               "mistral, tulu)", spec);
    }
    return jinja_parse(src, strlen(src), field, out, err);
}

json_t *chat_vars(const tok_tokenizer *tok, json_t *messages, int add_generation_prompt)
{
    const tok_config *c = tok ? tok_get_config(tok) : NULL;
    return json_pack("{sO sb sn sn ss ss}", "messages", messages, "add_generation_prompt",
                     add_generation_prompt, "tools", "documents", "bos_token", c ? c->bos_token : "",
                     "eos_token", c ? c->eos_token : "");
}

/* Renders run under the encoder's deadline (tok_encoder_begin). */
static int render(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc, json_t *messages,
                  int agp, jinja_output *o, acc_err *err)
{
    json_t *vars = chat_vars(tok, messages, agp);
    if (!vars)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    jinja_limits lim = {.deadline_ns = tok_encoder_deadline(enc), .time_limit_ms = tok_encoder_time_limit_ms(enc)};
    int rc = jinja_render(tpl, vars, &lim, o, err);
    json_decref(vars);
    return rc;
}

/* Render messages[0..n) (a new array sharing the messages). */
static int render_prefix(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                         json_t *messages, size_t n, int agp, jinja_output *o, acc_err *err)
{
    json_t *pre = json_array();
    if (!pre)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    for (size_t i = 0; i < n; i++)
        if (json_array_append(pre, json_array_get(messages, i))) {
            json_decref(pre);
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        }
    int rc = render(tpl, tok, enc, pre, agp, o, err);
    json_decref(pre);
    return rc;
}

typedef struct spans {
    jinja_span *v;
    size_t n, cap;
} spans;

static int spans_push(spans *s, size_t a, size_t b)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        jinja_span *v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].start = a;
    s->v[s->n++].end = b;
    return 0;
}

static int is_prefix(const jinja_output *p, const jinja_output *full)
{
    return p->len <= full->len && memcmp(p->text, full->text, p->len) == 0;
}

/* Assistant spans by prefix renders, each verified against the whole. */
static int prefix_spans(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                        json_t *messages, const jinja_output *full, spans *sp, acc_err *err)
{
    size_t n = json_array_size(messages), prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        const char *role = json_string_value(json_object_get(json_array_get(messages, i), "role"));
        if (!role || strcmp(role, "assistant"))
            continue;
        jinja_output a, b;
        int rc = render_prefix(tpl, tok, enc, messages, i, 1, &a, err);
        if (rc)
            return rc;
        rc = render_prefix(tpl, tok, enc, messages, i + 1, 0, &b, err);
        if (rc) {
            jinja_output_free(&a);
            return rc;
        }
        int ok = is_prefix(&a, full) && is_prefix(&b, full) && a.len <= b.len && a.len >= prev_end;
        size_t s = a.len, e = b.len;
        jinja_output_free(&a);
        jinja_output_free(&b);
        if (!ok)
            return acc_err_set(err, ACC_EINVAL, "data.chat_template",
                               "messages[%zu]: the template renders the conversation up to this "
                               "assistant turn differently from the whole conversation (it rewrites "
                               "earlier turns, as Qwen3's does with <think> blocks), so its tokens "
                               "cannot be masked exactly; use a template with {%% generation %%} "
                               "blocks, a named template, or train_on \"all\"", i);
        if (spans_push(sp, s, e))
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        prev_end = e;
    }
    return 0;
}

/* Tokens of text[0..len) (no special tokens added). */
static int encode(tok_encoder *enc, const char *text, size_t len, tok_ids *ids, acc_err *err)
{
    ids->n = 0;
    return tok_encode(enc, text, len, 0, ids, err);
}

/* First token of the span starting at byte b: the length of the common
 * prefix of encode(text[:b]) and the whole (a token straddling b counts
 * as inside). */
static int token_start(tok_encoder *enc, const chat_sample *s, size_t b, tok_ids *tmp, size_t *out,
                       acc_err *err)
{
    int rc = encode(enc, s->text, b, tmp, err);
    if (rc)
        return rc;
    size_t m = 0;
    while (m < tmp->n && m < s->ids.n && tmp->v[m] == s->ids.v[m])
        m++;
    *out = m;
    return 0;
}

/* One past the last token of the span ending at byte e: the whole's
 * length less the common suffix of encode(text[e:]) and the whole. */
static int token_end(tok_encoder *enc, const chat_sample *s, size_t e, tok_ids *tmp, size_t *out,
                     acc_err *err)
{
    int rc = encode(enc, s->text + e, s->len - e, tmp, err);
    if (rc)
        return rc;
    size_t q = 0;
    while (q < tmp->n && q < s->ids.n && tmp->v[tmp->n - 1 - q] == s->ids.v[s->ids.n - 1 - q])
        q++;
    *out = s->ids.n - q;
    return 0;
}

static int encode_conversation(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                               json_t *messages, chat_train_on train_on, chat_sample *out, acc_err *err)
{
    jinja_output full;
    int rc = render(tpl, tok, enc, messages, 0, &full, err);
    if (rc)
        return rc;
    out->text = full.text;
    out->len = full.len;
    spans sp = {0};
    tok_ids tmp = {0};
    if (train_on == CHAT_TRAIN_ASSISTANT) {
        if (jinja_has_generation(tpl)) {
            for (size_t i = 0; i < full.ngen && !rc; i++)
                if (spans_push(&sp, full.gen[i].start, full.gen[i].end))
                    rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        } else {
            rc = prefix_spans(tpl, tok, enc, messages, &full, &sp, err);
        }
    }
    free(full.gen);
    if (!rc)
        rc = encode(enc, out->text, out->len, &out->ids, err);
    if (!rc && !(out->mask = calloc(out->ids.n ? out->ids.n : 1, 1)))
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    if (!rc && train_on == CHAT_TRAIN_ALL) {
        memset(out->mask, 1, out->ids.n);
        out->ntarget = out->ids.n;
    }
    for (size_t i = 0; i < sp.n && !rc; i++) {
        if (sp.v[i].start >= sp.v[i].end)
            continue;
        size_t a, b;
        rc = token_start(enc, out, sp.v[i].start, &tmp, &a, err);
        if (!rc)
            rc = token_end(enc, out, sp.v[i].end, &tmp, &b, err);
        for (size_t k = a; !rc && k < b; k++)
            if (!out->mask[k]) {
                out->mask[k] = 1;
                out->ntarget++;
            }
    }
    free(sp.v);
    tok_ids_free(&tmp);
    if (rc)
        chat_sample_free(out);
    return rc;
}

int chat_encode(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                json_t *messages, chat_train_on train_on, chat_sample *out, acc_err *err)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_array(messages))
        return acc_err_set(err, ACC_EINVAL, "messages", "must be an array");
    /* one time bound for every render and encode of the conversation */
    int64_t saved = tok_encoder_begin(enc);
    int rc = encode_conversation(tpl, tok, enc, messages, train_on, out, err);
    tok_encoder_end(enc, saved);
    return rc;
}

int chat_encode_record(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                       const rec_record *rec, chat_train_on train_on, chat_sample *out,
                       acc_err *err)
{
    json_t *msgs = json_object_get(rec->root, "messages");
    if (msgs)
        return chat_encode(tpl, tok, enc, msgs, train_on, out, err);
    json_t *arr = json_array();
    for (int i = 0; arr && i < rec->nmsg; i++) {
        json_t *m = json_pack("{ss ss%}", "role", rec_role_name(rec->msg[i].role), "content",
                              rec->msg[i].content, rec->msg[i].len);
        if (!m || json_array_append_new(arr, m)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    if (!arr)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    int rc = chat_encode(tpl, tok, enc, arr, train_on, out, err);
    json_decref(arr);
    return rc;
}

void chat_sample_free(chat_sample *s)
{
    free(s->text);
    free(s->mask);
    tok_ids_free(&s->ids);
    memset(s, 0, sizeof(*s));
}
