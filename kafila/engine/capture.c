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
 *
 * It can also *restore* a node: Gemma 1/2 scale their input by sqrt(n_embd) unconditionally, so
 * a stage fed hidden states would scale them a second time. Once the named node (`inp_scaled`)
 * is computed, the stage's own input rows are written back over it; the CPU scheduler calls the
 * callback between nodes, so every later node reads the restored rows (DESIGN §2b).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef const char *(*get_name_fn)(const void *tensor);
typedef void (*tensor_get_fn)(const void *tensor, void *data, size_t offset, size_t size);
typedef void (*tensor_set_fn)(void *tensor, const void *data, size_t offset, size_t size);

struct kafila_capture {
    get_name_fn get_name;
    tensor_get_fn tensor_get;
    char target[64];  /* tensor name to copy out, e.g. "l_out-14" */
    float *dest;      /* room for `capacity` floats */
    int64_t capacity;
    int32_t hits;     /* how many times the target was computed in this call */
    int32_t type;     /* ggml type id of the last target seen */
    int64_t ne[4];    /* its shape */
    /* Restoring (all zero when unused): written after the fields above, which Python reads too. */
    tensor_set_fn tensor_set;
    char restore[64];   /* tensor name to overwrite with `src`, e.g. "inp_scaled"; "" for none */
    const float *src;   /* this call's input rows */
    int64_t src_n;      /* how many floats `src` holds */
    int32_t restored;   /* how many times the restore target was overwritten in this call */
};

#define GGML_TYPE_F32 0
#define NE_OFFSET 16

static bool restore(struct kafila_capture *c, void *tensor, bool ask) {
    if (ask) {
        return true;
    }
    int64_t ne[4];
    memcpy(ne, (const char *)tensor + NE_OFFSET, sizeof ne);
    c->restored += 1;
    if (*(const int32_t *)tensor != GGML_TYPE_F32 || ne[0] * ne[1] * ne[2] * ne[3] != c->src_n) {
        return false; /* not the shape of our input: abort rather than compute something else */
    }
    c->tensor_set(tensor, c->src, 0, (size_t)c->src_n * sizeof(float));
    return true;
}

bool kafila_capture_eval(void *tensor, bool ask, void *user) {
    struct kafila_capture *c = user;
    const char *name = c->get_name(tensor);
    if (c->restore[0] != '\0' && strcmp(name, c->restore) == 0) {
        return restore(c, tensor, ask);
    }
    if (c->target[0] == '\0' || strcmp(name, c->target) != 0) {
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
