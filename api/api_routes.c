/* api_routes: the v1 routing table. */
#include <string.h>

#include "api_http.h"

static void route_healthz(api_server *s, const api_request *req, api_response *resp)
{
    api_resp_json(resp, 200, "{\"status\":\"ok\"}\n");
}

void api_route(api_server *s, const api_request *req, api_response *resp)
{
    if (!strcmp(req->path, "/healthz")) {
        if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
            api_resp_error(resp, 405, "method_not_allowed", NULL, "%s %s: use GET", req->method, req->path);
            return;
        }
        route_healthz(s, req, resp);
        return;
    }
    api_resp_error(resp, 404, "not_found", NULL, "no route for %s %s", req->method, req->path);
}
