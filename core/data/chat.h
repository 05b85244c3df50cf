/* chat: a conversation rendered with its chat template, tokenized, and the
 * loss mask of what the model is trained on.
 *
 * Contract:
 *   - chat_template_load("auto", tok) uses tokenizer_config.json's
 *     chat_template; any other name is one of the templates shipped with
 *     accumd (chat_named_template()); an unknown name or a tokenizer without
 *     a template is ACC_EINVAL naming `field`.
 *   - chat_encode() renders the messages as transformers'
 *     apply_chat_template does (variables messages, bos_token, eos_token,
 *     add_generation_prompt false, tools and documents None), then
 *     tokenizes the text WITHOUT adding special tokens (the template writes
 *     BOS itself).
 *   - train_on "assistant": the bytes of each assistant turn carry loss --
 *     what a {% generation %} block wrote when the template has them,
 *     otherwise from where render(messages[:i], add_generation_prompt=True)
 *     ends to where render(messages[:i+1]) ends, both verified to be
 *     prefixes of the whole render (a template that rewrites earlier turns
 *     is refused for multi-turn data, see docs/data.md). A token carries
 *     loss when any of its bytes lies in such a span (docs/data.md: how a
 *     token straddling a boundary is found). train_on "all": every token.
 */
#ifndef ACC_CHAT_H
#define ACC_CHAT_H

#include <jansson.h>
#include <stdint.h>

#include "err.h"
#include "jinja.h"
#include "records.h"
#include "tok.h"

typedef enum chat_train_on { CHAT_TRAIN_ASSISTANT = 0, CHAT_TRAIN_ALL } chat_train_on;

/* "assistant" / "all" -> value; -1 when neither. */
int chat_train_on_from_name(const char *name);

/* The Jinja source of a template shipped with accumd ("llama-2", "llama-3",
 * "chatml", "mistral", "tulu"); NULL when there is none of that name. */
const char *chat_named_template(const char *name);
/* The names, NULL-terminated. */
const char *const *chat_named_templates(void);

/* `spec` "auto" or a name; errors name `field` ("data.chat_template"). */
int chat_template_load(const char *spec, const tok_tokenizer *tok, const char *field,
                       jinja_template **out, acc_err *err);

typedef struct chat_sample {
    char *text;     /* the rendered conversation (malloc'd) */
    size_t len;
    tok_ids ids;
    uint8_t *mask;  /* ids.n entries: 1 = the token carries loss */
    size_t ntarget; /* tokens with mask 1 */
} chat_sample;

/* The variables transformers passes for `messages` (a JSON array). */
json_t *chat_vars(const tok_tokenizer *tok, json_t *messages, int add_generation_prompt);

/* Every render and tokenization of one conversation runs under one time
 * bound, the encoder's (tok_limits.time_limit_ms, tok_encoder_begin); past
 * it the error is ACC_EINVAL naming the template's field or "tokenizer". */
int chat_encode(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                json_t *messages, chat_train_on train_on, chat_sample *out, acc_err *err);
/* The same for a parsed record (its messages, or prompt/completion/text as
 * user/assistant turns). */
int chat_encode_record(const jinja_template *tpl, const tok_tokenizer *tok, tok_encoder *enc,
                       const rec_record *rec, chat_train_on train_on, chat_sample *out,
                       acc_err *err);
void chat_sample_free(chat_sample *s);

#endif
