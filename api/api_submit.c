/* api_submit: POST /v1/jobs, validated off the loop thread.
 *
 * Validating a spec opens user files (data, init_from, the resume
 * checkpoint), expands globs and scans token shards: any of it can take
 * long or block. So the route only copies the body and defers (api_defer):
 * jobs_check_submission() runs on libuv's thread pool while the connection
 * is suspended and every other request is served; jobs_submit_checked()
 * then places, persists and queues the job on the loop thread, and only
 * then is the 201 (or the 400 naming the field) sent. A job is acknowledged
 * once validated and persisted, never before.
 *
 * Tests only: with ACCUMD_TEST_HOLD_SUBMIT naming a file, the check waits
 * (up to 60 s) while that file exists, so a test can hold a validation open
 * and see the API answer meanwhile. Unset in production.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_http.h"
#include "jobs.h"
#include "log.h"

typedef struct submit_ctx {
    jobs_mgr *m;
    api_server *srv;
    api_ident who;          /* who submits: the job's owner, the audit's actor */
    char *text;
    size_t len;
    bool dry_run;
    jobs_checked *checked;  /* the thread pool's result */
    const char *hold;       /* ACCUMD_TEST_HOLD_SUBMIT */
} submit_ctx;

static void hold_for_test(const char *path)
{
    struct stat st;
    if (path == NULL || path[0] == '\0' || stat(path, &st) != 0)
        return;
    acc_log(ACC_LOG_INFO, "http", "submission held while %s exists (ACCUMD_TEST_HOLD_SUBMIT)", path);
    for (int i = 0; i < 3000 && stat(path, &st) == 0; i++)
        usleep(20 * 1000);
}

/* Thread pool: everything that reads files. */
static void submit_work(void *arg)
{
    submit_ctx *c = arg;
    hold_for_test(c->hold);
    c->checked = jobs_check_submission(c->m, c->text, c->len, c->dry_run);
}

static void submit_free(submit_ctx *c)
{
    jobs_checked_free(c->checked);
    free(c->text);
    free(c);
}

static void resp_json(api_response *resp, int status, json_t *o)
{
    api_resp_json_obj(resp, status, o, JSON_COMPACT | JSON_REAL_PRECISION(10));
}

/* Loop thread: place, persist, queue; the answer. */
static void submit_done(void *arg, api_response *resp, bool orphaned)
{
    submit_ctx *c = arg;
    if (orphaned || resp == NULL) {
        submit_free(c);
        return;
    }
    acc_err err = {0};
    job *j = NULL;
    json_t *plan = NULL;
    if (c->checked != NULL)
        snprintf(c->checked->owner, sizeof c->checked->owner, "%s", c->who.name);
    if (c->checked == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
    } else if (jobs_submit_checked(c->m, c->checked, &j, &plan, &err) != 0) {
        api_resp_from_err(resp, &err);
    } else if (c->dry_run) {
        resp_json(resp, 200, plan);
    } else {
        api_audit_record(api_server_audit(c->srv), &c->who, "submit", j->id, "ok", j->spec.name);
        snprintf(resp->location, sizeof resp->location, "/v1/jobs/%s", j->id);
        resp_json(resp, 201, job_to_json(j, true, c->m->devs));
    }
    submit_free(c);
}

void api_submit(api_server *s, const api_request *req, api_response *resp, bool dry_run)
{
    submit_ctx *c = calloc(1, sizeof *c);
    char *text = malloc(req->body_len + 1);
    if (c == NULL || text == NULL) {
        free(c);
        free(text);
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    memcpy(text, req->body, req->body_len);
    text[req->body_len] = '\0';
    *c = (submit_ctx){.m = api_server_app(s), .srv = s, .who = *req->who, .text = text, .len = req->body_len, .dry_run = dry_run,
                      .hold = getenv("ACCUMD_TEST_HOLD_SUBMIT")};
    resp->deferred = api_defer(s, submit_work, submit_done, c);
    if (resp->deferred == NULL)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "too many submissions being validated (at most %d at a time); try again", API_MAX_DEFERRED);
}
