/* records: one training sample of the JSONL data formats, parsed and
 * validated.
 *
 *   chat               {"messages": [{"role": "system"|"user"|"assistant",
 *                        "content": "..."}, ...], ...}   (allenai/tulu-3 style;
 *                      other top-level keys such as "id" and "source" are kept
 *                      and ignored)
 *                      ShareGPT's form is read as chat too:
 *                      {"conversations": [{"from": "human"|"gpt"|"system",
 *                        "value": "..."}, ...]} becomes root["messages"]
 *                      (human -> user, gpt -> assistant) when the record
 *                      has no "messages"
 *   prompt_completion  {"prompt": "...", "completion": "..."}  (loss on the
 *                      completion)
 *   text_jsonl         {"text": "..."}
 *   text_lines         a line of plain text (no JSON): the line is the text
 *
 * Every problem is ACC_EINVAL with the place in the message and the field:
 * "train.jsonl:12: messages[1].role: \"narrator\" is not system, user or
 * assistant". A conversation needs at least one message; a system message
 * may only come first. (Whether a conversation without an assistant turn is
 * kept is the caller's choice: with train_on "assistant" nothing of it would
 * carry loss.) The record keeps the parsed JSON (rec->root) so that the
 * chat template renders exactly what the file holds.
 */
#ifndef ACC_RECORDS_H
#define ACC_RECORDS_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"

typedef enum rec_format {
    REC_CHAT = 0,
    REC_PROMPT_COMPLETION,
    REC_TEXT_JSONL,
    REC_TEXT_LINES, /* a plain text line, not JSON: the text as one assistant turn */
} rec_format;

typedef enum rec_role { REC_SYSTEM = 0, REC_USER, REC_ASSISTANT } rec_role;

typedef struct rec_message {
    rec_role role;
    const char *content; /* UTF-8, points into root */
    size_t len;
} rec_message;

typedef struct rec_record {
    json_t *root;                /* the line's object (owned) */
    rec_message *msg;            /* chat: the messages; prompt_completion: the
                                    prompt as user, the completion as assistant;
                                    text_jsonl: the text as one assistant turn */
    int nmsg;
} rec_record;

/* "chat", "prompt_completion", "text_jsonl", "text_lines" -> format; -1 when none. */
int rec_format_from_name(const char *name);
/* "system" / "user" / "assistant" */
const char *rec_role_name(rec_role r);

/* Parse one line (without its newline). `where` ("file:line") prefixes
 * every message; `field` is the spec field the data came from
 * ("data.train"). Empty and whitespace-only lines are ACC_ENOTFOUND (skip
 * them), not errors. */
int rec_parse(rec_format fmt, const char *line, size_t len, const char *where, const char *field,
              rec_record *out, acc_err *err);
void rec_clear(rec_record *r);

#endif
