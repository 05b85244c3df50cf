/* api_ui: serve the dashboard's compiled-in files (contract in api_ui.h). */
#include "api_ui.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#define UI_INDEX "/ui/index.html"
/* the page loads and talks only to this daemon, and is never framed (its
 * cancel button cannot be clickjacked) */
#define UI_CSP                                                                                     \
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

bool ui_path(const char *path)
{
    return !strcmp(path, "/") || !strncmp(path, "/ui/", 4);
}

static const ui_asset *ui_find(const char *path)
{
    if (!strcmp(path, "/"))
        path = UI_INDEX;
    for (size_t i = 0; i < ui_nassets; i++)
        if (!strcmp(ui_assets[i].path, path))
            return &ui_assets[i];
    return NULL;
}

/* If-None-Match: "*" or a comma-separated list holding our tag (a weak
 * W/ form of it matches too, as RFC 9110 asks for GET). */
static bool ui_not_modified(struct MHD_Connection *conn, const char *etag)
{
    const char *inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (inm == NULL)
        return false;
    if (!strcmp(inm, "*"))
        return true;
    size_t n = strlen(etag);
    for (const char *p = strstr(inm, etag); p != NULL; p = strstr(p + 1, etag)) {
        char after = p[n];
        if (after == '\0' || after == ',' || after == ' ')
            return true;
    }
    return false;
}

static void ui_body(api_response *resp, int status, const ui_asset *a, size_t len)
{
    char *b = malloc(len + 1); /* MHD frees what it sends; the asset is const */
    if (b == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    memcpy(b, a->data, len);
    b[len] = '\0';
    free(resp->body);
    resp->status = status;
    resp->content_type = a->content_type;
    resp->body = b;
    resp->body_len = len;
    resp->etag = a->etag;
    resp->cache_control = "no-cache";
    resp->csp = UI_CSP;
}

void ui_route(const api_request *req, api_response *resp)
{
    if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
        api_resp_error(resp, 405, "method_not_allowed", NULL, "%s %s: allowed: GET, HEAD", req->method, req->path);
        resp->allow = "GET, HEAD";
        return;
    }
    const ui_asset *a = ui_find(req->path);
    if (a == NULL) {
        api_resp_error(resp, 404, "not_found", NULL, "no dashboard file %s", req->path);
        return;
    }
    if (ui_not_modified(req->conn, a->etag))
        ui_body(resp, 304, a, 0);
    else
        ui_body(resp, 200, a, a->len);
}
