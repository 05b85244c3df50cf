/* api_tokenize: POST /v1/tokenize, what the model will see.
 *
 *   {"tokenizer": DIR, "text": "...", "add_special_tokens": true}
 *   {"tokenizer": DIR, "messages": [...], "chat_template": "auto",
 *    "train_on": "assistant"}
 *
 * answers {"ids": [..], "tokens": [..], "loss": [0|1, ..], "num_tokens",
 * "num_loss_tokens"} (plus "text", the rendered conversation, for
 * messages). loss[i] is 1 when token i carries loss as a training target,
 * exactly as data_prep.h prepares a sample of the same record: the text
 * form is a text_jsonl sample (encode with the tokenizer's special tokens,
 * then EOS; every token), the messages form a chat sample (chat.h: the
 * template rendered, tokenized without adding special tokens; with
 * train_on "assistant" only the assistant turns and their end-of-turn
 * tokens). (In training the first token is never a target.)
 *
 * DIR is resolved as the spec's input paths are (under data_roots,
 * job_spec_resolve_input), and tokenizer.json / tokenizer_config.json in it
 * through safepath.h (tok_load_under). Every bad input is ACC_EINVAL naming the field
 * ("messages[1].role", "chat_template", "tokenizer"). The template and the
 * tokenizer are untrusted: rendering and encoding run under tok_limits from
 * the config (render_time_limit_ms, tokenizer_match_limit), and past one the
 * answer is a 400 naming "chat_template" or "tokenizer" and the limit. api_tokenize_compute
 * opens files and may take long: it is the part to run off the loop
 * thread.
 */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "chat.h"
#include "job_spec.h"
#include "records.h"
#include "tok.h"

static int str_member(const json_t *o, const char *key, const char **out, acc_err *err)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return acc_err_set(err, ACC_EINVAL, key, "%s must be a string", key);
    *out = json_string_value(v);
    return 0;
}

static int check_request(const json_t *req, acc_err *err)
{
    static const char *const keys[] = {"tokenizer", "text", "messages", "chat_template", "train_on",
                                       "add_special_tokens", NULL};
    if (!json_is_object(req))
        return acc_err_set(err, ACC_EINVAL, "", "the request must be a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)req, key, v) {
        int ok = 0;
        for (int i = 0; keys[i] != NULL; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok)
            return acc_err_set(err, ACC_EINVAL, key, "unknown key '%s'", key);
    }
    int has_text = json_object_get(req, "text") != NULL, has_msgs = json_object_get(req, "messages") != NULL;
    if (has_text == has_msgs)
        return acc_err_set(err, ACC_EINVAL, has_text ? "messages" : "text",
                           "give exactly one of \"text\" and \"messages\"");
    if (has_text && (json_object_get(req, "chat_template") || json_object_get(req, "train_on")))
        return acc_err_set(err, ACC_EINVAL, json_object_get(req, "chat_template") ? "chat_template" : "train_on",
                           "chat_template and train_on go with \"messages\"");
    if (has_msgs && json_object_get(req, "add_special_tokens"))
        return acc_err_set(err, ACC_EINVAL, "add_special_tokens",
                           "add_special_tokens goes with \"text\" (a chat template writes its own)");
    json_t *ast = json_object_get(req, "add_special_tokens");
    if (ast != NULL && !json_is_boolean(ast))
        return acc_err_set(err, ACC_EINVAL, "add_special_tokens", "add_special_tokens must be true or false");
    return 0;
}

static int load_tokenizer(const acc_conf *conf, const json_t *req, tok_tokenizer **tok, acc_err *err)
{
    const char *dir;
    int rc = str_member(req, "tokenizer", &dir, err);
    if (rc != 0)
        return rc;
    if (dir == NULL)
        return acc_err_set(err, ACC_EINVAL, "tokenizer", "tokenizer (a directory with tokenizer.json) is required");
    char path[PATH_MAX];
    if (strlen(dir) >= sizeof path)
        return acc_err_set(err, ACC_EINVAL, "tokenizer", "tokenizer is too long");
    snprintf(path, sizeof path, "%s", dir);
    if ((rc = job_spec_resolve_input(path, sizeof path, conf, "tokenizer", err)) != 0)
        return rc;
    rc = tok_load_under(conf->data_roots, path, "tokenizer", tok, err);
    if (rc != 0 && err != NULL)
        snprintf(err->field, sizeof err->field, "tokenizer");
    return rc;
}

/* The messages through records.h, so the preview refuses what data does. */
static int check_messages(const json_t *req, acc_err *err)
{
    json_t *line = json_pack("{s:O}", "messages", json_object_get(req, "messages"));
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    rec_record r;
    int rc = rec_parse(REC_CHAT, text, strlen(text), "request", "messages", &r, err);
    free(text);
    if (rc == ACC_ENOTFOUND)
        rc = acc_err_set(err, ACC_EINVAL, "messages", "messages: an empty conversation");
    if (rc == 0)
        rec_clear(&r);
    else if (err != NULL) { /* the field is the place in the messages ("messages[1].role") */
        const char *m = strstr(err->msg, "messages");
        if (m != NULL) {
            size_t k = strcspn(m, ": ");
            snprintf(err->field, sizeof err->field, "%.*s", (int)k, m);
        }
    }
    return rc;
}

