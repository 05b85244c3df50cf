/* api_ui: the dashboard, static files compiled into the binary.
 *
 * GET / is api/ui/index.html; GET /ui/<path> the file api/ui/<path> (the
 * page's script, style sheet and the vendored uPlot). The table is generated
 * at build time by api/ui_embed.py; nothing is read from disk at run time.
 * Answers carry the file's Content-Type, a strong ETag and
 * "Cache-Control: no-cache" (a browser revalidates and gets 304 while the
 * daemon's build is the same), a Content-Security-Policy that lets the page
 * load and fetch from this daemon only and never be framed, and nosniff.
 * These paths need no bearer token: they are
 * the same files for everyone and hold no job data; the page asks for the
 * token when the API answers 401.
 */
#ifndef ACC_API_UI_H
#define ACC_API_UI_H

#include <stdbool.h>
#include <stddef.h>

#include "api_http.h"

typedef struct ui_asset {
    const char *path;          /* "/ui/app.js" */
    const char *content_type;
    const unsigned char *data;
    size_t len;
    const char *etag;          /* quoted, as sent */
} ui_asset;

extern const ui_asset ui_assets[];
extern const size_t ui_nassets;

/* True for the dashboard's paths: "/" and everything under "/ui/". */
bool ui_path(const char *path);

/* Answer GET or HEAD of a dashboard path (404 for an unknown asset, 405
 * for another method, 304 when If-None-Match names the current ETag). */
void ui_route(const api_request *req, api_response *resp);

#endif
