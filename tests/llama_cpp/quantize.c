/* llama.cpp's own quantizer, llama_model_quantize, called on one GGUF file: what llama-quantize
   does without its options parser (whose `common` library is most of its build time). */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN.gguf OUT.gguf FTYPE (llama_ftype's number, e.g. 15 = Q4_K_M)\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = (enum llama_ftype) atoi(argv[3]);
    params.nthread = 2;
    uint32_t failed = llama_model_quantize(argv[1], argv[2], &params);
    llama_backend_free();
    if (failed) {
        fprintf(stderr, "llama_model_quantize failed on %s\n", argv[1]);
        return 1;
    }
    return 0;
}
