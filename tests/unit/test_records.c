/* JSONL samples: each format parsed, and each bad-input class refused with
 * its file:line and the place inside the line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "records.h"

static void test_formats(void **state)
{
    rec_record r;
    acc_err err = {0};
    const char *chat = "{\"id\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\" hello \"}],"
                       "\"source\":\"s\"}";
    assert_int_equal(rec_parse(REC_CHAT, chat, strlen(chat), "a.jsonl:1", "data.train", &r, &err), 0);
    assert_int_equal(r.nmsg, 3);
    assert_int_equal(r.msg[0].role, REC_SYSTEM);
    assert_int_equal(r.msg[2].role, REC_ASSISTANT);
    assert_int_equal(r.msg[2].len, 7);
    assert_memory_equal(r.msg[2].content, " hello ", 7);
    rec_clear(&r);
    const char *pc = "{\"prompt\":\"2+2=\",\"completion\":\"4\"}";
    assert_int_equal(rec_parse(REC_PROMPT_COMPLETION, pc, strlen(pc), "b:1", "data.train", &r, &err), 0);
    assert_int_equal(r.nmsg, 2);
    assert_int_equal(r.msg[0].role, REC_USER);
    assert_memory_equal(r.msg[1].content, "4", 1);
    rec_clear(&r);
    const char *tx = "{\"text\":\"plain\"}";
    assert_int_equal(rec_parse(REC_TEXT_JSONL, tx, strlen(tx), "c:1", "data.train", &r, &err), 0);
    assert_int_equal(r.nmsg, 1);
    rec_clear(&r);
    assert_int_equal(rec_parse(REC_CHAT, "  \r", 3, "c:2", "data.train", &r, &err), ACC_ENOTFOUND);
    assert_int_equal(rec_format_from_name("prompt_completion"), REC_PROMPT_COMPLETION);
    assert_int_equal(rec_format_from_name("csv"), -1);
}

static void refused(rec_format f, const char *line, const char *needle)
{
    rec_record r;
    acc_err err = {0};
    assert_int_equal(rec_parse(f, line, strlen(line), "train.jsonl:12", "data.train", &r, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    if (strncmp(err.msg, "train.jsonl:12: ", 16) != 0 || strstr(err.msg, needle) == NULL)
        fail_msg("message '%s' lacks the place or '%s'", err.msg, needle);
    assert_null(r.root);
}

static void test_bad_lines(void **state)
{
    refused(REC_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}", "not JSON");
    refused(REC_CHAT, "[1,2]", "a JSON object");
    refused(REC_CHAT, "{\"msgs\":[]}", "\"messages\" must be a list");
    refused(REC_CHAT, "{\"messages\":[]}", "empty conversation");
    refused(REC_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", "messages[0].role: missing");
    refused(REC_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"narrator\",\"content\":\"b\"}]}",
            "messages[1].role: \"narrator\" is not system, user or assistant");
    refused(REC_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}",
            "messages[1].role: a system message only comes first");
    refused(REC_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages[0].content: must be a string");
    refused(REC_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content: missing");
    refused(REC_PROMPT_COMPLETION, "{\"prompt\":\"a\"}", "\"completion\" must be a string");
    refused(REC_TEXT_JSONL, "{\"txt\":\"a\"}", "\"text\" must be a string");
    refused(REC_CHAT, "{\"messages\":[],\"messages\":[]}", "not JSON");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_bad_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
