/* chat_templates: the chat templates shipped with accumd, written for
 * accumd from the published prompt formats of each model family (chat.h).
 * Each raises an error for roles it cannot place instead of guessing.
 */
#include <string.h>

#include "chat.h"

/* LLaMA-2 chat: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s> */
static const char llama2[] =
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "  {%- set system = messages[0]['content'] | trim -%}\n"
    "  {%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "  {%- set system = none -%}\n"
    "  {%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for m in turns -%}\n"
    "  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "    {{- raise_exception('llama-2: after an optional system message the roles must alternate user, assistant, user, ...') -}}\n"
    "  {%- endif -%}\n"
    "  {%- if m['role'] == 'user' -%}\n"
    "    {%- if loop.first and system is not none -%}\n"
    "      {{- bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + m['content'] | trim + ' [/INST]' -}}\n"
    "    {%- else -%}\n"
    "      {{- bos_token + '[INST] ' + m['content'] | trim + ' [/INST]' -}}\n"
    "    {%- endif -%}\n"
    "  {%- else -%}\n"
    "    {{- ' ' + m['content'] | trim + ' ' + eos_token -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n";

/* LLaMA-3 instruct: <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> */
static const char llama3[] =
    "{{- bos_token -}}\n"
    "{%- for m in messages -%}\n"
    "  {{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}\n";

/* ChatML: <|im_start|>{role}\n{content}<|im_end|>\n */
static const char chatml[] =
    "{%- for m in messages -%}\n"
    "  {%- if m['role'] not in ['system', 'user', 'assistant'] -%}\n"
    "    {{- raise_exception('chatml: unknown role ' + m['role']) -}}\n"
    "  {%- endif -%}\n"
    "  {{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

/* Mistral instruct (v0.1): <s>[INST] {user} [/INST] {answer}</s>[INST] ...; the
 * format has no system role: a system message opens the first instruction. */
static const char mistral[] =
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "  {%- set system = messages[0]['content'] | trim + '\\n\\n' -%}\n"
    "  {%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "  {%- set system = '' -%}\n"
    "  {%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{{- bos_token -}}\n"
    "{%- for m in turns -%}\n"
    "  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "    {{- raise_exception('mistral: after an optional system message the roles must alternate user, assistant, user, ...') -}}\n"
    "  {%- endif -%}\n"
    "  {%- if m['role'] == 'user' -%}\n"
    "    {{- '[INST] ' + (system if loop.first else '') + m['content'] | trim + ' [/INST]' -}}\n"
    "  {%- else -%}\n"
    "    {{- ' ' + m['content'] | trim + eos_token -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n";

/* Tulu 3: <|system|>\n..\n<|user|>\n..\n<|assistant|>\n{answer}</s>\n, with no
 * newline after the last message's </s> (as the released Tulu-3 template
 * renders); the generation prompt only after a last message. Unknown roles
 * raise instead of vanishing. */
static const char tulu[] =
    "{%- for m in messages -%}\n"
    "  {%- if m['role'] == 'system' -%}\n"
    "    {{- '<|system|>\\n' + m['content'] + '\\n' -}}\n"
    "  {%- elif m['role'] == 'user' -%}\n"
    "    {{- '<|user|>\\n' + m['content'] + '\\n' -}}\n"
    "  {%- elif m['role'] == 'assistant' -%}\n"
    "    {{- '<|assistant|>\\n' + m['content'] + eos_token + ('' if loop.last else '\\n') -}}\n"
    "  {%- else -%}\n"
    "    {{- raise_exception('tulu: unknown role ' + m['role']) -}}\n"
    "  {%- endif -%}\n"
    "  {%- if loop.last and add_generation_prompt -%}\n"
    "    {{- '<|assistant|>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n";

static const char *const names[] = {"llama-2", "llama-3", "chatml", "mistral", "tulu", NULL};
static const char *const sources[] = {llama2, llama3, chatml, mistral, tulu};

const char *chat_named_template(const char *name)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return sources[i];
    return NULL;
}

const char *const *chat_named_templates(void)
{
    return names;
}
