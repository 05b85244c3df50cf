/* fuzz_jinja_budget: the chat-template interpreter (core/data/jinja*.c) on
 * any template source, rendered under a small time budget (issue 25:
 * template work on untrusted input is bounded) with generous step and
 * memory bounds, so the deadline is what stops a slow template. Oracle,
 * beyond the sanitizers: a render ends -- answer or ACC_EINVAL naming the
 * field -- within a few times its time limit; a render that stops at the
 * deadline says so and names the limit. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { LIMIT_MS = 50, SLACK_MS = 2000 };

static json_t *vars(void)
{
    return json_pack("{s:[{s:s,s:s},{s:s,s:s}], s:s, s:s, s:b}", "messages", "role", "user", "content",
                     "hi there", "role", "assistant", "content", "hello", "bos_token", "<s>", "eos_token", "</s>",
                     "add_generation_prompt", 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    acc_err err = {0};
    jinja_template *t = NULL;
    if (jinja_parse((const char *)data, size, "chat_template", &t, &err) != 0) {
        if (err.code != ACC_EINVAL || err.msg[0] == '\0')
            abort();
        return 0;
    }
    json_t *v = vars();
    jinja_limits lim = {.max_output = 4u << 20, .max_memory = 64u << 20, .max_steps = 1L << 40,
                        .deadline_ns = budget_after_ms(LIMIT_MS), .time_limit_ms = LIMIT_MS};
    int64_t t0 = budget_now_ns();
    jinja_output out = {0};
    int rc = v != NULL ? jinja_render(t, v, &lim, &out, &err) : 0;
    if ((budget_now_ns() - t0) / 1000000 > LIMIT_MS + SLACK_MS)
        abort(); /* the deadline did not stop it */
    if (v != NULL && rc == 0) {
        if (out.text == NULL || out.len > lim.max_output)
            abort();
        jinja_output_free(&out);
    } else if (v != NULL) {
        if (err.code == 0 || err.msg[0] == '\0' || strcmp(err.field, "chat_template") != 0)
            abort();
        if (strstr(err.msg, "time limit") != NULL && strstr(err.msg, "50 ms") == NULL)
            abort();
    }
    json_decref(v);
    jinja_free(t);
    return 0;
}
