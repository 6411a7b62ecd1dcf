/* The DP-PASGD node step on logistic regression, float32 (testbed/algorithms/mcu_logistic.py is
 * the same in numpy; docs/serial-protocol.md, "The node step"). */
#include <math.h>

#include "bsp.h"
#include "fw.h"

static float grad[TB_MAX_PARAMS];
static float noise[TB_MAX_PARAMS];
static uint16_t picked[TB_MAX_BATCH];

/* Floyd's algorithm: batch distinct rows of [0, n), in insertion order. */
static void floyd(tb_stream *s, uint16_t n, uint16_t batch) {
    uint16_t count = 0;
    for (uint32_t j = (uint32_t)n - batch; j < n; j++) {
        uint16_t t = (uint16_t)tb_uniform_below(s, j + 1u), pick = t;
        for (uint16_t k = 0; k < count; k++)
            if (picked[k] == t) {
                pick = (uint16_t)j;
                break;
            }
        picked[count++] = pick;
    }
}

int tb_node_step(const tb_task *task, float *theta, const float *x, const uint8_t *y, uint16_t rows,
                 uint8_t features, uint8_t classes, uint64_t *cycles) {
    const uint32_t d = features, c = classes, p = d * c + c;
    if (task->batch == 0 || task->batch > rows || task->batch > TB_MAX_BATCH || p > TB_MAX_PARAMS)
        return E_TOO_LARGE;
    tb_stream batches, normals;
    tb_stream_init(&batches, task->seed, task->node, task->round, PURPOSE_BATCH);
    tb_stream_init(&normals, task->seed, task->node, task->round, PURPOSE_NOISE);
    const float inv_b = 1.0f / (float)task->batch;
    float z[TB_MAX_CLASSES], spare = 0.0f;
    int have_spare = 0;
    for (uint16_t t = 0; t < task->tau; t++) {
        uint32_t start = bsp_cycles();
        floyd(&batches, rows, task->batch);
        for (uint32_t i = 0; i < p; i++) grad[i] = 0.0f;
        for (uint16_t k = 0; k < task->batch; k++) {
            const float *xs = x + (uint32_t)picked[k] * d;
            float top = -INFINITY, total = 0.0f;
            for (uint32_t j = 0; j < c; j++) z[j] = theta[d * c + j];
            for (uint32_t i = 0; i < d; i++)
                for (uint32_t j = 0; j < c; j++) z[j] += xs[i] * theta[i * c + j];
            for (uint32_t j = 0; j < c; j++) top = z[j] > top ? z[j] : top;
            for (uint32_t j = 0; j < c; j++) total += (z[j] = expf(z[j] - top));
            for (uint32_t j = 0; j < c; j++) z[j] = z[j] / total - (j == y[picked[k]] ? 1.0f : 0.0f);
            for (uint32_t i = 0; i < d; i++)
                for (uint32_t j = 0; j < c; j++) grad[i * c + j] += xs[i] * z[j];
            for (uint32_t j = 0; j < c; j++) grad[d * c + j] += z[j];
        }
        /* normals t*P .. t*P+P-1 of the NOISE stream, drawn in (cos, sin) pairs: with P odd the
         * last pair's second half opens the next step */
        uint32_t i = 0;
        if (have_spare) noise[i++] = spare, have_spare = 0;
        for (; i + 1 < p; i += 2) tb_gaussians(&normals, noise + i, 2);
        if (i < p) {
            float pair[2];
            tb_gaussians(&normals, pair, 2);
            noise[i] = pair[0];
            spare = pair[1];
            have_spare = 1;
        }
        for (uint32_t i = 0; i < p; i++) theta[i] = theta[i] - task->lr * (grad[i] * inv_b + task->sigma * noise[i]);
        *cycles += (uint32_t)(bsp_cycles() - start);
    }
    return E_OK;
}
