/* The Jinja interpreter's own cases: each refusal names the construct and
 * its line:column, the sandbox bounds hold, generation spans are where the
 * block wrote, and a render of a tiny tokenizer's conversation gives the
 * mask and no doubled BOS. (Byte-exactness against Python Jinja2 is the
 * jinja_ref test.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "chat.h"
#include "jinja.h"

static int render_str(const char *src, const char *vars_json, const jinja_limits *lim, char **out,
                      acc_err *err)
{
    jinja_template *t;
    int rc = jinja_parse(src, strlen(src), "data.chat_template", &t, err);
    if (rc)
        return rc;
    json_t *vars = vars_json ? json_loads(vars_json, 0, NULL) : NULL;
    jinja_output o;
    rc = jinja_render(t, vars, lim, &o, err);
    json_decref(vars);
    jinja_free(t);
    if (rc == 0) {
        *out = o.text;
        free(o.gen);
    }
    return rc;
}

static void expect_out(const char *src, const char *vars, const char *want)
{
    char *out = NULL;
    acc_err err = {0};
    int rc = render_str(src, vars, NULL, &out, &err);
    if (rc)
        fail_msg("%s: %s", src, err.msg);
    assert_string_equal(out, want);
    free(out);
}

/* The error names the construct (`what`) and the position (`pos`). */
static void expect_err(const char *src, const char *vars, const char *what, const char *pos)
{
    char *out = NULL;
    acc_err err = {0};
    int rc = render_str(src, vars, NULL, &out, &err);
    if (rc == 0)
        fail_msg("%s: rendered %s, expected an error", src, out);
    assert_int_equal(rc, ACC_EINVAL);
    assert_string_equal(err.field, "data.chat_template");
    if (!strstr(err.msg, what) || (pos && !strstr(err.msg, pos)))
        fail_msg("%s: error \"%s\" lacks \"%s\" / \"%s\"", src, err.msg, what, pos ? pos : "");
}

static void test_basics(void **state)
{
    (void)state;
    expect_out("a{{ x }}b", "{\"x\": [1, \"s\", null, true, 1.5]}", "a[1, 's', None, True, 1.5]b");
    expect_out("{% if not y %}{{ x | length }}{% endif %}", "{\"x\": \"h\\u00e9\"}", "2");
    expect_out("{{ m.role }}{{ m['role'] }}{{ m.get('role') }}", "{\"m\": {\"role\": \"u\"}}", "uuu");
    expect_err("{{ m.items | length }}", "{\"m\": {\"items\": 1}}", "filter 'length' of a method", "line 1:");
    expect_out("{{ (1, 2) }} {{ [1][5] is defined }}", NULL, "(1, 2) False");
}

static void test_refusals(void **state)
{
    (void)state;
    expect_err("ab\n  {% include 'x' %}", NULL, "statement 'include' is not supported", "line 2:6");
    expect_err("{{ x | wordwrap }}", NULL, "filter 'wordwrap' is not supported", "line 1:8");
    expect_err("{{ x is lower_case }}", NULL, "test 'lower_case' is not supported", "line 1:9");
    expect_err("{{ 'a'.zfill(3) }}", NULL, "method 'zfill' is not supported", "line 1:");
    expect_err("{{ foo() }}", NULL, "'foo' is undefined", "line 1:");
    expect_err("{% for x in y recursive %}{% endfor %}", NULL, "recursive for loops", "line 1:");
    expect_err("{{ 1 +* 2 }}", NULL, "unexpected *", "line 1:7");
    expect_err("{% if x %}", NULL, "expected '{% endif %}'", NULL);
    expect_err("{% break %}", NULL, "'break' outside of a for loop", "line 1:4");
    expect_err("{{ 'abc }}", NULL, "unterminated string", "line 1:4");
    expect_err("{{ x.y }}", NULL, "'y' of an undefined value", "line 1:");
    expect_err("{{ 1 + 'a' }}", NULL, "unsupported operand types for '+': int and str", "line 1:6");
    expect_err("{{ raise_exception('roles must alternate') }}", NULL, "raise_exception: roles must alternate",
               "line 1:");
    expect_err("{% set a.b = 1 %}", "{\"a\": {}}", "only namespace() objects", "line 1:");
    expect_err("{{ x | tojson(ensure_ascii=true) }}", "{\"x\": 1}", "ensure_ascii=True", NULL);
    expect_err("{{ [1, 2][::0] }}", NULL, "slice step cannot be zero", NULL);
    expect_err("{{ 1 // 0 }}", NULL, "division or modulo by zero", NULL);
}

