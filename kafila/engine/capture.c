/* The body stage's eval callback, in C.
 *
 * llama.cpp's scheduler asks the eval callback about every node of the graph (about 550 for
 * 15 SmolLM2 blocks) before it computes. As a Python ctypes callback each ask takes the GIL:
 * about 1 ms per call in all, and far more when the event loop holds the GIL at that moment.
 * Here the asks cost nothing and never touch Python; only the target tensor is copied out.
 *
 * ggml functions come in as pointers (no headers, no link-time dependency on ggml); the
 * struct ggml_tensor prefix read here (type, then ne[4] at offset 16) is the one
 * kafila/engine/llama_lib.py documents.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef const char *(*get_name_fn)(const void *tensor);
typedef void (*tensor_get_fn)(const void *tensor, void *data, size_t offset, size_t size);

struct kafila_capture {
    get_name_fn get_name;
    tensor_get_fn tensor_get;
    char target[64];  /* tensor name to copy out, e.g. "l_out-14" */
    float *dest;      /* room for `capacity` floats */
    int64_t capacity;
    int32_t hits;     /* how many times the target was computed in this call */
    int32_t type;     /* ggml type id of the last target seen */
    int64_t ne[4];    /* its shape */
};

#define GGML_TYPE_F32 0
#define NE_OFFSET 16

bool kafila_capture_eval(void *tensor, bool ask, void *user) {
    struct kafila_capture *c = user;
    if (strcmp(c->get_name(tensor), c->target) != 0) {
        return !ask; /* not ours: do not observe it, keep computing */
    }
    if (ask) {
        return true;
    }
    c->hits += 1;
    c->type = *(const int32_t *)tensor;
    memcpy(c->ne, (const char *)tensor + NE_OFFSET, sizeof c->ne);
    int64_t n = c->ne[0] * c->ne[1] * c->ne[2] * c->ne[3];
    if (c->type != GGML_TYPE_F32 || c->hits > 1 || n > c->capacity) {
        return false; /* aborts the graph; Python reports what was seen */
    }
    c->tensor_get(tensor, c->dest, 0, (size_t)n * sizeof(float));
    return true;
}
