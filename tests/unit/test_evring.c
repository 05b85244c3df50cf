/* evring: numbering, overwrite of the oldest, watchers notified, restart
 * numbering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "evring.h"

static void push(evring *r, int i)
{
    char json[32];
    int n = snprintf(json, sizeof json, "{\"i\":%d}", i);
    assert_int_equal(evring_push(r, "step", json, (size_t)n, NULL, NULL), 0);
}

static void test_wraps_and_skips(void **state)
{
    evring r;
    assert_int_equal(evring_init(&r, 4, NULL), 0);
    assert_true(evring_first(&r) == 1);
    assert_null(evring_get(&r, 1));
    for (int i = 1; i <= 10; i++)
        push(&r, i);
    assert_true(r.next_seq == 11);
    assert_true(evring_first(&r) == 7);
    assert_null(evring_get(&r, 6));
    const evring_entry *e = evring_get(&r, 7);
    assert_non_null(e);
    assert_string_equal(e->json, "{\"i\":7}");
    assert_string_equal(evring_get(&r, 10)->type, "step");
    assert_null(evring_get(&r, 11));
    evring_free(&r);
}

static int notified;
static void on_notify(evring_watcher *w) { notified++; }
static void on_notify_unwatch(evring_watcher *w)
{
    notified++;
    evring_unwatch(w->data, w);
}

static void test_watchers(void **state)
{
    evring r;
    evring_watcher a = {.notify = on_notify}, b = {.notify = on_notify_unwatch, .data = &r};
    assert_int_equal(evring_init(&r, 8, NULL), 0);
    evring_watch(&r, &a);
    evring_watch(&r, &b);
    notified = 0;
    push(&r, 1);
    assert_int_equal(notified, 2); /* b removed itself during the call */
    push(&r, 2);
    assert_int_equal(notified, 3);
    evring_close(&r);
    assert_true(r.closed);
    assert_int_equal(notified, 4);
    evring_unwatch(&r, &a);
    assert_null(r.watchers);
    evring_free(&r);
}

static void test_start_at(void **state)
{
    evring r;
    assert_int_equal(evring_init(&r, 4, NULL), 0);
    evring_start_at(&r, 100);
    assert_true(evring_first(&r) == 100);
    push(&r, 1);
    assert_true(evring_first(&r) == 100);
    assert_non_null(evring_get(&r, 100));
    assert_null(evring_get(&r, 99));
    evring_free(&r);
}

/* Issue 25: the slots start few and double as events come, up to
 * the capacity; every event held survives each growth, in order, and past
 * the capacity the oldest go as before. A ring started at a later number
 * grows the same way. */
static void test_grows_to_cap(void **state)
{
    for (uint64_t start = 1; start <= 1000; start += 999) {
        evring r;
        assert_int_equal(evring_init(&r, 100, NULL), 0);
        evring_start_at(&r, start);
        assert_true(r.nslots == EVRING_FIRST_SLOTS);
        push(&r, 0);
        assert_true(r.nslots == EVRING_FIRST_SLOTS); /* a queued job's one event: a few slots */
        for (int i = 1; i < 250; i++) {
            push(&r, i);
            uint64_t held = (uint64_t)(i + 1) < 100 ? (uint64_t)(i + 1) : 100;
            assert_true(r.nslots <= 100);
            assert_true((uint64_t)r.nslots >= held);
            assert_true(evring_first(&r) == r.next_seq - held);
            for (uint64_t q = evring_first(&r); q < r.next_seq; q++) { /* every held event, right text */
                char want[32];
                snprintf(want, sizeof want, "{\"i\":%d}", (int)(q - start));
                const evring_entry *e = evring_get(&r, q);
                assert_non_null(e);
                assert_string_equal(e->json, want);
            }
        }
        assert_true(r.nslots == 100);
        evring_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wraps_and_skips),
        cmocka_unit_test(test_watchers),
        cmocka_unit_test(test_start_at),
        cmocka_unit_test(test_grows_to_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