static void test_bounds(void **state)
{
    (void)state;
    char *out = NULL;
    acc_err err = {0};
    /* loops */
    jinja_limits steps = {.max_steps = 1000};
    assert_int_equal(render_str("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
                                NULL, &steps, &out, &err),
                     ACC_EINVAL);
    assert_non_null(strstr(err.msg, "loop iterations"));
    /* output */
    jinja_limits lim = {.max_output = 1000};
    assert_int_equal(render_str("{% for i in range(2000) %}x{% endfor %}", NULL, &lim, &out, &err),
                     ACC_EINVAL);
    assert_non_null(strstr(err.msg, "output exceeds"));
    assert_int_equal(render_str("{{ 'x' * 100000000000 }}", NULL, NULL, &out, &err), ACC_EINVAL);
    expect_out("{{ '' * 100000000000000 }}{{ 1 ** 1000000000000000000 }}{{ (-1) ** 1000000000000000001 }}", NULL, "1-1");
    assert_int_equal(render_str("{{ 3 ** 1000000000000000000 }}", NULL, NULL, &out, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "integer overflow"));
    /* recursion */
    assert_int_equal(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &out,
                                &err),
                     ACC_EINVAL);
    assert_non_null(strstr(err.msg, "nested deeper"));
    /* parse depth */
    char deep[2000];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof(deep) - k, "{{ ");
    for (int i = 0; i < 600; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++)
        deep[k++] = ')';
    snprintf(deep + k, sizeof(deep) - k, " }}");
    assert_int_equal(render_str(deep, NULL, NULL, &out, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "nested too deeply"));
    /* memory */
    jinja_limits mem = {.max_memory = 1 << 20};
    assert_int_equal(render_str("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                                "{% endfor %}",
                                NULL, &mem, &out, &err),
                     ACC_EINVAL);
}

/* Issue 25: a render runs under a time limit (an error naming the field
 * and the limit); substring search and unique are linear, so the slow
 * template's work fits well inside one (each case below takes minutes
 * with a quadratic search or unique, milliseconds with a linear one). */
