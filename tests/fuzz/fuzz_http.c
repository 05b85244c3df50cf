/* fuzz_http: routing and the strict parsing of the path, query and headers
 * (api_parse.c), as the server feeds them after MHD has split the request.
 *
 * Input: "METHOD\nPATH\nkey=value\n...\n\nHeader: value\n..." (any bytes,
 * NULs included). The path and the query pairs go through api_unescape()
 * as MHD's unescape callback would. Oracle, beyond the sanitizers: every
 * refusal is a 4xx whose body is valid JSON (so valid UTF-8), and a routed
 * job id obeys the id grammar. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api_parse.h"
#include "job.h"

#define MAX_KV 32

/* The next '\n'-terminated line of [*p, end) as a fresh NUL-terminated copy. */
static char *next_line(const uint8_t **p, const uint8_t *end, size_t *len)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t n = nl ? (size_t)(nl - *p) : (size_t)(end - *p);
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    memcpy(s, *p, n);
    s[n] = '\0';
    *len = n;
    *p = nl ? nl + 1 : end;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    char *lines[2 + 2 * MAX_KV];
    int nl = 0;
    size_t mlen, plen;
    char *method = lines[nl++] = next_line(&p, end, &mlen);
    char *path = lines[nl++] = next_line(&p, end, &plen);
    if (memchr(path, '\0', plen) == NULL) /* MHD unescapes a C string */
        plen = api_unescape(path);
    api_kv q[MAX_KV], h[MAX_KV];
    size_t nq = 0, nh = 0;
    bool headers = false;
    while (p < end && nq + nh < MAX_KV) {
        size_t len;
        char *l = lines[nl++] = next_line(&p, end, &len);
        if (len == 0 && !headers) {
            headers = true;
            continue;
        }
        char *sep = memchr(l, headers ? ':' : '=', len);
        api_kv *kv = headers ? &h[nh++] : &q[nq++];
        if (sep != NULL) {
            *sep = '\0';
            char *v = sep + 1;
            while (headers && *v == ' ')
                v++;
            kv->value = v;
            kv->value_len = len - (size_t)(v - l);
            if (!headers && memchr(v, '\0', kv->value_len) == NULL)
                kv->value_len = api_unescape(v);
        } else {
            kv->value = NULL;
            kv->value_len = 0;
        }
        kv->key = l;
        kv->key_len = sep ? (size_t)(sep - l) : len;
        if (!headers && memchr(l, '\0', kv->key_len) == NULL)
            kv->key_len = api_unescape(l);
    }
    api_request in = {.method = method, .path = path, .path_len = plen, .query = q, .nquery = nq,
                      .headers = h, .nheaders = nh, .body = ""};
    api_response resp = {0};
    api_call c;
    if (api_parse_request(&in, &c, &resp) != 0) {
        json_error_t je;
        json_t *j = resp.body ? json_loads(resp.body, 0, &je) : NULL;
        if (j == NULL || resp.status < 400 || resp.status > 499)
            abort(); /* a refusal must be a 4xx with a JSON body */
        json_decref(j);
    } else if (c.route >= API_R_JOB_GET && !job_id_valid(c.id, strlen(c.id))) {
        abort();
    }
    free(resp.body);
    for (int i = 0; i < nl; i++)
        free(lines[i]);
    return 0;
}
