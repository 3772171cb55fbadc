// Shared declarations of the decode GEMV family (gemv_*.comp). Mirrored on the Rust side by
// `src/vk/shaders.rs` (`GemvPush`, `WG_SIZE`, `ROWS_PER_WG`, `MAX_M`): change both together.
//
// Before including, an entry file defines ACC_T (the accumulator type: int or float).
//
// Set 1 is the engine's I/O arena, one storage buffer seen as 32-bit words: activations,
// activation scales and outputs of every job of a submit live there at word offsets passed in
// the push constants (f32 values travel as their bit patterns).

#define WG 64       // invocations per workgroup (one-dimensional)
#define ROWS 2      // weight rows (output channels) per workgroup
#define MAX_M 4     // activation rows handled by one dispatch

layout(local_size_x = WG) in;

layout(push_constant) uniform Push {
    uint n;         // weight rows = output channels
    uint k;         // reduction length (elements)
    uint row_words; // weight row stride in 32-bit words (int8: padded K / 4)
    uint m;         // activation rows, 1..MAX_M
    uint x_off;     // word offset of x[0][0] in io
    uint x_stride;  // words between consecutive activation rows
    uint xs_off;    // word offset of the per-row activation scales (int8 kernel only)
    uint y_off;     // word offset of y[0][0] in io; y is [m, n] row-major f32
} pc;

layout(set = 1, binding = 0) buffer Io { uint io[]; };

shared ACC_T red[MAX_M * ROWS][WG];

// Flattened workgroup index: dispatches wider than maxComputeWorkGroupCount[0] spill into y.
uint wg_index() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

// Sums red[j][0..WG) into red[j][0] for every j. Every invocation of the workgroup must call it.
void tree_reduce() {
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (gl_LocalInvocationID.x < s) {
            for (uint j = 0; j < MAX_M * ROWS; j++) {
                red[j][gl_LocalInvocationID.x] += red[j][gl_LocalInvocationID.x + s];
            }
        }
        barrier();
    }
}

float io_f32(uint word) {
    return uintBitsToFloat(io[word]);
}
