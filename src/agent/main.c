/* main.c: gpurent-agent's entry point (the node agent; see issue 3). */
#include <stdio.h>

int main(void)
{
    fprintf(stderr, "gpurent-agent: not built yet\n");
    return 1;
}
