/* ggml's own dequantization (llama.cpp's runtime: ggml_get_type_traits(type)->to_float) of every
   tensor of a GGUF file read by ggml's own gguf reader: the C oracle of the GGUF import's tests.
   `dequantize IN.gguf OUT.f32` writes each tensor's float32 values, in the file's tensor order, one
   after another, to OUT.f32 (raw, native order) and a line per tensor to stdout: name, ggml type
   name, number of values.  `dequantize --types` lists the types this ggml can dequantize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "gguf.h"

int main(int argc, char ** argv) {
    if (argc == 2 && strcmp(argv[1], "--types") == 0) {
        for (int t = 0; t < GGML_TYPE_COUNT; t++) {
            const struct ggml_type_traits * traits = ggml_get_type_traits((enum ggml_type) t);
            if (traits->blck_size > 0 && (t == GGML_TYPE_F32 || traits->to_float)) printf("%s\n", traits->type_name);
        }
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN.gguf OUT.f32 | %s --types\n", argv[0], argv[0]);
        return 2;
    }
    struct ggml_context * data = NULL;
    struct gguf_init_params params = { /*no_alloc*/ false, &data };
    struct gguf_context * file = gguf_init_from_file(argv[1], params);
    if (!file) {
        fprintf(stderr, "ggml's gguf_init_from_file could not read %s\n", argv[1]);
        return 1;
    }
    FILE * out = fopen(argv[2], "wb");
    if (!out) {
        perror(argv[2]);
        return 1;
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(file); i++) {
        const char * name = gguf_get_tensor_name(file, i);
        struct ggml_tensor * tensor = ggml_get_tensor(data, name);
        const struct ggml_type_traits * traits = ggml_get_type_traits(tensor->type);
        int64_t n = ggml_nelements(tensor);
        float * values = malloc((size_t) n * sizeof(float) + 1);
        if (tensor->type == GGML_TYPE_F32) {
            memcpy(values, tensor->data, (size_t) n * sizeof(float));
        } else if (traits->to_float) {
            traits->to_float(tensor->data, values, n);
        } else {
            fprintf(stderr, "%s: ggml has no to_float for type %s\n", name, traits->type_name);
            return 1;
        }
        if (fwrite(values, sizeof(float), (size_t) n, out) != (size_t) n) {
            perror(argv[2]);
            return 1;
        }
        free(values);
        printf("%s %s %lld\n", name, traits->type_name, (long long) n);
    }
    if (fclose(out)) {
        perror(argv[2]);
        return 1;
    }
    gguf_free(file);
    ggml_free(data);
    return 0;
}