static int encode_messages(const json_t *req, const tok_tokenizer *tok, tok_encoder *enc, chat_sample *cs,
                           acc_err *err)
{
    const char *tname, *on_name;
    int rc;
    if ((rc = str_member(req, "chat_template", &tname, err)) || (rc = str_member(req, "train_on", &on_name, err)) ||
        (rc = check_messages(req, err)))
        return rc;
    int on = chat_train_on_from_name(on_name ? on_name : "assistant");
    if (on < 0)
        return acc_err_set(err, ACC_EINVAL, "train_on", "train_on must be assistant or all, got '%s'", on_name);
    jinja_template *tpl = NULL;
    if ((rc = chat_template_load(tname ? tname : "auto", tok, "chat_template", &tpl, err)) != 0)
        return rc;
    rc = chat_encode(tpl, tok, enc, json_object_get(req, "messages"), (chat_train_on)on, cs, err);
    jinja_free(tpl);
    return rc;
}

static int encode_text(const json_t *req, const tok_tokenizer *tok, tok_encoder *enc, chat_sample *cs,
                       acc_err *err)
{
    const char *text;
    int rc = str_member(req, "text", &text, err);
    if (rc != 0)
        return rc;
    if (text == NULL)
        return acc_err_set(err, ACC_EINVAL, "text", "text must be a string");
    json_t *ast = json_object_get(req, "add_special_tokens");
    int special = ast == NULL || json_is_true(ast);
    size_t len = json_string_length(json_object_get(req, "text"));
    if ((rc = tok_encode(enc, text, len, special ? TOK_ADD_SPECIAL : 0, &cs->ids, err)) != 0) {
        if (err != NULL && err->field[0] == '\0') /* a bound names "tokenizer" itself */
            snprintf(err->field, sizeof err->field, "text");
        return rc;
    }
    int32_t eos = tok_get_config(tok)->eos_id;
    if (special && eos >= 0 && (cs->ids.n == 0 || cs->ids.v[cs->ids.n - 1] != eos) && tok_ids_push(&cs->ids, eos))
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    cs->mask = malloc(cs->ids.n ? cs->ids.n : 1);
    if (cs->mask == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    memset(cs->mask, 1, cs->ids.n);
    cs->ntarget = cs->ids.n;
    return 0;
}

static json_t *answer(const tok_tokenizer *tok, const chat_sample *cs)
{
    json_t *ids = json_array(), *toks = json_array(), *loss = json_array();
    size_t nloss = 0;
    for (size_t i = 0; ids && toks && loss && i < cs->ids.n; i++) {
        size_t l = 0;
        const char *s = tok_id_to_token(tok, cs->ids.v[i], &l);
        json_array_append_new(ids, json_integer(cs->ids.v[i]));
        json_array_append_new(toks, s ? json_stringn(s, l) : json_null());
        json_array_append_new(loss, json_integer(cs->mask[i] != 0));
        nloss += cs->mask[i] != 0;
    }
    json_t *o = json_pack("{s:o*, s:o*, s:o*, s:I, s:I}", "ids", ids, "tokens", toks, "loss", loss, "num_tokens",
                          (json_int_t)cs->ids.n, "num_loss_tokens", (json_int_t)nloss);
    if (o != NULL && cs->text != NULL)
        json_object_set_new(o, "text", json_stringn(cs->text, cs->len));
    return o;
}

int api_tokenize_compute(const acc_conf *conf, const char *body, size_t len, json_t **out, acc_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *req = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (req == NULL)
        return acc_err_set(err, ACC_EINVAL, "", "malformed JSON at line %d column %d: %s", je.line, je.column,
                           je.text);
    tok_tokenizer *tok = NULL;
    tok_encoder *enc = NULL;
    chat_sample cs;
    memset(&cs, 0, sizeof cs);
    int rc = check_request(req, err);
    if (rc == 0)
        rc = load_tokenizer(conf, req, &tok, err);
    if (rc == 0)
        rc = tok_encoder_new(tok, &enc, err);
    if (rc == 0) { /* the request's text, template and tokenizer are untrusted: bounded */
        tok_limits lim;
        tok_limits_default(&lim);
        lim.time_limit_ms = conf->render_time_limit_ms;
        lim.match_limit = (uint32_t)conf->tokenizer_match_limit;
        tok_encoder_set_limits(enc, &lim);
        rc = json_object_get(req, "messages") ? encode_messages(req, tok, enc, &cs, err)
                                              : encode_text(req, tok, enc, &cs, err);
    }
    if (rc == 0 && (*out = answer(tok, &cs)) == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    chat_sample_free(&cs);
    tok_encoder_free(enc);
    tok_free(tok);
    json_decref(req);
    return rc;
}

/* The route: computed on libuv's thread pool (api_defer_json), so the
 * tokenizer directory is opened and read there, never on the loop thread. */
static int tokenize_compute(const void *conf, const char *body, size_t len, json_t **out, acc_err *err)
{
    return api_tokenize_compute(conf, body, len, out, err);
}

void api_tokenize(api_server *s, const api_request *req, api_response *resp)
{
    /* heavy: bounded in number (heavy_requests_max / _per_user) so the pool keeps room */
    api_defer_json_heavy(s, req, resp, tokenize_compute, api_server_conf(s), JSON_COMPACT,
                         "empty body: send {\"tokenizer\": DIR, \"text\"|\"messages\"}");
}
