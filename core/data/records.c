/* records: JSONL training samples parsed and validated (records.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "records.h"

static const char *const format_names[] = {"chat", "prompt_completion", "text_jsonl", "text_lines"};
static const char *const role_names[] = {"system", "user", "assistant"};

int rec_format_from_name(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, format_names[i]) == 0)
            return i;
    return -1;
}

const char *rec_role_name(rec_role r)
{
    return role_names[r];
}

static int fail(acc_err *err, const char *field, const char *where, const char *what)
{
    return acc_err_set(err, ACC_EINVAL, field, "%s: %s", where, what);
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* a required string member, as one message of the record */
static int string_member(json_t *o, const char *key, const char *field, const char *where,
                         rec_message *m, acc_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        char what[96];
        snprintf(what, sizeof what, "\"%s\" must be a string", key);
        return fail(err, field, where, what);
    }
    m->content = json_string_value(v);
    m->len = json_string_length(v);
    return 0;
}

/* ShareGPT's role names: "from" human / gpt / system (and the chat names) */
static const char *sharegpt_role(const char *from)
{
    static const char *const names[][2] = {{"human", "user"}, {"user", "user"}, {"gpt", "assistant"},
                                           {"assistant", "assistant"}, {"system", "system"}};
    for (size_t i = 0; from != NULL && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(from, names[i][0]) == 0)
            return names[i][1];
    return NULL;
}

/* A ShareGPT conversation ({"conversations": [{"from": "human", "value":
 * ".."}, ...]}) as the messages the template renders: root["messages"]. */
static int sharegpt_messages(rec_record *r, json_t *conv, const char *where, const char *field, acc_err *err)
{
    json_t *msgs = json_array();
    if (msgs == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "%s: out of memory", where);
    for (size_t i = 0; i < json_array_size(conv); i++) {
        json_t *c = json_array_get(conv, i), *value = json_object_get(c, "value");
        const char *from = json_string_value(json_object_get(c, "from")), *role = sharegpt_role(from);
        char what[160];
        if (!json_is_object(c) || role == NULL || !json_is_string(value)) {
            if (!json_is_object(c))
                snprintf(what, sizeof what, "conversations[%zu] must be an object", i);
            else if (role == NULL)
                snprintf(what, sizeof what, "conversations[%zu].from: %s%.40s%s is not human, gpt or system", i,
                         from ? "\"" : "", from ? from : "missing or not a string", from ? "\"" : "");
            else
                snprintf(what, sizeof what, "conversations[%zu].value: must be a string", i);
            json_decref(msgs);
            return fail(err, field, where, what);
        }
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", value));
    }
    json_object_set_new(r->root, "messages", msgs);
    return 0;
}

static int parse_chat(rec_record *r, const char *where, const char *field, acc_err *err)
{
    json_t *conv = json_object_get(r->root, "conversations");
    if (json_object_get(r->root, "messages") == NULL && json_is_array(conv)) {
        int rc = sharegpt_messages(r, conv, where, field, err);
        if (rc != 0)
            return rc;
    }
    json_t *msgs = json_object_get(r->root, "messages");
    if (!json_is_array(msgs))
        return fail(err, field, where, "\"messages\" must be a list");
    size_t n = json_array_size(msgs);
    if (n == 0)
        return fail(err, field, where, "messages: an empty conversation");
    if (n > 1u << 20)
        return fail(err, field, where, "messages: too many turns");
    r->msg = calloc(n, sizeof *r->msg);
    if (r->msg == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "%s: out of memory", where);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        char what[160];
        if (!json_is_object(m)) {
            snprintf(what, sizeof what, "messages[%zu] must be an object", i);
            return fail(err, field, where, what);
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *rs = json_string_value(role);
        int k = -1;
        for (int j = 0; rs && j < 3; j++)
            if (strcmp(rs, role_names[j]) == 0)
                k = j;
        if (role == NULL) {
            snprintf(what, sizeof what, "messages[%zu].role: missing", i);
            return fail(err, field, where, what);
        }
        if (k < 0) {
            snprintf(what, sizeof what, "messages[%zu].role: %s%.40s%s is not system, user or assistant",
                     i, rs ? "\"" : "", rs ? rs : "not a string", rs ? "\"" : "");
            return fail(err, field, where, what);
        }
        if (k == REC_SYSTEM && i != 0) {
            snprintf(what, sizeof what, "messages[%zu].role: a system message only comes first", i);
            return fail(err, field, where, what);
        }
        if (!json_is_string(content)) {
            snprintf(what, sizeof what, "messages[%zu].content: %s", i,
                     content ? "must be a string" : "missing");
            return fail(err, field, where, what);
        }
        r->msg[i] = (rec_message){(rec_role)k, json_string_value(content), json_string_length(content)};
    }
    r->nmsg = (int)n;
    return 0;
}

/* a plain text line: kept as a JSON string (the root), which must be UTF-8 */
static int text_line(const char *line, size_t len, const char *where, const char *field, rec_record *out,
                     acc_err *err)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;
    out->root = json_stringn(line, len);
    if (out->root == NULL)
        return fail(err, field, where, "not UTF-8 text");
    out->msg = calloc(1, sizeof *out->msg);
    if (out->msg == NULL) {
        rec_clear(out);
        return acc_err_set(err, ACC_ENOMEM, field, "%s: out of memory", where);
    }
    out->nmsg = 1;
    out->msg[0] = (rec_message){REC_ASSISTANT, json_string_value(out->root), json_string_length(out->root)};
    return 0;
}

int rec_parse(rec_format fmt, const char *line, size_t len, const char *where, const char *field,
              rec_record *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    if (blank(line, len))
        return ACC_ENOTFOUND;
    if (fmt == REC_TEXT_LINES)
        return text_line(line, len, where, field, out, err);
    json_error_t je;
    out->root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (out->root == NULL) {
        char what[256];
        /* not je.text: it quotes the line's bytes */
        snprintf(what, sizeof what, "not JSON (column %d)", je.column);
        return fail(err, field, where, what);
    }
    int rc;
    if (!json_is_object(out->root)) {
        rc = fail(err, field, where, "a line must be a JSON object");
    } else if (fmt == REC_CHAT) {
        rc = parse_chat(out, where, field, err);
    } else {
        bool pc = fmt == REC_PROMPT_COMPLETION;
        out->msg = calloc(2, sizeof *out->msg);
        if (out->msg == NULL) {
            rc = acc_err_set(err, ACC_ENOMEM, field, "%s: out of memory", where);
        } else if (pc) {
            out->nmsg = 2;
            out->msg[0].role = REC_USER;
            out->msg[1].role = REC_ASSISTANT;
            rc = string_member(out->root, "prompt", field, where, &out->msg[0], err);
            if (rc == 0)
                rc = string_member(out->root, "completion", field, where, &out->msg[1], err);
        } else {
            out->nmsg = 1;
            out->msg[0].role = REC_ASSISTANT;
            rc = string_member(out->root, "text", field, where, &out->msg[0], err);
        }
    }
    if (rc != 0)
        rec_clear(out);
    return rc;
}

void rec_clear(rec_record *r)
{
    json_decref(r->root);
    free(r->msg);
    memset(r, 0, sizeof *r);
}
