#version 450
// y[m][n] = sum_k x[m][k] * dequant(w)[n][k] with w in GGUF Q4_K, read natively:
// super-blocks of 256 elements, 144 bytes each (ggml-common.h block_q4_K):
//   bytes 0..1 f16 d, 2..3 f16 dmin, 4..15 scales[12] (eight 6-bit scales and eight 6-bit
//   mins, packed as in ggml-quants.c get_scale_min_k4), 16..143 qs[128] nibbles.
// Sub-block s (0..7, 32 elements) uses scale/min index s and qs bytes 32*(s/2) .. +32, low
// nibbles for even s, high nibbles for odd s; value = d*sc*q - dmin*mn (dequantize_row_q4_K).
// One lane handles one 32-element sub-block per step:
//   contribution = (d*sc) * sum(q*x) - (dmin*mn) * sum(x).
// Super-blocks are 144 = 36*4 bytes, so everything is read as aligned 32-bit words.
// x: [M, K] f32 in io; y: [M, N] f32.
#extension GL_GOOGLE_include_directive : require
#include "common/gemv_head.glsl"

layout(set = 0, binding = 0) readonly buffer Wq { uint wq[]; };
// The I/O arena again, as vec4: activation rows start on 4-word boundaries (the host aligns
// every arena slot to 4 words and K is a multiple of 256), so x is fetched 16 bytes at a time.
layout(set = 1, binding = 0) readonly buffer Io4 { vec4 io4[]; };

uint byte_of(uvec3 s, uint i) {
    return (s[i >> 2] >> (8 * (i & 3))) & 0xFFu;
}

void main() {
    const uint nsb = pc.k / 256; // super-blocks per row
    const uint nsub = nsb * 8;   // 32-element sub-blocks per row
    for (uint row = first_row() + gl_SubgroupID; row < end_row(); row += gl_NumSubgroups) {
        float acc[MAX_M];
        for (uint m = 0; m < MAX_M; m++) {
            acc[m] = 0.0;
        }
        for (uint j = gl_SubgroupInvocationID; j < nsub; j += gl_SubgroupSize) {
            const uint sb = j / 8;
            const uint sub = j % 8;
            const uint base = (row * nsb + sb) * 36;
            const vec2 dm = unpackHalf2x16(wq[base]);
            const uvec3 sc = uvec3(wq[base + 1], wq[base + 2], wq[base + 3]);
            uint scale, mn;
            if (sub < 4) {
                scale = byte_of(sc, sub) & 63u;
                mn = byte_of(sc, sub + 4) & 63u;
            } else {
                scale = (byte_of(sc, sub + 4) & 0xFu) | ((byte_of(sc, sub - 4) >> 6) << 4);
                mn = (byte_of(sc, sub + 4) >> 4) | ((byte_of(sc, sub) >> 6) << 4);
            }
            const float d1 = dm.x * float(scale);
            const float m1 = dm.y * float(mn);
            const uint qw = base + 4 + 8 * (sub / 2);
            const uint shift = 4 * (sub & 1);
            uint words[8];
            for (uint i = 0; i < 8; i++) {
                words[i] = wq[qw + i];
            }
            for (uint m = 0; m < MAX_M; m++) {
                if (m < pc.m) {
                    const uint xb = pc.x_off + m * pc.x_stride + sb * 256 + sub * 32;
                    float sq = 0.0;
                    float sx = 0.0;
                    for (uint i = 0; i < 8; i++) {
                        const vec4 x4 = io4[(xb >> 2) + i];
                        for (uint b = 0; b < 4; b++) {
                            const float xv = x4[b];
                            sq += float((words[i] >> (8 * b + shift)) & 0xFu) * xv;
                            sx += xv;
                        }
                    }
                    acc[m] += d1 * sq - m1 * sx;
                }
            }
        }
        for (uint m = 0; m < MAX_M; m++) {
            if (m < pc.m) {
                const float sum = subgroupAdd(acc[m]);
                if (subgroupElect()) {
                    io[pc.y_off + m * pc.n + row] = floatBitsToUint(sum);
                }
            }
        }
    }
}
