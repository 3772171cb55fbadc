#version 450
// y[m][n] = (a_scale[m] * w_scale[n]) * float(sum_k xq[m][k] * w[n][k])
// w: [N, row_words*4] row-major i8, rows zero-padded to a multiple of 16 bytes, read as uvec4.
// xq: [M, row_words*4] i8 (quantized on the host, same padding) packed four per io word.
// Integer accumulation, so the result is bit-exact against the scalar reference.
#extension GL_GOOGLE_include_directive : require
#include "common/gemv_head.glsl"

layout(set = 0, binding = 0) readonly buffer Wq { uvec4 w[]; };
layout(set = 0, binding = 1) readonly buffer Ws { float w_scale[]; };

// Dot product of two words holding four signed bytes each (plain int arithmetic: this glslc
// has no GL_EXT_integer_dot_product).
int dot4(uint a, uint b) {
    const int ia = int(a);
    const int ib = int(b);
    return bitfieldExtract(ia, 0, 8) * bitfieldExtract(ib, 0, 8)
         + bitfieldExtract(ia, 8, 8) * bitfieldExtract(ib, 8, 8)
         + bitfieldExtract(ia, 16, 8) * bitfieldExtract(ib, 16, 8)
         + bitfieldExtract(ia, 24, 8) * bitfieldExtract(ib, 24, 8);
}

int dot16(uvec4 a, uvec4 b) {
    return dot4(a.x, b.x) + dot4(a.y, b.y) + dot4(a.z, b.z) + dot4(a.w, b.w);
}

void main() {
    const uint kv = pc.row_words / 4; // uvec4 per row
    for (uint row = first_row() + gl_SubgroupID; row < end_row(); row += gl_NumSubgroups) {
        int acc[MAX_M];
        for (uint m = 0; m < MAX_M; m++) {
            acc[m] = 0;
        }
        for (uint i = gl_SubgroupInvocationID; i < kv; i += gl_SubgroupSize) {
            const uvec4 wv = w[row * kv + i];
            for (uint m = 0; m < MAX_M; m++) {
                if (m < pc.m) {
                    const uint b = pc.x_off + m * pc.x_stride + 4 * i;
                    acc[m] += dot16(wv, uvec4(io[b], io[b + 1], io[b + 2], io[b + 3]));
                }
            }
        }
        for (uint m = 0; m < MAX_M; m++) {
            if (m < pc.m) {
                const int sum = subgroupAdd(acc[m]);
                if (subgroupElect()) {
                    precise float s = io_f32(pc.xs_off + m) * w_scale[row];
                    precise float y = s * float(sum);
                    io[pc.y_off + m * pc.n + row] = floatBitsToUint(y);
                }
            }
        }
    }
}