static void test_time_budget(void **state)
{
    (void)state;
    char *out = NULL;
    acc_err err = {0};
    /* a loop that would run for minutes stops at the deadline */
    jinja_limits lim = {.max_steps = 1L << 40, .max_memory = 1u << 30, .deadline_ns = budget_after_ms(300),
                        .time_limit_ms = 300};
    assert_int_equal(render_str("{% set s = 'ab' * 1000000 %}{% for i in range(1000000) %}{{ s.count('a') }}"
                                "{% endfor %}",
                                NULL, &lim, &out, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "data.chat_template");
    assert_non_null(strstr(err.msg, "time limit of 300 ms"));
    /* defect 1's search: a 2001-byte needle that fails at its last byte, in 4 MB (10 times each way) */
    jinja_limits ten = {.deadline_ns = budget_after_ms(10000), .time_limit_ms = 10000};
    int rc = render_str("{% set s = 'a' * 4000000 %}{% set t = 'a' * 2000 ~ 'b' %}{% set u = s ~ t %}"
                        "{% set ns = namespace(n=0) %}{% for i in range(10) %}"
                        "{% if t in s %}{% set ns.n = ns.n + 1 %}{% endif %}"
                        "{% if t in u %}{% set ns.n = ns.n + 10 %}{% endif %}{% endfor %}"
                        "{{ ns.n }} {{ s.find(t) }} {{ u.find(t) }} {{ s.count('aaa') }}",
                        NULL, &ten, &out, &err);
    if (rc != 0)
        fail_msg("linear search: %s", err.msg);
    assert_string_equal(out, "100 -1 4000000 1333333");
    free(out);
    /* unique of 200,000 items (Jinja2: case-insensitive, first kept, 1 == 1.0 == True) */
    rc = render_str("{{ (range(200000) | list + range(100000) | list) | unique | list | length }}", NULL, &ten,
                    &out, &err);
    if (rc != 0)
        fail_msg("linear unique: %s", err.msg);
    assert_string_equal(out, "200000");
    free(out);
}

/* The searches rewritten for issue 25 give Python's answers (values from
 * Python 3 / Jinja2). */
static void test_string_search(void **state)
{
    (void)state;
    expect_out("{{ 'ab' in 'xxab' }} {{ 'ba' in 'aab' }} {{ '' in 'a' }} {{ 'aab' in 'aab' }} {{ 'aabb' in 'aab' }}",
               NULL, "True False True True False");
    expect_out("{{ 'a,b,,c'.split(',') }} {{ 'a--b--'.split('--') }} {{ 'a,b,c'.split(',', 1) }}", NULL,
               "['a', 'b', '', 'c'] ['a', 'b', ''] ['a', 'b,c']");
    expect_out("{{ 'aaaa'.replace('aa', 'b') }} {{ 'abcabc'.replace('bc', 'X', 1) }} {{ 'abc'.replace('z', 'y') }}",
               NULL, "bb aXabc abc");
    expect_out("{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.rfind('') }} {{ 'abc'.find('') }} "
               "{{ 'aaaa'.rfind('aa') }} {{ 'aaaa'.count('aa') }} {{ 'ab'.find('abc') }} {{ 'héé'.rfind('é') }}",
               NULL, "2 5 3 0 2 2 -1 2");
    expect_out("{{ ['A', 'a', 'b', 1, 1.0, true, 'B', none, none] | unique | list }}", NULL, "['A', 'b', 1, None]");
}

static void test_generation(void **state)
{
    (void)state;
    const char *src = "{% for m in messages %}<{{ m }}>{% if loop.last %}{% generation %}[{{ m }}]"
                      "{% endgeneration %}{% endif %}{% endfor %}";
    jinja_template *t;
    acc_err err = {0};
    assert_int_equal(jinja_parse(src, strlen(src), "f", &t, &err), 0);
    assert_true(jinja_has_generation(t));
    json_t *vars = json_pack("{s[ss]}", "messages", "a", "bc");
    jinja_output o;
    assert_int_equal(jinja_render(t, vars, NULL, &o, &err), 0);
    assert_string_equal(o.text, "<a><bc>[bc]");
    assert_int_equal(o.ngen, 1);
    assert_int_equal(o.gen[0].start, 7);
    assert_int_equal(o.gen[0].end, 11);
    jinja_output_free(&o);
    json_decref(vars);
    jinja_free(t);
}

/* A byte-level tokenizer with BOS/EOS specials: enough to see the mask. */
static const char tiny_tok[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":0,\"content\":\"<s>\",\"special\":true,\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false},"
    "{\"id\":1,\"content\":\"</s>\",\"special\":true,\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
    "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{%s},\"merges\":[]}}";

static tok_tokenizer *tiny(void)
{
    /* the 256 ByteLevel characters as ids 2..257 */
    static char json[40000], vocab[20000];
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        int cp = b;
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)))
            cp = 256 + (b < 33 ? b : b <= 160 ? b - 127 + 33 : 33 + 34 + (b - 173));
        char u[8];
        if (cp < 0x80) {
            if (cp == '"' || cp == '\\')
                snprintf(u, sizeof(u), "\\%c", cp);
            else
                snprintf(u, sizeof(u), "%c", cp);
        } else {
            snprintf(u, sizeof(u), "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
        }
        k += (size_t)snprintf(vocab + k, sizeof(vocab) - k, "%s\"%s\":%d", b ? "," : "", u, b + 2);
    }
    snprintf(json, sizeof(json), tiny_tok, vocab);
    const char *cfg = "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";
    tok_tokenizer *t = NULL;
    acc_err err = {0};
    if (tok_load_mem(json, strlen(json), cfg, strlen(cfg), &t, &err))
        fail_msg("tiny tokenizer: %s", err.msg);
    return t;
}

