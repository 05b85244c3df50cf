/* jinja_dump: accumd's side of the chat template reference test.
 *   jinja_dump render CASES.jsonl   one {"id","out"} / {"id","error"} per case
 *   jinja_dump named NAME           the source of a shipped template
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat.h"
#include "jinja.h"

static int render_cases(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)n, 0, &je);
        if (!c) {
            fprintf(stderr, "%s: %s\n", path, je.text);
            return 1;
        }
        json_t *src = json_object_get(c, "template");
        json_t *out = json_pack("{sO}", "id", json_object_get(c, "id"));
        jinja_template *t;
        acc_err err = {0};
        jinja_output o;
        if (jinja_parse(json_string_value(src), json_string_length(src), "chat_template", &t, &err) == 0) {
            if (jinja_render(t, json_object_get(c, "vars"), NULL, &o, &err) == 0) {
                json_object_set_new(out, "out", json_stringn(o.text, o.len));
                jinja_output_free(&o);
            } else {
                json_object_set_new(out, "error", json_string(err.msg));
            }
            jinja_free(t);
        } else {
            json_object_set_new(out, "error", json_string(err.msg));
        }
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (!s)
            return 1;
        printf("%s\n", s);
        free(s);
        json_decref(out);
        json_decref(c);
    }
    free(line);
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "render"))
        return render_cases(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "named")) {
        const char *s = chat_named_template(argv[2]);
        if (!s)
            return 1;
        fputs(s, stdout);
        return 0;
    }
    fprintf(stderr, "usage: jinja_dump render CASES.jsonl | named NAME\n");
    return 2;
}
