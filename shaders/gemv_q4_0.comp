#version 450
// y[m][n] = sum_k x[m][k] * dequant(w)[n][k] with w in GGUF Q4_0, read natively:
// blocks of 32 elements, 18 bytes each: f16 d, then 16 bytes of nibbles; element i < 16 is the
// low nibble of byte i, element 16 + i the high nibble; value = (q - 8) * d.
// Blocks are 18 bytes, so a block starts on a 2-byte boundary; it is read as five 32-bit words
// and realigned in registers (no 8/16-bit storage needed).
// x: [M, K] f32 in io; y: [M, N] f32.
#extension GL_GOOGLE_include_directive : require
#include "common/gemv_head.glsl"

layout(set = 0, binding = 0) readonly buffer Wq { uint wq[]; };
// The I/O arena again, as vec4: activation rows start on 4-word boundaries (the host aligns
// every arena slot to 4 words and K is a multiple of 32), so x is fetched 16 bytes at a time.
layout(set = 1, binding = 0) readonly buffer Io4 { vec4 io4[]; };

void main() {
    const uint nb = pc.k / 32; // blocks per row
    for (uint row = first_row() + gl_SubgroupID; row < end_row(); row += gl_NumSubgroups) {
        float acc[MAX_M];
        for (uint m = 0; m < MAX_M; m++) {
            acc[m] = 0.0;
        }
        // Four lanes per block: lane part p takes qs word p (bytes 4p..4p+3), i.e. elements
        // 4p..4p+3 (low nibbles) and 16+4p..16+4p+3 (high nibbles); neighbouring lanes read
        // neighbouring activations.
        for (uint it = gl_SubgroupInvocationID; it < nb * 4; it += gl_SubgroupSize) {
            const uint j = it >> 2;
            const uint p = it & 3;
            const uint byte0 = (row * nb + j) * 18;
            const uint w0 = byte0 >> 2;
            float d;
            uint q;
            if ((byte0 & 2) == 0) {
                d = unpackHalf2x16(wq[w0]).x;
                q = (wq[w0 + p] >> 16) | (wq[w0 + p + 1] << 16);
            } else {
                d = unpackHalf2x16(wq[w0] >> 16).x;
                q = wq[w0 + p + 1];
            }
            const vec4 lo = vec4(ivec4(q & 0xFu, (q >> 8) & 0xFu, (q >> 16) & 0xFu, (q >> 24) & 0xFu) - 8);
            const vec4 hi = vec4(ivec4((q >> 4) & 0xFu, (q >> 12) & 0xFu, (q >> 20) & 0xFu, q >> 28) - 8);
            for (uint m = 0; m < MAX_M; m++) {
                if (m < pc.m) {
                    const uint xb = pc.x_off + m * pc.x_stride + j * 32 + 4 * p;
                    const vec4 xl = io4[xb >> 2];
                    const vec4 xh = io4[(xb >> 2) + 4];
                    acc[m] += d * (dot(lo, xl) + dot(hi, xh));
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
