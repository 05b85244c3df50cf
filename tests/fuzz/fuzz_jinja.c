/* fuzz_jinja: the chat-template interpreter (core/data/jinja*.c) on any
 * template source: parse, then render with a fixed multi-turn conversation
 * (as transformers passes it), under small bounds. Oracle, beyond the
 * sanitizers: a refusal is ACC_EINVAL with a message; output stays within
 * the output bound. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *vars(void)
{
    return json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}], s:s, s:s, s:b, s:n}", "messages", "role",
                     "system", "content", " be brief ", "role", "user", "content", "hi", "role", "assistant",
                     "content", "<think>x</think>hello", "role", "user", "content", "again", "bos_token", "<s>",
                     "eos_token", "</s>", "add_generation_prompt", 1, "tools");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    acc_err err = {0};
    jinja_template *t = NULL;
    if (jinja_parse((const char *)data, size, "data.chat_template", &t, &err) != 0) {
        if (err.code != ACC_EINVAL || err.msg[0] == '\0')
            abort();
        return 0;
    }
    json_t *v = vars();
    jinja_limits lim = {.max_output = 1 << 16, .max_memory = 16 << 20, .max_steps = 100000, .max_depth = 16};
    jinja_output out = {0};
    if (v != NULL && jinja_render(t, v, &lim, &out, &err) == 0) {
        if (out.text == NULL || out.len > lim.max_output)
            abort();
        jinja_output_free(&out);
    } else if (v != NULL && (err.code == 0 || err.msg[0] == '\0')) {
        abort();
    }
    json_decref(v);
    jinja_free(t);
    return 0;
}
