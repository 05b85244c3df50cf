/* train_cfg: the data layer's view of the engine's configuration. */
#include "train_cfg.h"

#include <string.h>

void train_cfg_data(const train_cfg *c, data_cfg *out)
{
    memset(out, 0, sizeof *out);
    out->data = c->data;
    out->model = c->model;
    memcpy(out->data_roots, c->data_roots, sizeof out->data_roots);
}
