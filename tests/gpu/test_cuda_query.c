/* GPU: the CUDA device query lists at least one GPU with sane properties.
 * Exits 77 (skipped) with a message where no GPU is present. */
#include <stdio.h>

#include "kern_discover.h"
#include "gpu_fixture.h"

int main(void)
{
    kern_device_info d[KERN_MAX_DEVICES];
    int n = 0;
    int skip = gpu_list_or_skip(d, &n);
    if (skip != 0)
        return skip;
    for (int i = 0; i < n; i++) {
        printf("cuda:%d %s sm_%d%d %llu bytes\n", d[i].index, d[i].name, d[i].cc_major,
               d[i].cc_minor, (unsigned long long)d[i].mem_total);
        if (d[i].kind != KERN_DEV_CUDA || d[i].mem_total < (1ULL << 30) || d[i].cc_major < 3 ||
            d[i].name[0] == '\0') {
            fprintf(stderr, "implausible properties for GPU %d\n", i);
            return 1;
        }
    }
    return 0;
}