static void test_mask_and_bos(void **state)
{
    (void)state;
    tok_tokenizer *tk = tiny();
    tok_encoder *enc;
    acc_err err = {0};
    assert_int_equal(tok_encoder_new(tk, &enc, &err), 0);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"},"
                              "{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"assistant\",\"content\":\"k\"}]",
                              0, NULL);
    const char *const *names = chat_named_templates();
    for (int i = 0; names[i]; i++) {
        jinja_template *t;
        assert_int_equal(chat_template_load(names[i], tk, "data.chat_template", &t, &err), 0);
        chat_sample s;
        if (chat_encode(t, tk, enc, msgs, CHAT_TRAIN_ASSISTANT, &s, &err))
            fail_msg("%s: %s", names[i], err.msg);
        /* the masked tokens are exactly the assistant texts + their end of turn */
        char got[256] = "";
        for (size_t k = 0; k < s.ids.n; k++) {
            if (!s.mask[k])
                continue;
            size_t len;
            const char *piece = tok_id_to_token(tk, s.ids.v[k], &len);
            if (s.ids.v[k] == 1)
                strcat(got, "</s>");
            else if (len == 2 && (unsigned char)piece[0] == 0xC4 && (unsigned char)piece[1] == 0xA0)
                strcat(got, " ");
            else if (len == 2 && (unsigned char)piece[0] == 0xC4 && (unsigned char)piece[1] == 0x8A)
                strcat(got, "\n");
            else
                strncat(got, piece, len);
            if (k + 1 == s.ids.n || !s.mask[k + 1])
                strcat(got, "|");
        }
        const char *want = !strcmp(names[i], "llama-2")   ? " yo </s>| k </s>|"
                           : !strcmp(names[i], "mistral") ? " yo</s>| k</s>|"
                           : !strcmp(names[i], "tulu")    ? "yo</s>|k</s>|" /* the newline after a </s> opens the next turn, as the released Tulu-3 template renders */
                           : !strcmp(names[i], "chatml")  ? "yo<|im_end|>\n|k<|im_end|>\n|"
                                                          : "yo<|eot_id|>|k<|eot_id|>|";
        if (strcmp(got, want))
            fail_msg("%s: masked \"%s\", want \"%s\"", names[i], got, want);
        /* BOS once: the template's; the tokenizer adds none */
        size_t nbos = 0;
        for (size_t k = 0; k < s.ids.n; k++)
            nbos += s.ids.v[k] == 0;
        size_t want_bos = !strcmp(names[i], "llama-2") ? 2 : (!strcmp(names[i], "mistral") ? 1 : 0);
        if (!strcmp(names[i], "llama-3"))
            want_bos = 1;
        assert_int_equal(nbos, want_bos);
        if (want_bos)
            assert_int_equal(s.ids.v[0], 0), assert_int_not_equal(s.ids.v[1], 0);
        chat_sample_free(&s);
        assert_int_equal(chat_encode(t, tk, enc, msgs, CHAT_TRAIN_ALL, &s, &err), 0);
        assert_int_equal(s.ntarget, s.ids.n);
        chat_sample_free(&s);
        jinja_free(t);
    }
    jinja_template *t;
    assert_int_equal(chat_template_load("auto", tk, "data.chat_template", &t, &err), ACC_EINVAL);
    assert_int_equal(chat_template_load("vicuna", tk, "data.chat_template", &t, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "vicuna"));
    /* a template that rewrites earlier turns is refused, naming the turn */
    const char *rewrite = "{% for m in messages %}{{ m.content if loop.last else 'X' }}{% endfor %}";
    assert_int_equal(jinja_parse(rewrite, strlen(rewrite), "data.chat_template", &t, &err), 0);
    chat_sample s;
    assert_int_equal(chat_encode(t, tk, enc, msgs, CHAT_TRAIN_ASSISTANT, &s, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "messages[1]"));
    jinja_free(t);
    json_decref(msgs);
    tok_encoder_free(enc);
    tok_free(tk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),     cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bounds),     cmocka_unit_test(test_generation),
        cmocka_unit_test(test_mask_and_bos),
        cmocka_unit_test(test_time_budget), cmocka_unit_test(test_string_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
