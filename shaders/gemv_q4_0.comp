#version 450
// y[m][n] = sum_k x[m][k] * dequant(w)[n][k] with w in GGUF Q4_0, read natively:
// blocks of 32 elements, 18 bytes each: f16 d, then 16 bytes of nibbles; element i < 16 is the
// low nibble of byte i, element 16 + i the high nibble; value = (q - 8) * d.
// Blocks are 18 bytes, so a block starts on a 2-byte boundary; it is read as five 32-bit words
// and realigned in registers (no 8/16-bit storage needed). One lane handles one block per step.
// x: [M, K] f32 in io; y: [M, N] f32.
#extension GL_GOOGLE_include_directive : require
#include "common/gemv_head.glsl"

layout(set = 0, binding = 0) readonly buffer Wq { uint wq[]; };

void main() {
    const uint nb = pc.k / 32; // blocks per row
    for (uint row = first_row() + gl_SubgroupID; row < end_row(); row += gl_NumSubgroups) {
        float acc[MAX_M];
        for (uint m = 0; m < MAX_M; m++) {
            acc[m] = 0.0;
        }
        for (uint j = gl_SubgroupInvocationID; j < nb; j += gl_SubgroupSize) {
            const uint byte0 = (row * nb + j) * 18;
            const uint w0 = byte0 >> 2;
            const uint a0 = wq[w0], a1 = wq[w0 + 1], a2 = wq[w0 + 2], a3 = wq[w0 + 3], a4 = wq[w0 + 4];
            float d;
            uint q[4];
            if ((byte0 & 2) == 0) {
                d = unpackHalf2x16(a0).x;
                q[0] = (a0 >> 16) | (a1 << 16);
                q[1] = (a1 >> 16) | (a2 << 16);
                q[2] = (a2 >> 16) | (a3 << 16);
                q[3] = (a3 >> 16) | (a4 << 16);
            } else {
                d = unpackHalf2x16(a0 >> 16).x;
                q[0] = a1;
                q[1] = a2;
                q[2] = a3;
                q[3] = a4;
            }
            for (uint m = 0; m < MAX_M; m++) {
                if (m < pc.m) {
                    const uint xb = pc.x_off + m * pc.x_stride + j * 32;
                    float s = 0.0;
                    for (uint i = 0; i < 4; i++) {
                        for (uint b = 0; b < 4; b++) {
                            const uint byte = (q[i] >> (8 * b)) & 0xFFu;
                            s += float(int(byte & 0xFu) - 8) * io_f32(xb + 4 * i + b);
                            s += float(int(byte >> 4) - 8) * io_f32(xb + 16 + 4 * i + b);
                        }
                    }
                    acc[m] += d * s;
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
